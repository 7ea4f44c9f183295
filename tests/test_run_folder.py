"""A run's folder: checked before any image is read, one run at a time, and left as it was
by a run that fails before its first finished epoch (no decoded-image cache, no files of a
run that holds nothing). No training here: every case is refused before it or at once.
"""

import os
import signal
import stat
import subprocess
import sys

import pytest
from test_finetune import TINY, tiny_network, write_folder
from test_pretrained_weights import NAME, register
from test_pretrained_weights import cache as cache  # noqa: F401 (fixtures: the weights server)
from test_pretrained_weights import server as server  # noqa: F401

from keras_autoshuffle.commands import finetune as finetune_command
from keras_autoshuffle.commands import train as train_command
from keras_autoshuffle.finetuning import finetune, network, run_folder
from keras_autoshuffle.training import run_lock
from keras_autoshuffle.training.fault_tolerance import (
    LOCK_FILE,
    RunDirectoryError,
    locked_folder,
)

FROM_SCRATCH = dict(weights=None, epochs=1, **TINY)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("images"), per_class=2, val_per_class=1)


def contents(folder):
    """Every path under `folder`, relative (None where `folder` does not exist)."""
    if not os.path.lexists(folder):
        return None
    return sorted(
        os.path.relpath(os.path.join(d, n), folder)
        for d, ds, fs in os.walk(folder)
        for n in ds + fs
    )


def test_refusals_after_the_scan_leave_the_output_folder_as_it_was(images, tmp_path, monkeypatch):
    """A batch larger than the training images (known after the scan, refused before the
    cache), a seed past 32 bits and a `.keras` start of another width (refused before the
    scan): no cache, no labels.txt or split.json, no folder where there was none."""
    monkeypatch.setattr(network, "ShuffleNetV2", tiny_network)
    start = tmp_path / "start.keras"
    tiny_network(0.5, input_shape=(TINY["image_size"],) * 2 + (3,), classes=3).save(start)
    cases = [
        (dict(batch_size=7), "batch_size=7"),  # 6 training images
        (dict(seed=2**32), "seed=4294967296"),
        (dict(weights=str(start), width=1.0), "Received: width=1.0"),
    ]
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for overrides, named in cases:
        for output, before in ((tmp_path / "new" / "out", None), (kept, ["notes.txt"])):
            with pytest.raises(ValueError, match=named):
                finetune(images, output, **{**FROM_SCRATCH, **overrides})
            assert contents(output) == before, overrides
        assert not (tmp_path / "new").exists()


@pytest.mark.usefixtures("cache")
def test_imagenet_weights_that_cannot_be_downloaded_stop_the_command_first(
    images, tmp_path, server, monkeypatch, capsys
):
    """The README's first command without network: one line naming the URL, status 2,
    before any image is read; the output folder is not made."""
    register(monkeypatch)
    server.stop()  # connection refused on 127.0.0.1
    output = tmp_path / "out"
    argv = [str(images), "--output", str(output), "--width", "0.5", "--image-size", "32"]
    assert finetune_command.main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("autoshuffle-finetune: error: ")
    assert f"{server.url}{NAME}" in error and "Traceback" not in error
    assert not output.exists()


@pytest.mark.parametrize("where", ["inside", "same", "holding", "root"])
def test_the_output_folder_and_the_images_must_be_apart(images, where):
    output = {
        "inside": images / "train" / "run",
        "same": images,
        "holding": images.parent,
        "root": "/",
    }[where]
    before = contents(images)
    with pytest.raises(RunDirectoryError, match="must be apart") as info:
        finetune(images, output, **FROM_SCRATCH)
    assert f"output_dir={str(output)!r}, images={str(images)!r}" in str(info.value)
    assert contents(images) == before


@pytest.mark.parametrize("output", [None, "", "  ", 3])
def test_an_output_that_names_no_folder_is_refused_by_name(images, output):
    with pytest.raises(ValueError, match=f"Received: output_dir={output!r}$"):
        finetune(images, output, **FROM_SCRATCH)


