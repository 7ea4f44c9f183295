"""The installed commands (`[project.scripts]`) and the wheel.

The wheel test builds the wheel from a copy of the repository, installs it alone into a
fresh virtual environment (its dependencies come from the running interpreter's
site-packages through a `.pth` file; nothing is downloaded) and runs an installed
command there.
"""

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

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_autoshuffle"
COMMANDS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _entry_point(command):
    module, function = COMMANDS[command].split(":")
    return getattr(importlib.import_module(module), function)


def test_the_commands_are_the_documented_ones():
    assert set(COMMANDS) == {
        "autoshuffle-train",
        "autoshuffle-train-imagenet",
        "autoshuffle-convert-weights",
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_answers_help(command):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exit:
        _entry_point(command)(["--help"])
    assert exit.value.code == 0
    assert printed.getvalue().startswith("usage: ") and "--" in printed.getvalue()


def test_messages_of_the_package_name_installed_commands_only():
    # The wheel holds no `scripts/`: a message sending users there names a missing file.
    named = set()
    for path in PACKAGE.rglob("*.py"):
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
    assert top == {"keras_autoshuffle", "keras_autoshuffle-0.1.0.dist-info"}, top
    package_files = {name for name in names if name.startswith("keras_autoshuffle/")}
    expected = {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
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
