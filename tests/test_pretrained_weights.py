"""`weights="imagenet"`: torchvision's checkpoints downloaded for real from a local HTTP
server (127.0.0.1), hash-checked, read without torch, converted and cached once.

The real checkpoints (5-28 MB) are not here, so the tests register a registry entry of
their own (`registry.CHECKPOINTS` is a plain dict, the documented test seam):
`fixtures/torch_checkpoints/torchvision_shufflenet_v2_x0_5_legacy.pth`, written by torch
in the legacy format of torchvision's x0.5 / x1.0 files (scripts/make_torch_checkpoints.py),
with the weights of the parity fixture `fixtures/torchvision_shufflenet_v2_x0_5.npz`
(torchvision's x0.5, 10 classes), so the converted net must give torchvision's logits.
Every test has its own Keras cache (KERAS_HOME in a temporary folder): none writes to
~/.keras.
"""

import contextlib
import dataclasses
import functools
import http.server
import importlib.util
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile

import keras
import numpy as np
import pytest

from keras_autoshuffle._files import sha256_of
from keras_autoshuffle.applications import (
    AutoShuffleNetV2,
    CheckpointError,
    ShuffleNetV1,
    ShuffleNetV2,
    decode_predictions,
)
from keras_autoshuffle.applications.weights import download, pretrained, registry
from keras_autoshuffle.layers import RelaxedShuffle

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
CHECKPOINT = os.path.join(
    FIXTURES, "torch_checkpoints", "torchvision_shufflenet_v2_x0_5_legacy.pth"
)
NAME = os.path.basename(CHECKPOINT)
PARITY = os.path.join(FIXTURES, "torchvision_shufflenet_v2_x0_5.npz")
# Trainable parameters of torchvision's shufflenet_v2_x0_5(num_classes=10).
PARAMS_10_CLASSES = 352_042


class LocalServer:
    """Serves `folder` over HTTP on 127.0.0.1 (a free port) in a thread; records requests."""

    def __init__(self, folder):
        self.requests = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(folder), **kwargs)

            def do_GET(self):
                requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/models/"
        self.folder = folder
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, source, name=None):
        """Puts `source` in the served folder (as `name`)."""
        target = os.path.join(self.folder, "models", name or os.path.basename(source))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)

    def stop(self):
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh Keras cache (KERAS_HOME); returns its `models` folder. No proxy for 127.0.0.1."""
    home = tmp_path / "keras_home"
    monkeypatch.setenv("KERAS_HOME", str(home))
    monkeypatch.delenv(registry.URL_VARIABLE, raising=False)
    for variable in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    return home / "models"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local server whose folder the weights URL points at."""
    folder = tmp_path / "served"
    folder.mkdir()
    local = LocalServer(folder)
    monkeypatch.setenv(registry.URL_VARIABLE, local.url)
    yield local
    local.stop()


@pytest.fixture(scope="module")
def parity():
    with np.load(PARITY) as data:
        return {key: data[key] for key in data.files}


def register(monkeypatch, path=CHECKPOINT, sha256=None, name=None):
    """Registers `path` as the x0.5 checkpoint (a 10-class net), under the file name
    `name`; the entry keeps the registry name `shufflenet_v2_x0_5.imagenet`."""
    entry = dataclasses.replace(
        registry.CHECKPOINTS[0.5],
        file_name=name or os.path.basename(path),
        sha256=sha256 or sha256_of(path),
        num_params=PARAMS_10_CLASSES,
        acc1=0.0,
        acc5=0.0,
        classes=10,
        file_size=os.path.getsize(path),
    )
    monkeypatch.setitem(registry.CHECKPOINTS, 0.5, entry)
    return entry


def imagenet_v2(builder=ShuffleNetV2, **kwargs):
    options = dict(weights="imagenet", classes=10, classifier_activation=None)
    return builder(0.5, **{**options, **kwargs})


def converted_weights():
    """The converted file of the registered x0.5 checkpoint (a 10-class net)."""
    build = functools.partial(ShuffleNetV2, 0.5, stem="imagenet", classes=10)
    return pretrained.converted_weights(0.5, True, build)


