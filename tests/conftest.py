"""Shared test setup: two logical CPU devices, seeds, and a clean Keras state per test.

The suite runs on Keras's TensorFlow backend (the default). The backend-neutral modules'
tests also run under `KERAS_BACKEND=jax` (see .ci/run); tests marked `tensorflow_only`
are skipped there.
"""

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _usable_cpus():
    """The CPUs this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# Under xdist, the workers share the CPUs: each worker's TensorFlow (and every process a test
# starts, which inherits the variable) gets its share of them for one operation's threads
# instead of all of them. The tests' ops are small: on 2 busy cores two workers' threads
# contended for them (test_study.py's tiny study, two copies at once: 220 s each, 188 s
# with one thread each). Read when TensorFlow creates its first context, so set before
# any test runs an op.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = _usable_cpus() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(max(1, _share)))

import keras  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    import tensorflow as tf

    # Logical devices must be configured before TensorFlow initialises its devices, i.e.
    # at import time, before any test touches a tensor. Two CPUs let MirroredStrategy run
    # on this machine; everything else still runs on the first one.
    _cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    except RuntimeError:  # devices already initialised by another plugin/conftest
        pass


def pytest_terminal_summary(terminalreporter):
    """The CPU features the run's numbers may depend on, at the end of every log (CI's
    `-q` run included, which shows no header), so a failure on another machine names what
    differs. The suite must pass whatever they are (docs/guide/testing.md)."""
    from keras_autoshuffle._cpu import cpu_info

    flags = cpu_info()[1] or set()
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    lines = [
        "cpu features: " + " ".join(f"{name}={'yes' if name in flags else 'no'}" for name in wanted)
    ]
    if BACKEND == "tensorflow":
        try:  # private, hence guarded: only the header depends on it
            from tensorflow.python.util import _pywrap_util_port

            onednn = "on" if _pywrap_util_port.IsMklEnabled() else "off"
        except (ImportError, AttributeError):
            onednn = "unknown"
        lines.append(
            f"tensorflow oneDNN: {onednn} (TF_ENABLE_ONEDNN_OPTS="
            f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})"
        )
    try:  # OpenVINO picks its CPU precision from these features; the package pins f32
        import openvino

        default = openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()
        lines.append(f"openvino CPU default precision: {default} (the package compiles in f32)")
    except ImportError:
        pass
    for line in lines:
        terminalreporter.write_line(line)


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml): a worker per CPU this process may use, at most 4, each
    with its own TensorFlow (some 2 GB at its peak)."""
    return max(1, min(4, _usable_cpus()))


def pytest_configure(config):
    """`--dist loadfile` (pyproject.toml) hands the workers whole files in a queue, which
    xdist orders by the number of tests per file, most first: files of a few long tests
    (test_reproducible_training.py's two, some 2.5 minutes of CI; test_durability_kill.py's
    four children) came last, where one worker may run them alone after the other has
    finished. The queue's order is then `pytest_collection_modifyitems`'s below."""
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """Files holding a test marked `slow` first, then xdist's order (the most tests
    first); a file's tests keep their order. The long files start early, so the last
    ones handed out are short and both workers end at about the same time."""
    files = {}
    for item in items:
        files.setdefault(item.path, []).append(item)

    def key(path):
        tests = files[path]
        return (not any(item.get_closest_marker("slow") for item in tests), -len(tests))

    items[:] = [item for path in sorted(files, key=key) for item in files[path]]


def pytest_collection_finish(session):
    """Moves every object alive after collection (TensorFlow's, Keras's, the modules':
    some 400,000) out of the garbage collector's sight. `clear_session`, called before
    and after every test below, runs a full collection: 0.25 s each with them (the
    setup and teardown times of each test, some 3 minutes of a 430-test run), well
    under a millisecond without. Only what exists now is frozen: the tests' own objects
    are collected as before."""
    gc.collect()
    gc.freeze()


def pytest_addoption(parser):
    parser.addoption(
        "--lab",
        action="store_true",
        help="also run the tests marked `lab`: the lab scripts' (experiments/) runs end to end",
    )


def pytest_runtest_setup(item):
    # The lab scripts are outside the wheel; their end-to-end runs (about a fifth of the
    # suite's CPU) are run before their rows are committed, not by every change's CI:
    # keras-hub's `large` tests follow the same rule (docs/guide/testing.md).
    if item.get_closest_marker("lab") and not item.config.getoption("--lab"):
        pytest.skip("a lab script's end-to-end run (experiments/): `python -m pytest --lab -m lab`")
    if BACKEND != "tensorflow" and item.get_closest_marker("tensorflow_only"):
        reason = item.get_closest_marker("tensorflow_only").kwargs.get("reason")
        pytest.skip(f"TensorFlow backend only ({reason or 'uses TensorFlow APIs'})")


@pytest.fixture(autouse=True)
def _clean_keras_state():
    """Seeds every RNG and resets Keras's global state before and after each test."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(1234)
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.config.set_image_data_format("channels_last")
    keras.backend.clear_session()
    # What survived the collection (the backends' caches of traced and compiled
    # functions, which grow test by test: JAX's made each collection 0.3-0.9 s late in
    # a run) is frozen too; the next test's garbage is collected as before.
    gc.freeze()


@pytest.fixture
def two_cpus():
    """Names of the two logical CPU devices set up above."""
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 2:
        pytest.fail(f"expected two logical CPU devices (TF initialised too early?): {devices}")
    return devices[:2]
