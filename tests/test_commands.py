"""The installed commands (`[project.scripts]`) and the wheel.

The wheel test builds the wheel from a copy of the repository, installs it alone into a
fresh virtual environment (its dependencies come from the running interpreter's
site-packages through a `.pth` file; nothing is downloaded) and runs an installed
command there.
"""

import argparse
import contextlib
import importlib
import io
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_autoshuffle"
# The commands' command lines, parsed before TensorFlow loads (a package of its own).
CLI_PACKAGE = ROOT / "keras_autoshuffle_cli"
COMMANDS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _entry_point(command):
    module, function = COMMANDS[command].split(":")
    return getattr(importlib.import_module(module), function)


def test_the_commands_are_the_documented_ones():
    assert set(COMMANDS) == {
        "autoshuffle-train",
        "autoshuffle-train-imagenet",
        "autoshuffle-convert-weights",
        "autoshuffle-finetune",
        "autoshuffle-predict",
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_answers_help(command):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exit:
        _entry_point(command)(["--help"])
    assert exit.value.code == 0
    assert printed.getvalue().startswith("usage: ") and "--" in printed.getvalue()


def _parser(command):
    """The argument parser of `command` (its module's `parser()`)."""
    return importlib.import_module(COMMANDS[command].split(":")[0]).parser()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_of_each_command_has_a_help_text(command):
    # Read from the parser's actions, not from the printed text (issue 41).
    parser = _parser(command)
    assert parser.prog == command
    for action in parser._actions:
        assert action.help and action.help.strip(), (command, action.option_strings)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_help_shows_its_defaults_and_ends_with_an_example(command):
    parser = _parser(command)
    text = parser.format_help()
    formatter = parser._get_formatter()
    shown = 0
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue  # their help texts say what happens without them
        expanded = formatter._expand_help(action)
        assert f"default: {action.default}" in expanded, (command, action.option_strings)
        assert re.sub(r"\s", "", expanded) in re.sub(r"\s", "", text)  # wrapped in the text
        shown += 1
    assert shown or command == "autoshuffle-convert-weights"  # it has flags only
    # The last lines: one example of the command itself.
    assert text.rstrip().splitlines()[-2:][0] == "example:", text[-500:]
    assert text.rstrip().splitlines()[-1].startswith(f"  {command} "), text[-500:]


def test_the_training_commands_default_to_the_manual_shuffle():
    # As the builders and the README advise; the learned one stays --shuffle auto.
    for command in ("autoshuffle-train", "autoshuffle-train-imagenet"):
        parser = _parser(command)
        assert parser.parse_args(["--output", "o"]).shuffle == "manual"
        assert parser.parse_args(["--output", "o", "--shuffle", "auto"]).shuffle == "auto"


# A C++ log record (absl's or TensorFlow's format) or a line naming what prints them.
TF_LOG_LINE = re.compile(
    r"^([IWEF]\d{4} |\d{4}-\d\d-\d\d .*: [IWEF] )|tensorflow|cuda|absl|onednn",
    re.IGNORECASE | re.MULTILINE,
)


@pytest.mark.slow
@pytest.mark.tensorflow_only(reason="the commands' start-up lines are TensorFlow's")
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_installed_command_answers_help_without_tensorflow_lines(command):
    # A fresh process, as from a shell, with TF_CPP_MIN_LOG_LEVEL unset (the command sets
    # it). The installed script where there is one, else the same import it does.
    installed = pathlib.Path(sys.executable).parent / command
    module, function = COMMANDS[command].split(":")
    if installed.exists():
        argv = [sys.executable, str(installed), "--help"]
    else:
        code = f"import sys; sys.argv[0] = {command!r}; from {module} import {function}; "
        argv = [sys.executable, "-c", code + f"sys.exit({function}(['--help']))"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not TF_LOG_LINE.search(result.stderr), result.stderr[-3000:]
    assert result.stdout.startswith(f"usage: {command} ") and "\nexample:\n" in result.stdout


def test_each_command_parses_its_arguments_without_importing_keras():
    # Issue 52: `--help` took seconds and 830 MB, as the entry points imported the package
    # and with it TensorFlow. One fresh process runs every entry point's --help and a usage
    # error, then lists what was imported.
    calls = [(COMMANDS[c], argv) for c in sorted(COMMANDS) for argv in (["--help"], ["--bogus"])]
    code = (
        "import importlib, sys\n"
        f"for target, argv in {calls!r}:\n"
        "    module, function = target.split(':')\n"
        "    try:\n"
        "        getattr(importlib.import_module(module), function)(argv)\n"
        "    except SystemExit as exit:\n"
        "        print(target, argv, exit.code)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'numpy', 'keras_autoshuffle')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()  # the help texts, the exits, the imports
    exits = [line for line in lines if line.split(" ")[0] in COMMANDS.values()]
    imported = lines[-1]
    assert exits == [f"{target} {argv} {0 if argv == ['--help'] else 2}" for target, argv in calls]
    assert imported == "[]"
    assert result.stderr.count(": error: ") == len(COMMANDS)  # argparse's usage errors


def test_tensorflow_start_up_lines_are_filtered_by_level():
    from keras_autoshuffle import _startup

    text = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795890570.622023   17712 cudart_stub.cc:31] Could not find cuda drivers\n"
        "I0000 00:00:1795890570.715188   17712 cpu_feature_guard.cc:227] This TensorFlow ...\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild ...\n"
        "2025-09-17 14:44:05.157831: W external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] w\n"
        "E0000 00:00:1795890959.805583   20055 cuda_platform.cc:52] failed call to cuInit\n"
        "/x/y.py:3: UserWarning: a Python warning\n"
        "  warnings.warn('a Python warning')\n"
    )
    kept = _startup.filter_log_lines(text, 2)
    assert kept.splitlines() == [
        "E0000 00:00:1795890959.805583   20055 cuda_platform.cc:52] failed call to cuInit",
        "/x/y.py:3: UserWarning: a Python warning",
        "  warnings.warn('a Python warning')",
    ]
    assert "cudart_stub.cc:32] w" in _startup.filter_log_lines(text, 1)
    assert "cuInit" not in _startup.filter_log_lines(text, 3)
    assert _startup.running_as_command("/venv/bin/autoshuffle-train")
    assert _startup.running_as_command("C:\\venv\\Scripts\\autoshuffle-predict.exe")
    assert not _startup.running_as_command("/usr/bin/python3")
    assert not _startup.running_as_command("")


def test_quiet_stderr_filters_the_file_descriptor_and_keeps_a_failures_lines(capfd):
    from keras_autoshuffle._startup import quiet_stderr

    noise = b"I0000 00:00:1795890570.622023   17712 cudart_stub.cc:31] noise\n"
    with quiet_stderr(level=2):
        os.write(2, noise + b"kept\n")  # as C++ writes: past Python's sys.stderr
    assert capfd.readouterr().err == "kept\n"
    with pytest.raises(RuntimeError), quiet_stderr(level=2):
        os.write(2, noise)
        raise RuntimeError
    assert capfd.readouterr().err == noise.decode()  # a failure shows everything
    with quiet_stderr(level=0):
        os.write(2, noise)
    assert capfd.readouterr().err == noise.decode()


def test_quiet_runtime_filters_nothing_in_a_library_at_level_0(capfd, monkeypatch):
    # The module's rule: a library import at level 0 (or unset) has nothing filtered.
    from keras_autoshuffle._startup import quiet_runtime

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/python3"])
    notice = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"
    with quiet_runtime():
        os.write(2, notice)
    assert capfd.readouterr().err == notice.decode()
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    with quiet_runtime():
        os.write(2, notice)
    assert capfd.readouterr().err == ""


def test_quiet_stderr_in_overlapping_threads_restores_descriptor_2(capfd):
    import threading

    from keras_autoshuffle._startup import quiet_stderr

    before = os.fstat(2).st_ino
    first_in, second_in, first_out = (threading.Event() for _ in range(3))

    def first():
        with quiet_stderr(level=2):
            first_in.set()
            second_in.wait(timeout=0.5)  # unlocked, the second's block would start meanwhile
        first_out.set()

    def second():
        first_in.wait(timeout=5)
        with quiet_stderr(level=2):
            second_in.set()
            first_out.wait(timeout=0.5)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert os.fstat(2).st_ino == before
    os.write(2, b"still shown\n")
    assert capfd.readouterr().err == "still shown\n"


def test_messages_of_the_package_name_installed_commands_only():
    # The wheel holds no `scripts/`: a message sending users there names a missing file.
    named = set()
    for path in [*PACKAGE.rglob("*.py"), *CLI_PACKAGE.rglob("*.py")]:
        text = path.read_text()
        assert "scripts/" not in text, path
        named.update(re.findall(r"\bautoshuffle-[a-z-]*[a-z]", text))
    assert named and named <= set(COMMANDS), named - set(COMMANDS)


def test_the_training_command_offers_the_download_its_message_names(tmp_path):
    # prepared_builder's message for a missing CIFAR-10 says "this command with --download".
    from keras_autoshuffle import data

    with pytest.raises(data.DataMissingError, match="--download"):
        data.load("cifar10", data_dir=str(tmp_path))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        _entry_point("autoshuffle-train")(["--help"])
    assert "--download" in printed.getvalue()


def _copy_repository(target):
    """The repository without git, environments or build outputs."""
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "runs", ".*_cache"
    )
    shutil.copytree(ROOT, target, ignore=ignore)