def logits(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def test_download_convert_then_the_cache_alone(cache, server, monkeypatch, parity):
    entry = register(monkeypatch)
    server.serve(CHECKPOINT)
    model = imagenet_v2(stem="imagenet", input_shape=(None, None, 3))
    # torchvision's own logits for this checkpoint (the converter's parity, end to end).
    x = parity["inputs_224"]
    np.testing.assert_allclose(logits(model, x), parity["logits_224"], rtol=0, atol=1e-4)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == entry.num_params
    assert server.requests == [f"/models/{NAME}"]
    stem = NAME.removesuffix(".pth")
    assert sorted(os.listdir(cache)) == sorted([NAME, f"{stem}.weights.h5"])
    server.stop()  # the second call needs no network (and no torch: none is installed)
    small = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype("float32")
    again = imagenet_v2(stem="imagenet", input_shape=(64, 64, 3))
    np.testing.assert_array_equal(logits(again, small), logits(model, small))
    assert server.requests == [f"/models/{NAME}"]


def test_weights_by_name_load_the_same_checkpoint(cache, server, monkeypatch, parity):
    # weights=<registry name> goes through the same download, hash and conversion as
    # weights="imagenet": the same file, served once, and torchvision's logits.
    entry = register(monkeypatch)
    assert entry.name == "shufflenet_v2_x0_5.imagenet"
    server.serve(CHECKPOINT)
    model = imagenet_v2(weights=entry.name, stem="imagenet", input_shape=(None, None, 3))
    x = parity["inputs_224"]
    np.testing.assert_allclose(logits(model, x), parity["logits_224"], rtol=0, atol=1e-4)
    assert server.requests == [f"/models/{NAME}"]
    auto = imagenet_v2(AutoShuffleNetV2, weights=entry.name, stem="imagenet")
    np.testing.assert_allclose(logits(auto, x), parity["logits_224"], rtol=0, atol=1e-4)
    assert server.requests == [f"/models/{NAME}"]  # the converted file, from the cache
    # keras-hub's spelling of the same name (the preset's) is the same entry.
    preset = imagenet_v2(weights=entry.preset, stem="imagenet")
    np.testing.assert_allclose(logits(preset, x), parity["logits_224"], rtol=0, atol=1e-4)
    assert server.requests == [f"/models/{NAME}"]


def test_weights_by_name_refuse_another_width(cache, monkeypatch):
    # Nothing is downloaded: the width is checked first.
    small = dict(input_shape=(64, 64, 3), stem="imagenet")
    message = (
        r"weights='shufflenet_v2_x1_0.imagenet' are the weights of ShuffleNetV2 width 1.0, "
        r"but this model has width 0.5.*'shufflenet_v2_x0_5.imagenet'.*"
        r"Received: weights='shufflenet_v2_x1_0.imagenet', width=0.5$"
    )
    with pytest.raises(ValueError, match=message):
        ShuffleNetV2(0.5, weights="shufflenet_v2_x1_0.imagenet", **small)
    with pytest.raises(ValueError, match="width 2.0, but this model has width 1.5"):
        AutoShuffleNetV2(1.5, weights="shufflenet_v2_x2_0.imagenet", **small)
    with pytest.raises(ValueError, match="ShuffleNet v2 only"):
        ShuffleNetV1(0.5, 3, weights="shufflenet_v2_x0_5.imagenet", **small)
    with pytest.raises(ValueError, match="Received: padding='same'"):
        ShuffleNetV2(0.5, weights="shufflenet_v2_x0_5.imagenet", padding="same", **small)
    # An unknown name is neither published weights nor a file: the names are listed.
    unknown = r"shufflenet_v2_x0_5.imagenet', .*Received: weights='shufflenet_v2_x3_0.imagenet'"
    with pytest.raises(ValueError, match=unknown):
        ShuffleNetV2(0.5, weights="shufflenet_v2_x3_0.imagenet", **small)
    assert not cache.exists() or os.listdir(cache) == []


def place_in_cache(cache):
    """The checkpoint put in Keras's cache by hand (the offline recipe): no download."""
    cache.mkdir(parents=True)
    shutil.copyfile(CHECKPOINT, cache / NAME)


def test_learned_shuffles_start_at_the_pretrained_manual_net(cache, monkeypatch, parity):
    register(monkeypatch)
    place_in_cache(cache)
    # shuffle_initializer is forced to "manual" (the default "random" would discard the
    # pretrained routing): the relaxed net computes torchvision's.
    auto = imagenet_v2(AutoShuffleNetV2, stem="imagenet", input_shape=(None, None, 3))
    shuffles = [layer for layer in auto.layers if isinstance(layer, RelaxedShuffle)]
    assert len(shuffles) == 16 and not any(layer.is_hardened for layer in shuffles)
    x = parity["inputs_224"]
    np.testing.assert_allclose(logits(auto, x), parity["logits_224"], rtol=0, atol=1e-4)


def test_without_the_classifier(cache, monkeypatch, parity):
    register(monkeypatch)
    place_in_cache(cache)
    backbone = imagenet_v2(include_top=False, pooling="avg", stem="imagenet")
    features = logits(backbone, parity["inputs_224"])
    head = features @ parity["weights/fc.weight"].T + parity["weights/fc.bias"]
    np.testing.assert_allclose(head, parity["logits_224"], rtol=0, atol=1e-4)
    stem = NAME.removesuffix(".pth")
    assert sorted(os.listdir(cache)) == sorted([NAME, f"{stem}_notop.weights.h5"])


def test_a_wrong_hash_caches_nothing(cache, server, monkeypatch):
    server.serve(CHECKPOINT)
    for wrong in ("0" * 64, "0123456789"):  # a full hash, a published prefix
        register(monkeypatch, sha256=wrong)
        with pytest.raises(ValueError) as info:
            download.download_checkpoint(0.5)
        message = str(info.value)
        assert f"{server.url}{NAME}" in message and wrong in message
        assert sha256_of(CHECKPOINT) in message and "nothing was cached" in message
        assert os.listdir(cache) == []
    # A damaged file in the cache is replaced by a good download.
    register(monkeypatch)
    (cache / NAME).write_bytes(b"damaged")
    path = download.download_checkpoint(0.5)
    assert sha256_of(path) == sha256_of(CHECKPOINT)
    assert sorted(os.listdir(cache)) == [NAME]


def test_an_unreachable_server_says_how_to_convert_by_hand(cache, server, monkeypatch):
    register(monkeypatch)
    server.stop()  # the port is closed: connection refused
    with pytest.raises(OSError) as info:
        imagenet_v2(input_shape=(64, 64, 3), stem="imagenet")
    message = str(info.value)
    assert f"{server.url}{NAME}" in message
    assert "`autoshuffle-convert-weights " in message  # an installed command
    assert str(cache / NAME) in message and registry.URL_VARIABLE in message
    assert os.listdir(cache) == []


def test_the_location_variable_takes_file_urls_and_folders(cache, monkeypatch):
    register(monkeypatch)
    folder = os.path.dirname(CHECKPOINT)
    for base in (f"file://{folder}", f"file://{folder}/", folder):
        monkeypatch.setenv(registry.URL_VARIABLE, base)
        assert registry.CHECKPOINTS[0.5].url == f"file://{folder}/{NAME}"
    path = download.download_checkpoint(0.5)
    assert path == str(cache / NAME) and sha256_of(path) == sha256_of(CHECKPOINT)
    monkeypatch.setenv(registry.URL_VARIABLE, "mirror/models")
    with pytest.raises(ValueError, match="KERAS_AUTOSHUFFLE_WEIGHTS_URL='mirror/models'"):
        registry.checkpoint_url(NAME)
    monkeypatch.delenv(registry.URL_VARIABLE)
    assert registry.checkpoint_url("a.pth") == "https://download.pytorch.org/models/a.pth"


class _System:
    """Pickled as `os.system(command)`."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_hostile_checkpoint_is_refused_and_nothing_cached(cache, server, monkeypatch, tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pth"
    with zipfile.ZipFile(evil, "w") as archive:  # PyTorch's zip layout around a hostile pickle
        archive.writestr("archive/data.pkl", pickle.dumps(_System(f"touch {marker}"), 2))
    register(monkeypatch, path=evil)
    server.serve(evil)
    expected = f"{re.escape(str(cache / 'evil.pth'))}.*{os.system.__module__}.system"
    with pytest.raises(CheckpointError, match=expected):
        imagenet_v2(input_shape=(64, 64, 3), stem="imagenet")
    assert not marker.exists()
    assert os.listdir(cache) == ["evil.pth"]  # it has the registered hash; no weights file


def test_arguments_that_do_not_fit_the_checkpoints_are_refused(cache, monkeypatch):
    # None of these downloads anything (no server, and no network here).
    small = dict(input_shape=(32, 32, 3))
    with pytest.raises(ValueError, match="`classes` must be 1000.*Received: classes=10"):
        ShuffleNetV2(0.5, weights="imagenet", classes=10, stem="imagenet", **small)
    with pytest.raises(ValueError, match="Received: padding='same'"):
        ShuffleNetV2(0.5, weights="imagenet", padding="same", **small)
    with pytest.raises(ValueError, match="Received: stem='cifar'"):
        ShuffleNetV2(0.5, weights="imagenet", stem="cifar", **small)
    with pytest.raises(ValueError, match="stem='auto' picks the CIFAR stem.*stem='imagenet'"):
        ShuffleNetV2(0.5, weights="imagenet", **small)  # 32x32: "auto" is the CIFAR stem
    with pytest.raises(ValueError, match="ShuffleNet v2 only"):
        ShuffleNetV1(0.5, 3, weights="imagenet", stem="imagenet", **small)
    with pytest.raises(ValueError, match="'imagenet'.*Received: weights='imagenet1k'"):
        ShuffleNetV2(0.5, weights="imagenet1k", **small)
    assert not cache.exists() or os.listdir(cache) == []


def test_decode_predictions_with_keras_class_index(cache):
    # Keras's imagenet_class_index.json (MD5 c2c37ea5..., as keras.applications checks it),
    # placed where keras.utils.get_file looks for it: no download.
    cache.mkdir(parents=True)
    shutil.copyfile(
        os.path.join(FIXTURES, "imagenet_class_index.json"), cache / "imagenet_class_index.json"
    )
    preds = np.zeros((2, 1000), "float32")
    preds[0, [1, 0, 999]] = [0.7, 0.2, 0.1]
    preds[1, 281] = 1.0
    decoded = decode_predictions(preds, top=3)
    assert decoded[0] == [
        ("n01443537", "goldfish", pytest.approx(0.7)),
        ("n01440764", "tench", pytest.approx(0.2)),
        ("n15075141", "toilet_tissue", pytest.approx(0.1)),
    ]
    assert decoded[1][0][:2] == ("n02123045", "tabby") and len(decoded[1]) == 3
    assert len(decode_predictions(keras.ops.convert_to_tensor(preds))[0]) == 5
    with pytest.raises(ValueError, match=r"Received: preds.shape=\(2, 10\)"):
        decode_predictions(np.zeros((2, 10)))
    with pytest.raises(ValueError, match="Received: top=0"):
        decode_predictions(preds, top=0)


def test_registry_is_torchvisions():
    # torchvision's ShuffleNet_V2_X*_Weights.IMAGENET1K_V1 (num_params, acc@1, acc@5).
    published = {
        0.5: ("shufflenetv2_x0.5-f707e7126e.pth", 1_366_792, 60.552, 81.746, 256),
        1.0: ("shufflenetv2_x1-5666bf0f80.pth", 2_278_604, 69.362, 88.316, 256),
        1.5: ("shufflenetv2_x1_5-3c479a10.pth", 3_503_624, 72.996, 91.086, 232),
        2.0: ("shufflenetv2_x2_0-8be3c8ee.pth", 7_393_996, 76.230, 93.006, 232),
    }
    for width, (name, params, acc1, acc5, resize) in published.items():
        entry = registry.CHECKPOINTS[width]
        assert (entry.file_name, entry.num_params, entry.acc1, entry.acc5) == (
            name,
            params,
            acc1,
            acc5,
        )
        assert (entry.resize_size, entry.crop_size, entry.classes) == (resize, 224, 1000)
        # The hex in the name is the start of the SHA-256 (torch.hub's check_hash).
        assert entry.sha256.startswith(name.rsplit("-", 1)[1].removesuffix(".pth"))
        assert len(entry.sha256) in (8, 10, 64)


def test_conversion_script_reads_the_checkpoint_without_torch(tmp_path, parity):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: the script reads with torch.load")
    path = os.path.join(
        os.path.dirname(__file__), "..", "scripts", "convert_torchvision_weights.py"
    )
    spec = importlib.util.spec_from_file_location("convert_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    output = str(tmp_path / "x0_5.weights.h5")
    script.main([CHECKPOINT, output, "--no-top"])
    backbone = ShuffleNetV2(
        0.5,
        include_top=False,
        pooling="avg",
        stem="imagenet",
        weights=output,
        input_shape=(224, 224, 3),
    )
    features = logits(backbone, parity["inputs_224"])
    head = features @ parity["weights/fc.weight"].T + parity["weights/fc.bias"]
    np.testing.assert_allclose(head, parity["logits_224"], rtol=0, atol=1e-4)
    damaged = tmp_path / "damaged.pth"
    damaged.write_bytes(b"PK")
    with pytest.raises(SystemExit, match="damaged.pth"):
        script.main([str(damaged), str(tmp_path / "y.weights.h5")])


# --- Servers that stall, mirrors with query strings, damaged files in the cache ---


class RawServer:
    """A TCP server on 127.0.0.1 whose every connection is given to `answer(connection, stop)`
    after the request is read (in a thread); the connection is closed when it returns."""

    def __init__(self, answer):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/models/"
        self.stop = threading.Event()
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self):
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        with connection, contextlib.suppress(OSError):
            connection.recv(65536)
            self.answer(connection, self.stop)

    def close(self):
        self.stop.set()
        self.acceptor.join()
        self.listener.close()


class StallingServer(RawServer):
    """A TCP server on 127.0.0.1 that accepts and then, per `mode`: "silent" answers
    nothing; "stall" sends an HTTP header announcing 100000 bytes, 1000 of them, then
    nothing; "trickle" sends that header then one byte every 0.2 s. Every connection is
    closed after `release` seconds, so a client without a timeout fails there, not hangs.
    """

    def __init__(self, mode, release=20.0):
        self.mode, self.release = mode, release
        super().__init__(self._answer)

    def _answer(self, connection, stop):
        if self.mode != "silent":
            connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n")
        if self.mode == "stall":
            connection.sendall(b"x" * 1000)
        deadline = time.monotonic() + self.release
        while time.monotonic() < deadline and not stop.wait(0.2):
            if self.mode == "trickle":
                connection.sendall(b"x")


@pytest.mark.parametrize("mode", ["silent", "stall", "trickle"])
def test_a_stalled_server_times_out_naming_the_url_and_the_ways_out(cache, monkeypatch, mode):
    register(monkeypatch)
    server = StallingServer(mode)
    monkeypatch.setenv(registry.URL_VARIABLE, server.url)
    monkeypatch.setenv(download.TIMEOUT_VARIABLE, "1")
    start = time.monotonic()
    try:
        with pytest.raises(OSError) as info:
            imagenet_v2(input_shape=(64, 64, 3), stem="imagenet")
    finally:
        server.close()
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert f"{server.url}{NAME}" in message and "stalled" in message
    assert f"Set {download.TIMEOUT_VARIABLE} to a number of seconds" in message
    assert registry.URL_VARIABLE in message and str(cache / NAME) in message
    assert os.listdir(cache) == []  # the partial download is removed


def test_the_download_timeout_is_a_setting(monkeypatch):
    monkeypatch.delenv(download.TIMEOUT_VARIABLE, raising=False)
    assert download.download_timeout() == 60
    monkeypatch.setenv(download.TIMEOUT_VARIABLE, " 2.5 ")
    assert download.download_timeout() == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(download.TIMEOUT_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"Received: {download.TIMEOUT_VARIABLE}='{bad}'"):
            download.download_timeout()


def test_mirror_urls_keep_their_query_string(cache, server, monkeypatch):
    cases = {
        "https://mirror.example/models/?token=abc": "https://mirror.example/models/a.pth?token=abc",
        "https://mirror.example/models?token=abc#x": "https://mirror.example/models/a.pth?token=abc#x",
        "https://mirror.example": "https://mirror.example/a.pth",
        "file:///srv/models/": "file:///srv/models/a.pth",
    }
    for base, url in cases.items():
        monkeypatch.setenv(registry.URL_VARIABLE, base)
        assert registry.checkpoint_url("a.pth") == url
    for bad in ("file:relative/dir", "https:///models", "ftp:models"):
        monkeypatch.setenv(registry.URL_VARIABLE, bad)
        with pytest.raises(
            ValueError, match=re.escape(f"Received: {registry.URL_VARIABLE}={bad!r}")
        ):
            registry.checkpoint_url("a.pth")
    # For real: a mirror that wants its token gets it.
    register(monkeypatch)
    server.serve(CHECKPOINT)
    monkeypatch.setenv(registry.URL_VARIABLE, server.url + "?token=abc")
    path = download.download_checkpoint(0.5)
    assert server.requests == [f"/models/{NAME}?token=abc"]
    assert sha256_of(path) == sha256_of(CHECKPOINT)


def test_a_mirror_folder_entry_that_is_not_a_file_is_refused(cache, monkeypatch, tmp_path):
    register(monkeypatch)
    os.mkfifo(tmp_path / NAME)  # opening it to read would wait for a writer for ever
    monkeypatch.setenv(registry.URL_VARIABLE, str(tmp_path))
    with pytest.raises(OSError, match="is not a regular file"):
        download.download_checkpoint(0.5)


def test_a_wrong_hash_file_in_the_cache_is_named_when_offline(cache, server, monkeypatch):
    register(monkeypatch)
    server.stop()
    cache.mkdir(parents=True)
    (cache / NAME).write_bytes(b"tampered")
    with pytest.raises(OSError) as info:
        download.download_checkpoint(0.5)
    message = str(info.value)
    assert f"The file already at {cache / NAME} failed its hash check" in message
    assert sha256_of(cache / NAME) in message and "replace it" in message


def test_a_damaged_converted_file_in_the_cache_is_named(cache, monkeypatch):
    register(monkeypatch)
    place_in_cache(cache)
    good = converted_weights()
    content = open(good, "rb").read()
    damages = {
        "empty": b"",
        "truncated": content[: len(content) // 2],
        "not HDF5": b"not weights" * 100,
    }
    for label, damaged in damages.items():
        with open(good, "wb") as handle:
            handle.write(damaged)
        with pytest.raises(ValueError) as info:
            imagenet_v2(input_shape=(64, 64, 3), stem="imagenet")
        message = str(info.value)
        assert f"The cached ImageNet weights file {good} cannot be read" in message, label
        assert "Delete it" in message and "replace it" in message
    os.remove(good)
    os.mkdir(good)  # a folder where the file goes
    with pytest.raises(ValueError, match=f"file {re.escape(good)} cannot be read"):
        converted_weights()
    os.rmdir(good)  # deleted as told: converted again
    assert converted_weights() == good and os.path.getsize(good) == len(content)


def test_imagenet_weights_need_three_input_channels(cache, monkeypatch):
    register(monkeypatch)
    place_in_cache(cache)
    for channels in (1, 4):
        shape = (64, 64, channels)
        with pytest.raises(
            ValueError, match=re.escape(f"3 channels. Received: input_shape={shape}")
        ):
            imagenet_v2(input_shape=shape, stem="imagenet")
    assert os.listdir(cache) == [NAME]  # nothing converted


def test_a_folder_where_the_checkpoint_is_cached_is_named(cache, server, monkeypatch):
    register(monkeypatch)
    server.serve(CHECKPOINT)
    (cache / NAME).mkdir(parents=True)
    with pytest.raises(ValueError, match=f"{re.escape(str(cache / NAME))}, where .* delete it"):
        download.download_checkpoint(0.5)
    assert server.requests == []  # refused before downloading


def test_a_server_sending_too_much_is_cut_off(cache, server, monkeypatch):
    register(monkeypatch)
    server.serve(CHECKPOINT)
    monkeypatch.setattr(download, "MAX_DOWNLOAD_BYTES", 100_000)  # the checkpoint has 1.5 MB
    # This server announces its length (Content-Length): refused before any byte is read.
    with pytest.raises(OSError, match=r"announces \d+ bytes \(Content-Length\), more than"):
        download.download_checkpoint(0.5)
    assert os.listdir(cache) == []


# --- Issue 39: downloads cut short, lying lengths, killed downloaders, hostile cached files ---


@contextlib.contextmanager
def raw_server(monkeypatch, answer):
    server = RawServer(answer)
    monkeypatch.setenv(registry.URL_VARIABLE, server.url)
    try:
        yield server
    finally:
        server.close()


def _cut_short(connection, stop):
    connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)


def test_a_download_cut_short_is_named_as_such(cache, monkeypatch):
    # It was blamed on the mirror ("not torchvision's checkpoint: its SHA-256 is ...").
    register(monkeypatch)
    with raw_server(monkeypatch, _cut_short) as server, pytest.raises(OSError) as info:
        download.download_checkpoint(0.5)
    message = str(info.value)
    assert "the download was cut short: received 1000 of 100000 bytes" in message, message
    assert f"{server.url}{NAME}" in message and "not torchvision's checkpoint" not in message
    assert os.listdir(cache) == []

    def chunked(connection, stop):  # a chunk announced, its bytes never all sent
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        connection.sendall(head + b"186a0\r\n" + b"x" * 1000)

    with raw_server(monkeypatch, chunked), pytest.raises(OSError, match="cut short after"):
        download.download_checkpoint(0.5)
    assert os.listdir(cache) == []


def test_a_length_past_the_bound_is_refused_before_downloading(cache, monkeypatch):
    register(monkeypatch)
    sent = []

    def huge(connection, stop):  # an absurd length: the progress bar's ETA was absurd too
        connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000000000000000\r\n\r\n")
        while not stop.is_set() and len(sent) < 2000:  # 128 MB at most, if it were read
            connection.sendall(b"x" * 65536)
            sent.append(1)

    start = time.monotonic()
    with raw_server(monkeypatch, huge), pytest.raises(OSError) as info:
        download.download_checkpoint(0.5)
    message = str(info.value)
    assert "announces 1000000000000000 bytes (Content-Length), more than the " in message
    assert f"{download.MAX_DOWNLOAD_BYTES} a checkpoint can have" in message
    assert time.monotonic() - start < 10 and os.listdir(cache) == []

    def unannounced(connection, stop):  # no length: cut off at the bound while streaming
        connection.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
        for _ in range(10):
            connection.sendall(b"x" * 65536)

    monkeypatch.setattr(download, "MAX_DOWNLOAD_BYTES", 100_000)
    with raw_server(monkeypatch, unannounced), pytest.raises(OSError, match="more than 100000"):
        download.download_checkpoint(0.5)
    assert os.listdir(cache) == []


def test_the_download_timeout_has_a_documented_maximum(monkeypatch):
    # 1e10 gave an OverflowError ("timeout doesn't fit into C timeval") from the socket.
    for bad in ("1e10", "3600.5", "1e400", "-inf", "-0", "0x10", "", "1 000"):
        monkeypatch.setenv(download.TIMEOUT_VARIABLE, bad)
        if not bad.strip():
            assert download.download_timeout() == 60  # unset
            continue
        with pytest.raises(ValueError) as info:
            download.download_timeout()
        message = str(info.value)
        assert "at most 3600" in message, message
        assert message.endswith(f"Received: {download.TIMEOUT_VARIABLE}={bad!r}"), message
    monkeypatch.setenv(download.TIMEOUT_VARIABLE, "3600")
    assert download.download_timeout() == download.MAX_TIMEOUT == 3600


_KILLED_DOWNLOAD = """
import os, sys
from keras_autoshuffle.applications.weights import download, registry
import dataclasses
entry = dataclasses.replace(
    registry.CHECKPOINTS[0.5], file_name=sys.argv[1], sha256="0" * 64, classes=10
)
registry.CHECKPOINTS[0.5] = entry
download.download_checkpoint(0.5)
"""


def _partials(cache):
    return sorted(n for n in os.listdir(cache) if n.endswith(".download"))


def test_a_killed_download_leaves_no_partial_file_for_ever(cache, monkeypatch, tmp_path):
    register(monkeypatch)

    def stall(connection, stop):  # 1000 bytes of 100000, then nothing until the test ends
        connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        stop.wait(120)

    with raw_server(monkeypatch, stall):
        environment = {
            **os.environ,
            "KERAS_BACKEND": "numpy",  # a faster import; the download code is the same
            download.TIMEOUT_VARIABLE: "600",
            "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        }
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED_DOWNLOAD, NAME],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and child.poll() is None:
                names = _partials(cache) if cache.exists() else []
                if names:  # its 1000 bytes may sit in the writer's buffer
                    time.sleep(0.5)
                    break
                time.sleep(0.1)
            else:
                pytest.fail(f"the child wrote no partial download (exit {child.poll()})")
            child.send_signal(signal.SIGKILL)  # killed mid-download: no clean-up runs
        finally:
            child.kill()
            child.wait()
        (left,) = _partials(cache)
        assert f".{child.pid}." in left
    # Beside it: a live downloader's file (this process's parent: alive), a file of a dead
    # PID on another host (shared cache: its PID means nothing here), an old version's
    # name nobody wrote for hours.
    tag = left.removeprefix(f".{NAME}.").split(".")[0]  # the writer's host and PID namespace
    live = f".{NAME}.{tag}.{os.getppid()}.0123abcd.download"
    other_host = f".{NAME}.elsewhere-1.{child.pid}.0123abcd.download"
    old = f".{NAME}.12345.download"
    for name in (live, other_host, old):
        (cache / name).write_bytes(b"x")
    long_ago = time.time() - 3 * 24 * 3600  # past download.STALE_SECONDS (2 h)
    os.utime(cache / old, (long_ago, long_ago))
    # A later download (here, good) removes the dead writer's file and the stale one.
    good = LocalServer(tmp_path / "good")
    try:
        good.serve(CHECKPOINT)
        monkeypatch.setenv(registry.URL_VARIABLE, good.url)
        path = download.download_checkpoint(0.5)
    finally:
        good.stop()
    assert sha256_of(path) == sha256_of(CHECKPOINT)
    assert sorted(os.listdir(cache)) == sorted([NAME, live, other_host])


def _hostile_weights(path, kind):
    import h5py

    with h5py.File(path, "w") as handle:
        handle.attrs[pretrained.PADDING_ATTRIBUTE] = "torch"
        if kind == "huge":  # 2^32 float32 (16 GiB) declared, nothing written: a 6 KB file
            handle.create_dataset("layers/dense/vars/0", shape=(2**32,), dtype="f4", chunks=True)
        elif kind == "huge chunk":  # one element, in a chunk of 2^29 (2 GiB)
            handle.create_dataset(
                "layers/dense/vars/0", shape=(1,), maxshape=(None,), dtype="f4", chunks=(2**29,)
            )
        elif kind == "strings":
            handle.create_dataset("layers/dense/vars/0", data=["a", "b"])
        elif kind == "external":  # its bytes read from another file
            handle.create_dataset(
                "layers/dense/vars/0", shape=(10,), dtype="f4", external=[("/dev/zero", 0, 40)]
            )
        elif kind == "link":
            handle["layers/dense/vars/0"] = h5py.ExternalLink("/elsewhere.h5", "/data")


@pytest.mark.parametrize("kind", ["huge", "huge chunk", "strings", "external", "link"])
def test_a_cached_weights_file_declaring_too_much_is_refused_unread(cache, monkeypatch, kind):
    # `_check_cached` read every dataset whole: 16 GiB for "huge".
    import tracemalloc

    import h5py

    register(monkeypatch)
    cache.mkdir(parents=True)
    path = cache / f"{NAME.removesuffix('.pth')}.weights.h5"
    _hostile_weights(path, kind)
    assert os.path.getsize(path) < 64 * 1024
    reads = []
    original = h5py.Dataset.__getitem__

    def spy(dataset, key):
        reads.append(dataset.name)
        if dataset.size > 10**6:  # what the old code did: refuse it here, not allocate it
            raise AssertionError(f"read {dataset.name} of shape {dataset.shape}")
        return original(dataset, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            converted_weights()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert f"The cached ImageNet weights file {path} cannot be read" in message, message
    assert "Delete it" in message and reads == [], (reads, message)
    assert peak < 32 * 2**20, peak


def test_a_server_dribbling_its_headers_times_out(cache, monkeypatch):
    # Each header byte came within the socket's timeout, so urlopen waited for as long as
    # the server dribbled (a slowloris); now the headers have `timeout` seconds in all.
    register(monkeypatch)
    monkeypatch.setenv(download.TIMEOUT_VARIABLE, "1")

    def dribble(connection, stop):
        connection.sendall(b"HTTP/1.0 200 OK\r\n")
        deadline = time.monotonic() + 8  # then it closes: an old client fails, not hangs
        while time.monotonic() < deadline and not stop.wait(0.3):
            connection.sendall(b"X")

    start = time.monotonic()
    with raw_server(monkeypatch, dribble), pytest.raises(OSError) as info:
        download.download_checkpoint(0.5)
    assert time.monotonic() - start < 5
    assert "stalled (the response's headers took more than 1 s)" in str(info.value)
    assert os.listdir(cache) == []