def test_an_output_under_a_file_or_on_a_read_only_disk_is_one_line(images, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    outputs = [tmp_path / "file" / "out"]
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", read_only])
    if mounted.returncode == 0:
        outputs.append(read_only / "out")
    try:
        for output in outputs:
            argv = [str(images), "--output", str(output), "--weights", "none", "--width", "0.5"]
            assert finetune_command.main(argv) == 2, output
            error = capsys.readouterr().err
            assert error.count("\n") == 1 and f"output_dir={str(output)!r}" in error, error
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", read_only], check=True)
    if mounted.returncode != 0:
        pytest.skip("no tmpfs mount here (root only): the read-only case was not run")


# Holds the run lock of a folder until killed.
# The package's lock module (the standard library only) loaded from its file: the holder
# imports neither the package nor TensorFlow (~11 CPU-s a process on the 2-core EPYC).
HOLDER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("run_lock", sys.argv[2])
run_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_lock)
with run_lock.locked_folder(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_run_into_a_folder_in_use_is_refused_until_the_first_dies(
    images, tmp_path, capsys
):
    output = tmp_path / "out"
    output.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(output), run_lock.__file__],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        in_use = f"another run (PID {holder.pid}) is using this folder: {output}"
        with pytest.raises(RunDirectoryError, match=in_use.replace("(", r"\(").replace(")", r"\)")):
            finetune(images, output, **FROM_SCRATCH)
        argv = ["--dataset", "digits", "--epochs", "1", "--max-train-examples", "32"]
        with pytest.raises(SystemExit) as info:
            train_command.main([*argv, "--batch-size", "32", "--output", str(output)])
        assert in_use in str(info.value.code)
        assert sorted(os.listdir(output)) == [LOCK_FILE]  # nothing of either run
    finally:
        holder.kill()  # SIGKILL: the system releases the lock
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    with locked_folder(output):  # free again; the dead run's lock file is taken over
        assert (output / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert os.listdir(output) == []


@pytest.mark.parametrize("kind", ["folder", "fifo", "link"])
def test_a_lock_file_that_is_not_a_file_is_refused_by_name(tmp_path, kind):
    lock, target = tmp_path / LOCK_FILE, tmp_path / "target"
    target.write_text("untouched")
    {
        "folder": lock.mkdir,
        "fifo": lambda: os.mkfifo(lock),
        "link": lambda: lock.symlink_to(target),
    }[kind]()
    with pytest.raises(RunDirectoryError, match=f"lock file {lock} is not a regular file"):
        with locked_folder(tmp_path):
            pass
    assert target.read_text() == "untouched" and os.path.lexists(lock)
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(lock).st_mode)


def test_the_lock_file_is_no_run_file(tmp_path):
    """`clear_run` (overwrite) and the finished-run check leave the lock alone."""
    with locked_folder(tmp_path):
        run_folder.clear_run(str(tmp_path))
        assert os.listdir(tmp_path) == [LOCK_FILE]
        assert not run_folder.finished(str(tmp_path), overwrite=False)


def test_a_failed_dataset_download_is_one_line(tmp_path):
    """`autoshuffle-train --download` into a folder that cannot be made (under a file: no
    network is reached): one line, not TensorFlow Datasets' traceback."""
    (tmp_path / "file").write_text("")
    argv = ["--dataset", "cifar10", "--download", "--data-dir", str(tmp_path / "file" / "tfds")]
    with pytest.raises(SystemExit) as info:
        train_command.main([*argv, "--output", str(tmp_path / "out")])
    message = str(info.value.code)
    assert message.startswith(f"error: cifar10 could not be downloaded into {tmp_path}")
    assert "\n" not in message and not (tmp_path / "out").exists()


def test_what_a_killed_export_leaves_is_removed_with_the_runs_files(tmp_path):
    # The LiteRT files are written in a staging folder, then moved in: after kill -9 during
    # the export, an overwrite (and the rerun's export itself) removes what was left.
    staging = tmp_path / run_folder.LITERT_STAGING
    staging.mkdir()
    (staging / "model.tflite").write_bytes(b"half a file")
    (tmp_path / "model.partial.tflite").write_bytes(b"half a file")  # killed while described
    (tmp_path / "preset.partial").mkdir()  # killed while the preset was written
    (tmp_path / "photos_of_mine.txt").write_text("not the run's")
    run_folder.clear_run(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos_of_mine.txt"]