@pytest.mark.slow
@pytest.mark.tensorflow_only(reason="the installed command imports TensorFlow")
def test_the_wheel_installs_alone_and_its_commands_run(tmp_path):
    source = tmp_path / "source"
    _copy_repository(source)
    wheels = tmp_path / "wheels"
    # --no-build-isolation: setuptools from this environment, nothing downloaded.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(source)],
        check=True,
        timeout=120,
    )
    (wheel,) = wheels.glob("keras_autoshuffle-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    packages = {PACKAGE.name, CLI_PACKAGE.name}
    assert top == {*packages, "keras_autoshuffle-0.1.0.dist-info"}, top
    package_files = {name for name in names if name.split("/")[0] in packages}
    expected = {
        path.relative_to(ROOT).as_posix()
        for package in (PACKAGE, CLI_PACKAGE)
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert package_files == expected  # every module and data file, nothing else
    entry_points = zipfile.ZipFile(wheel).read("keras_autoshuffle-0.1.0.dist-info/entry_points.txt")
    assert all(command.encode() in entry_points for command in COMMANDS)

    # A fresh environment whose dependencies are this interpreter's packages; its own
    # site-packages (holding the wheel) comes first on sys.path.
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    env_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = [p for p in site.getsitepackages() if os.path.isdir(p)]
    pathlib.Path(env_site, "dependencies.pth").write_text("\n".join(deps) + "\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    # --ignore-installed: a keras-autoshuffle seen through the .pth (e.g. an editable
    # install of this checkout) is neither uninstalled nor taken as the installed one.
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed"]
        + [str(wheel)],
        check=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    # One interpreter (TensorFlow is imported once): the import, then the installed
    # command's own file, run as its shell would run it.
    command = env_dir / "bin" / "autoshuffle-convert-weights"
    code = (
        "import runpy, sys, keras_autoshuffle, keras_autoshuffle.applications as a; "
        "print(keras_autoshuffle.__file__, a.ShuffleNetV2.__name__); "
        f"sys.argv = [{str(command)!r}, '--help']; "
        f"runpy.run_path({str(command)!r}, run_name='__main__')"
    )
    result = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, usage = result.stdout.split("\n", 1)
    assert first == f"{env_site}/keras_autoshuffle/__init__.py ShuffleNetV2"  # the wheel's
    assert usage.startswith("usage: autoshuffle-convert-weights ")


# --- autoshuffle-convert-weights: refusals without tracebacks, an atomic output (issue 39) ---

LEGACY_X0_5 = ROOT / "tests" / "fixtures" / "torch_checkpoints"
LEGACY_X0_5 = LEGACY_X0_5 / "torchvision_shufflenet_v2_x0_5_legacy.pth"


def _convert(*argv):
    """Runs the command in this process; returns its refusal's message (exit status 1)."""
    from keras_autoshuffle.commands import convert_weights

    with pytest.raises(SystemExit) as info:
        convert_weights.main([str(a) for a in argv])
    assert isinstance(info.value.code, str), info.value.code  # a message: status 1
    return info.value.code


def _with_entries(path, **changes):
    """The x0.5 fixture with some entries replaced (NumPy arrays), written in torch's zip
    format by the test writer of tests/test_torch_checkpoint.py."""
    from test_torch_checkpoint import Storage, ordered_dict, tensor, write_zip

    from keras_autoshuffle.applications import read_torch_checkpoint

    state = {**read_torch_checkpoint(LEGACY_X0_5), **changes}
    items, storages = [], []
    for i, (key, array) in enumerate(state.items()):
        array = np.array(array, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
        kind = {"f4": "FloatStorage", "i8": "LongStorage"}[array.dtype.str[1:]]
        storage = Storage(str(i), kind, array.reshape(-1).astype(array.dtype.newbyteorder("<")))
        strides = tuple(s // array.itemsize for s in array.strides)
        items.append((key, tensor(storage, 0, array.shape, strides)))
        storages.append(storage)
    return write_zip(path, ordered_dict(items), storages)


def test_convert_weights_refuses_outputs_it_cannot_write(tmp_path):
    # Each was a traceback from h5py or os after the checkpoint was read and converted.
    missing = tmp_path / "no" / "such" / "x.weights.h5"
    message = _convert(LEGACY_X0_5, missing)
    assert f"folder {missing.parent} does not exist" in message, message
    assert message.endswith(f"Received: output={str(missing)!r}")
    folder = tmp_path / "d.weights.h5"
    folder.mkdir()
    for extra in ([], ["--overwrite"]):
        message = _convert(LEGACY_X0_5, folder, *extra)
        assert f"The output {folder} is a folder" in message, message
    existing = tmp_path / "e.weights.h5"
    existing.write_bytes(b"old")
    assert "pass --overwrite" in _convert(LEGACY_X0_5, existing)
    assert existing.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == [
        "d.weights.h5",
        "e.weights.h5",
    ]


def test_convert_weights_refuses_a_classifier_of_no_classes(tmp_path):
    # A 0-d fc.weight was an IndexError, a (0, 1024) one a ValueError traceback from the
    # builder (classes=0), an integer stage-4 kernel a ValueError from the width check.
    fc = np.zeros((10, 1024), "f4")
    cases = {
        "scalar": ({"fc.weight": np.float32(1.0)}, "Received: fc.weight of shape ()"),
        "no classes": ({"fc.weight": fc[:0]}, "Received: fc.weight of shape (0, 1024)"),
        "features": ({"fc.weight": fc[:, :7]}, "Received: fc.weight of shape (10, 7)"),
        "integers": (
            {"conv5.0.weight": np.zeros((1024, 192, 1, 1), "i8")},
            "must hold floating-point numbers",
        ),
    }
    for label, (changes, expected) in cases.items():
        checkpoint = _with_entries(tmp_path / f"{label.replace(' ', '_')}.pth", **changes)
        output = tmp_path / "out.weights.h5"
        message = _convert(checkpoint, output)
        assert message.startswith(f"{checkpoint}: "), (label, message)
        assert expected in message, (label, message)
        assert not output.exists()


def test_convert_weights_writes_its_output_atomically(tmp_path, monkeypatch):
    import h5py
    import keras

    from keras_autoshuffle.commands import convert_weights

    output = tmp_path / "x0_5.weights.h5"
    output.write_bytes(b"the previous version")
    real_save = keras.Model.save_weights

    def full_disk(model, path, *args, **kwargs):
        real_save(model, path, *args, **kwargs)  # half written, then the disk is full
        with open(path, "r+b") as handle:
            handle.truncate(100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "save_weights", full_disk)
    message = _convert(LEGACY_X0_5, output, "--overwrite")
    assert f"Cannot write {output}" in message and "No space left" in message, message
    assert output.read_bytes() == b"the previous version"
    assert os.listdir(tmp_path) == [output.name]  # no temporary left
    monkeypatch.undo()
    assert convert_weights.main([str(LEGACY_X0_5), str(output), "--overwrite"]) == 0
    assert os.listdir(tmp_path) == [output.name]
    with h5py.File(output, "r") as handle:
        assert handle.attrs["keras_autoshuffle_padding"] == "torch"
