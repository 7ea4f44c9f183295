"""From a builder's `weights=` to a Keras weights file: torchvision's ImageNet checkpoints
behind `weights="imagenet"` and `weights="shufflenet_v2_x1_0.imagenet"` (an entry of
`registry`) downloaded, checked, converted and cached; and what any Keras weights file says
of the net it fits (its learned shuffles, the padding it was marked with).

`ShuffleNetV2(width, weights="imagenet")` (or the name of the width's entry):

1. uses `<cache>/models/<checkpoint>.weights.h5` (or `..._notop.weights.h5`) if it is
   there: no network, no torch;
2. otherwise takes the checkpoint from `<cache>/models/<file name>` if it is there with
   the right hash, else downloads it from `https://download.pytorch.org/models/<file name>`
   (or from `$KERAS_AUTOSHUFFLE_WEIGHTS_URL/<file name>`: a mirror, or `file:///a/folder`),
   giving up when the server sends nothing for `$KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT`
   seconds (60 by default), and checks its SHA-256 (a mismatch deletes the download:
   nothing is cached);
3. reads it with `read_torch_checkpoint` (no torch, no code from the file), converts it
   with `load_torchvision_weights`, marks it with PyTorch's padding (`mark_padding`) and
   writes the Keras weights file atomically.

`<cache>` is Keras's cache folder (`registry.cache_dir()`), `$KERAS_HOME` (read at each
call) or `~/.keras`. The entries (`registry.CHECKPOINTS`) are read at each call: a test
that replaces one is seen here too.
"""

import contextlib
import http.client
import math
import os
import re
import secrets
import socket
import ssl
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile

import keras

from keras_autoshuffle import _keras_internals
from keras_autoshuffle._files import sha256_of
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.applications.architecture import REPEATS, V2_CONFIGS
from keras_autoshuffle.applications.weights import registry
from keras_autoshuffle.applications.weights.registry import (
    CACHE_SUBDIR,
    CHECKPOINTS,
    URL_VARIABLE,
    cache_dir,
)
from keras_autoshuffle.applications.weights.torch_checkpoint import read_torch_checkpoint
from keras_autoshuffle.applications.weights.torchvision import load_torchvision_weights

# The HDF5 attribute that records the padding of the nets a weights file fits
# (`mark_padding`, `file_padding`).
PADDING_ATTRIBUTE = "keras_autoshuffle_padding"

# Seconds a download waits for the server to connect or send its next bytes (at most
# MAX_TIMEOUT: an hour without a byte is no download, and sockets refuse ~1e10 s).
TIMEOUT_VARIABLE = "KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0
# A partial file (a download, a conversion) is written under a name that carries its
# writer: `.<name>.<host>-<pid namespace>.<pid>.<token>.download`. One whose writer is
# dead (same host and PID namespace, no such process), or that nothing has written for
# STALE_SECONDS (a live download writes at least every timeout, <= MAX_TIMEOUT, seconds;
# this also covers a PID reused since, another host sharing the cache, older versions'
# names), is removed by the next download or conversion into the same folder.
STALE_SECONDS = 2 * MAX_TIMEOUT
_PARTIAL = re.compile(
    r"\.(?P<name>.+)\.(?P<tag>[A-Za-z0-9-]+)\.(?P<pid>[0-9]{1,10})\.(?P<token>[0-9a-f]{8})"
    r"\.(?:download|partial\.weights\.h5)"
)
# Partial names of earlier versions (`.<name>.<pid>.download`): removed once stale.
_OLD_PARTIAL = re.compile(r"\..+\.[0-9]+\.(?:download|partial\.weights\.h5)")
# torchvision's largest ShuffleNetV2 checkpoint (x2.0) has 29 MB; a server sending more is
# not sending it.
MAX_DOWNLOAD_BYTES = 256 * 2**20


def download_timeout():
    """Seconds a download waits for the server to connect or send its next bytes:
    `$KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT` when set (a number > 0, at most 3600), else 60."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ValueError(
            f"The environment variable {TIMEOUT_VARIABLE} must be a number of seconds > 0 "
            f"and at most {MAX_TIMEOUT:g} (how long a download waits for the server). "
            f"Received: {TIMEOUT_VARIABLE}={text!r}"
        )
    return value


def _convert_by_hand(entry, width):
    """The offline recipe that every download error ends with."""
    return (
        f"Offline: download {entry.url} elsewhere and either put it at "
        f"{os.path.join(cache_dir(), CACHE_SUBDIR, entry.file_name)}, or set {URL_VARIABLE} to "
        "the folder or mirror that holds it (file:///path/to/folder works), or convert it by "
        f"hand with the command `autoshuffle-convert-weights {entry.file_name} "
        f"x{width:g}.weights.h5` and pass weights='x{width:g}.weights.h5' (shufflenet_v2 "
        "builders with stem='imagenet')."
    )


class _Stalled(OSError):
    """The server stopped sending (see `_fetch`)."""


class _CutShort(OSError):
    """The connection closed before the bytes the server announced had come."""


def _content_length(response):
    """The byte count a response announces (`Content-Length`), or None (absent, not a
    decimal number, several different values)."""
    values = {v.strip() for v in response.headers.get_all("Content-Length") or ()}
    if len(values) != 1:
        return None
    (text,) = values
    return int(text) if re.fullmatch(r"[0-9]{1,20}", text) else None


def _writer_tag():
    """Where this process runs: its host and PID namespace (`<host>-<namespace>`); a PID
    means this process only under the same tag."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{host}-{namespace}"


def partial_path(folder, name, suffix="download"):
    """A fresh name in `folder` to write `name` under before it is moved into place:
    `.<name>.<writer tag>.<pid>.<token>.<suffix>` (see `STALE_SECONDS`)."""
    token = secrets.token_hex(4)
    return os.path.join(folder, f".{name}.{_writer_tag()}.{os.getpid()}.{token}.{suffix}")


def _alive(pid):
    """Whether a process `pid` exists here (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):
        return True  # not ours to signal, or not a PID we can judge: keep its file
    return True


def remove_dead_partials(folder):
    """Removes from `folder` the partial files (`partial_path`) of writers that are dead
    or that nothing has written for `STALE_SECONDS`; returns their names. A live
    writer's file, here or on another host, is kept."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    tag, now = _writer_tag(), time.time()
    for name in names:
        match = _PARTIAL.fullmatch(name)
        if match is None and _OLD_PARTIAL.fullmatch(name) is None:
            continue
        path = os.path.join(folder, name)
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(status.st_mode):
            continue
        dead = (
            match is not None
            and match["tag"] == tag
            and int(match["pid"]) != os.getpid()
            and not _alive(int(match["pid"]))
        )
        if dead or now - status.st_mtime > STALE_SECONDS:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                removed.append(name)
    return removed


class _HeaderDeadline:
    """Bounds the time until a response's headers have come, redirects included: a server
    sending its header one byte at a time (each byte within the socket's timeout) would
    otherwise hold `urlopen` for as long as it likes. Every connection `opener()` makes is
    shut down when `seconds` have passed and the headers are not all there."""

    def __init__(self, seconds):
        self.sockets, self.lock, self.expired = [], threading.Lock(), False
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def _expire(self):
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _record(self, connection_class):
        deadline = self

        class Connection(connection_class):
            def connect(self):
                super().connect()
                with deadline.lock:
                    deadline.sockets.append(self.sock)
                    if deadline.expired:
                        self.sock.shutdown(socket.SHUT_RDWR)

        return Connection

    def opener(self):
        deadline = self

        class HTTPHandler(urllib.request.HTTPHandler):
            def http_open(self, request):
                return self.do_open(deadline._record(http.client.HTTPConnection), request)

        class HTTPSHandler(urllib.request.HTTPSHandler):
            # The context kept here, not read back from the handler (a private attribute):
            # the certificates checked and the host name matched, as urllib's default.
            def __init__(self):
                self.ssl_context = ssl.create_default_context()
                super().__init__(context=self.ssl_context)

            def https_open(self, request):
                connection = deadline._record(http.client.HTTPSConnection)
                return self.do_open(connection, request, context=self.ssl_context)

        return urllib.request.build_opener(HTTPHandler, HTTPSHandler)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *_):
        self.timer.cancel()
        with self.lock:
            self.sockets.clear()  # the body's reads are bounded by `_fetch` itself


def _fetch(url, target, timeout):
    """Writes what `url` serves into the file `target`, at most `MAX_DOWNLOAD_BYTES`.

    Gives up (`_Stalled`) when the server takes more than `timeout` seconds to connect
    or to send anything, takes more than `timeout` seconds in all to send its response's
    headers (redirects included), or sends less than 64 KiB in any `timeout` seconds (a
    trickle would hold the call as long as a stall). A file: URL must name a regular file
    (a FIFO would block).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        local = urllib.request.url2pathname(parts.path)
        if os.path.exists(local) and not os.path.isfile(local):
            raise OSError(f"{local} is not a regular file")
    deadline = _HeaderDeadline(timeout)
    try:
        with deadline:
            response = deadline.opener().open(url, timeout=timeout)
        if deadline.expired:  # the headers were cut at the deadline: what came is no answer
            response.close()
            raise _Stalled(f"the response's headers took more than {timeout:g} s")
    except _Stalled:
        raise
    except TimeoutError:  # connected, no answer
        raise _Stalled(f"no answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as error:
        if deadline.expired:
            raise _Stalled(f"the response's headers took more than {timeout:g} s") from None
        if isinstance(error, urllib.error.URLError) and isinstance(error.reason, TimeoutError):
            raise _Stalled(f"no connection within {timeout:g} s") from None
        raise
    length = _content_length(response)
    if length is not None and length > MAX_DOWNLOAD_BYTES:
        response.close()
        raise OSError(
            f"the server announces {length} bytes (Content-Length), more than the "
            f"{MAX_DOWNLOAD_BYTES} a checkpoint can have; nothing was downloaded"
        )
    # The bar counts bytes; its ETA comes from a length the server announced (bounded
    # above), else the bar has no target and shows no ETA.
    progress = keras.utils.Progbar(length or None, unit_name="bytes")
    received, window, window_start = 0, 0, time.monotonic()
    with response, open(target, "wb") as out:
        while True:
            try:
                block = response.read1(1 << 16)
            except TimeoutError:
                raise _Stalled(f"nothing sent for {timeout:g} s after {received} bytes") from None
            except http.client.IncompleteRead:  # a chunked response cut short
                raise _CutShort(
                    f"the download was cut short after {received} bytes (the connection "
                    "closed inside a chunk)"
                ) from None
            if not block:
                if length is not None and received < length:
                    raise _CutShort(
                        f"the download was cut short: received {received} of {length} bytes "
                        "(the connection closed early)"
                    )
                return
            received, window = received + len(block), window + len(block)
            if received > MAX_DOWNLOAD_BYTES:
                raise OSError(f"the server sent more than {MAX_DOWNLOAD_BYTES} bytes")
            out.write(block)
            progress.update(received)
            if window >= 1 << 16:
                window, window_start = 0, time.monotonic()
            elif time.monotonic() - window_start > timeout:
                raise _Stalled(f"under 64 KiB sent in {timeout:g} s after {received} bytes")


def download_checkpoint(width, weights="imagenet"):
    """The path of torchvision's checkpoint for `width` in Keras's cache, downloaded if it
    is not there, its SHA-256 checked.

    A download waits at most `download_timeout()` seconds for the server to connect or
    to send its next bytes (`$KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT`, 60 by default).

    Args:
        width: a key of `CHECKPOINTS`.
        weights: what the builder was given ("imagenet" or the entry's name), for the
            errors' `Received: weights=...`.

    Returns:
        The path of the checked `.pth` file under `<cache>/models`.
    """
    entry = CHECKPOINTS[width]
    expected = entry.sha256.lower()
    base = cache_dir()
    path = os.path.join(base, CACHE_SUBDIR, entry.file_name)
    rejected = ""  # what is said of a file already in the cache that fails the check
    if os.path.lexists(path) and not os.path.isfile(path):
        raise ValueError(
            f"{path}, where torchvision's checkpoint is cached, is not a regular file (a "
            "folder, FIFO or broken link): delete it, or replace it with torchvision's "
            f"file {entry.file_name}. Received: weights={weights!r}"
        )
    if os.path.isfile(path):
        digest = sha256_of(path)
        if digest.startswith(expected):
            return path
        rejected = (
            f"The file already at {path} failed its hash check (SHA-256 {digest}; "
            f"torchvision's starts with {expected}): it is damaged or another file, so it "
            "was not used; replace it with torchvision's file (or delete it). "
        )
    url = entry.url
    timeout = download_timeout()
    folder = os.path.join(base, CACHE_SUBDIR)
    remove_dead_partials(folder)  # what killed downloads left
    # Renamed to `path` once its hash is right; one name per download (its writer's host,
    # PID and a random token), so two downloads at once never write into the same file.
    download = partial_path(folder, entry.file_name)
    try:
        _fetch(url, download, timeout)
    except (OSError, http.client.HTTPException, ValueError) as error:
        if os.path.exists(download):
            os.remove(download)
        if isinstance(error, _Stalled):
            cause = (
                f"the server stalled ({error}). Set {TIMEOUT_VARIABLE} to a number of "
                f"seconds to wait longer (it is {timeout:g}), or {URL_VARIABLE} to another "
                "mirror."
            )
        elif isinstance(error, _CutShort):
            cause = (
                f"{error}: nothing was cached. Try again, or set {URL_VARIABLE} to another mirror."
            )
        else:
            cause = f"{type(error).__name__}: {error}."
        raise OSError(
            f"Could not download torchvision's ImageNet ShuffleNetV2 x{width:g} weights from "
            f"{url}: {cause} {rejected}{_convert_by_hand(entry, width)} "
            f"Received: weights={weights!r}"
        ) from None
    digest = sha256_of(download)
    if not digest.startswith(expected):
        os.remove(download)
        raise ValueError(
            f"The file downloaded from {url} is not torchvision's checkpoint: its SHA-256 is "
            f"{digest}, torchvision's starts with {expected}. It was deleted; nothing was "
            f"cached. A mirror set with {URL_VARIABLE} must serve the original file. "
            f"{_convert_by_hand(entry, width)} Received: SHA-256 {digest}"
        )
    os.replace(download, path)
    return path


# What a converted file in the cache may declare before any of it is read: floating-point
# datasets (float32 as written) in the file itself, at most this many, of at most twice
# the checkpoint's parameter count in all (the BatchNorm statistics add fewer values than
# the parameters), and no links (a soft or external link could lead Keras's loader to
# another file or object).
MAX_CACHED_DATASETS = 10_000


def _declared_values(handle, entry):
    """Checks what the HDF5 file `handle` declares (no data read): its links, each
    dataset's dtype, storage and shape against the net's size; ValueError naming the first
    that does not fit."""
    import h5py

    limit = 2 * entry.num_params + 2**16
    total, count = 0, 0

    links = []  # (h5py fails on an exception raised inside visititems_links)

    def link(name, target):
        if not isinstance(target, h5py.HardLink):
            links.append(name)

    def dataset(name, item):
        nonlocal total, count
        if not isinstance(item, h5py.Dataset):
            return
        count += 1
        if count > MAX_CACHED_DATASETS:
            raise ValueError(f"more than {MAX_CACHED_DATASETS} datasets")
        if item.dtype.kind != "f" or item.dtype.itemsize > 8:
            raise ValueError(f"dataset {name!r} holds {item.dtype}, not floating-point numbers")
        if item.is_virtual or item.external:
            raise ValueError(f"dataset {name!r} is stored outside the file (virtual or external)")
        chunk = math.prod(item.chunks) if item.chunks else 0
        total += item.size
        if total > limit or chunk > limit:
            raise ValueError(
                f"dataset {name!r} declares shape {item.shape} (chunks {item.chunks}), which "
                f"brings the file to {total} values, more than the {limit} that ShuffleNetV2 "
                f"with {entry.num_params} parameters can have; nothing was read"
            )

    handle.visititems_links(link)
    if links:
        raise ValueError(f"{links[0]!r} is a soft or external link (this package writes none)")
    handle.visititems(dataset)
    padding = handle.attrs.get_id(PADDING_ATTRIBUTE) if PADDING_ATTRIBUTE in handle.attrs else None
    if padding is not None and (padding.shape != () or padding.get_storage_size() > 1024):
        raise ValueError(f"the attribute {PADDING_ATTRIBUTE} of shape {padding.shape}")


def _check_cached(path, entry, weights="imagenet"):
    """Refuses a converted weights file in the cache that cannot be read whole (empty,
    truncated, damaged, not HDF5, a folder) or that declares more than the net it holds
    (checked before reading anything), naming it: it would fail every later call."""
    import h5py

    def read(_, item):
        if isinstance(item, h5py.Dataset):
            item[()]

    try:
        if not os.path.isfile(path):
            raise IsADirectoryError("not a regular file")
        with h5py.File(path, "r") as handle:
            _declared_values(handle, entry)
            if handle.attrs.get(PADDING_ATTRIBUTE) not in ("torch", b"torch"):
                raise ValueError("not marked as converted from torchvision (padding 'torch')")
            handle.visititems(read)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as error:
        raise ValueError(
            f"The cached ImageNet weights file {path} cannot be read ({type(error).__name__}: "
            f"{error}): it is damaged (e.g. truncated by a full disk) or not this package's. "
            "Delete it, and it is converted again from torchvision's checkpoint at the next "
            f"call (or replace it with a good copy). Received: weights={weights!r}"
        ) from None


def converted_weights(width, include_top, build, weights="imagenet"):
    """The Keras weights file of torchvision's ImageNet ShuffleNetV2 at `width`, from the
    cache, or downloaded, read (no torch), converted and cached once.

    Args:
        width: a key of `CHECKPOINTS` (0.5, 1.0, 1.5, 2.0).
        include_top: with the classifier, or without it (`..._notop.weights.h5`).
        build: a function of no arguments building the ShuffleNetV2 with manual shuffles
            at `width` (ImageNet stem, PyTorch's padding, `include_top`, the checkpoint's
            classes) the checkpoint is converted into; called only on a cache miss.
        weights: what the builder was given ("imagenet" or the entry's name), for the
            errors' `Received: weights=...`.

    Returns:
        The path of `<cache>/models/<checkpoint>[_notop].weights.h5`, marked as fitting
        nets with PyTorch's padding.
    """
    entry = CHECKPOINTS[width]
    suffix = "" if include_top else "_notop"
    path = os.path.join(cache_dir(), CACHE_SUBDIR, f"{entry.stem}{suffix}.weights.h5")
    if os.path.lexists(path):
        _check_cached(path, entry, weights)
        return path
    checkpoint = download_checkpoint(width, weights)
    state_dict = read_torch_checkpoint(checkpoint)
    model = build()
    try:
        load_torchvision_weights(model, state_dict)
    except ValueError as error:
        raise ValueError(
            f"The checkpoint {checkpoint} (from {entry.url}) does not convert to "
            f"ShuffleNetV2 x{width:g}: {error}"
        ) from None
    remove_dead_partials(os.path.dirname(path))
    partial = partial_path(os.path.dirname(path), f"{entry.stem}{suffix}", "partial.weights.h5")
    try:
        model.save_weights(partial)
        mark_padding(partial, "torch")
        os.replace(partial, path)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def imagenet_weights_file(model, include_top, classes, build, weights="imagenet"):
    """For a builder's `weights="imagenet"` or `weights=<entry name>`: checks that `model`
    is the network the checkpoint fits and returns the converted weights file
    (`converted_weights`).

    Args:
        model: the ShuffleNetV2 / AutoShuffleNetV2 just built (ImageNet stem, PyTorch's
            padding, torchvision's width and stage repeats).
        include_top: whether the model has the classifier.
        classes: its class count; with `include_top`, the checkpoint's (1000).
        build: builds the same net with manual shuffles, for `converted_weights`.
        weights: "imagenet" (the checkpoint of the model's width) or a registry name
            (`registry.list_weights()`), which must be of the model's width.

    Returns:
        The path of the Keras weights file to load.
    """
    named = None if weights == registry.IMAGENET else registry.get_weights(weights)
    shape = tuple(model.inputs[0].shape[1:])
    channels = shape[0] if keras.config.image_data_format() == "channels_first" else shape[-1]
    if channels != 3:
        raise ValueError(
            f"weights={weights!r} are torchvision's network for RGB images: the input must "
            f"have 3 channels. Received: input_shape={shape}"
        )
    found = arch.describe(model)
    if found is None or found.family != "v2":
        raise ValueError(
            f"weights={weights!r} exist for ShuffleNet v2 only (torchvision's checkpoints); "
            "no ImageNet weights are published for ShuffleNet v1 in this layout. Use "
            "ShuffleNetV2 / AutoShuffleNetV2, or weights=None or a weights file. "
            f"Received: weights={weights!r}"
        )
    names = {layer.name for layer in model.layers}
    head = model.get_layer(arch.HEAD_CONV).weights[0].shape
    width = {config[3:]: w for w, config in V2_CONFIGS.items()}.get((head[-2], head[-1]))
    if found.repeats != REPEATS or width not in CHECKPOINTS:
        raise ValueError(
            f"weights={weights!r} need torchvision's ShuffleNetV2 layout: one of the widths "
            f"{sorted(CHECKPOINTS)} with stage repeats {REPEATS} (no `channels` / `repeats` "
            f"overrides). Received: repeats={found.repeats}, head {head[-2]} -> {head[-1]}"
        )
    if named is not None and named.width != width:
        # A name fixes the width: loading it into another width cannot work.
        raise ValueError(
            f"weights={weights!r} are the weights of ShuffleNetV2 width {named.width}, but "
            f"this model has width {width}. Build it with width={named.width}, or pass "
            f"weights={CHECKPOINTS[width].name!r} (or 'imagenet') for width {width}. "
            f"Received: weights={weights!r}, width={width}"
        )
    if arch.STEM_POOL not in names:
        raise ValueError(
            f"weights={weights!r} are torchvision's network, which has the ImageNet stem; "
            "stem='auto' picks the CIFAR stem when both input sides are at most 64. Build "
            f"it with stem='imagenet'. Received: weights={weights!r} with the CIFAR stem "
            f"(input shape {tuple(model.inputs[0].shape[1:])})"
        )
    entry = CHECKPOINTS[width]
    if include_top and classes != entry.classes:
        raise ValueError(
            f"With weights={weights!r} and include_top=True, `classes` must be "
            f"{entry.classes} (torchvision's ImageNet classifier). For another classifier "
            "build with include_top=False (and pooling='avg') and add your own head. "
            f"Received: classes={classes}"
        )
    return converted_weights(width, include_top, build, weights)


def learned_shuffles_in_file(path):
    """How many RelaxedShuffle entries a Keras weights file holds (`.weights.h5`, `.keras`).

    Keras names a layer's entry by its class (`layers/relaxed_shuffle_3`), with or
    without variables (relaxed or hardened). A file that is neither HDF5 nor a `.keras`
    archive raises ValueError naming it.
    """
    try:
        return _keras_internals.count_layer_entries(path, "relaxed_shuffle")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(
            "`weights` must be a Keras weights file (HDF5 `.weights.h5`, or a `.keras` "
            f"archive); {path} cannot be read as one ({type(error).__name__}: {error}). "
            f"Received: weights={path!r}"
        ) from None


def mark_padding(path, padding):
    """Records in a `.weights.h5` file the padding of the net it fits (see `file_padding`)."""
    import h5py

    with h5py.File(path, "a") as handle:
        handle.attrs[PADDING_ATTRIBUTE] = padding


def file_padding(path):
    """The padding a weights file was marked with (`mark_padding`), or None."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            value = handle.attrs.get(PADDING_ATTRIBUTE)
    except OSError:  # not HDF5 (e.g. a .keras archive): unmarked
        return None
    return value.decode() if isinstance(value, bytes) else value
