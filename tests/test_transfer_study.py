"""experiments.fashion_mnist_folder and experiments.transfer_study without training: the
folder writer on fake IDX files, the plan's refusal, the paired summary against a hand
computation, and resuming from tiny fake rows (the study itself runs outside CI)."""

import dataclasses
import gzip
import json
import os
import pathlib

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from experiments import fashion_mnist_folder as folders
from experiments import transfer_study as ts

TRAIN_PER_CLASS, TEST_PER_CLASS = 12, 6


def _write_idx(path, array):
    header = (0x800 + array.ndim).to_bytes(4, "big")
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    """Fake IDX files: random 28x28 images, labels 0..9 shuffled (12 training and 6 test
    images per class)."""
    folder = tmp_path_factory.mktemp("idx")
    rng = np.random.default_rng(0)
    arrays = {}
    for split, per in (("train", TRAIN_PER_CLASS), ("t10k", TEST_PER_CLASS)):
        labels = rng.permutation(np.repeat(np.arange(10), per)).astype(np.uint8)
        images = rng.integers(0, 256, (len(labels), 28, 28)).astype(np.uint8)
        _write_idx(folder / f"{split}-images-idx3-ubyte.gz", images)
        _write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels)
        arrays[split] = (images, labels)
    return str(folder), arrays


def _indices(output, split, name):
    return sorted(int(f.removesuffix(".png")) for f in os.listdir(output / split / name))


def test_the_folder_holds_the_chosen_images_pixel_for_pixel(tmp_path, idx_dir):
    data_dir, arrays = idx_dir
    output = tmp_path / "images"
    summary = folders.write_folder(output, (5, 7, 9), 4, 3, seed=1, data_dir=data_dir)
    assert summary["classes"] == ["Sandal", "Sneaker", "Ankle_boot"]
    assert summary["images"] == {
        "train": {"Sandal": 4, "Sneaker": 4, "Ankle_boot": 4},
        "val": {"Sandal": 3, "Sneaker": 3, "Ankle_boot": 3},
    }
    assert sorted(os.listdir(output)) == ["train", "val"]
    assert not os.path.exists(str(output) + ".partial")
    for split, source in (("train", "train"), ("val", "t10k")):
        images, labels = arrays[source]
        assert sorted(os.listdir(output / split)) == ["Ankle_boot", "Sandal", "Sneaker"]
        for label in (5, 7, 9):
            name = folders.CLASS_NAMES[label]
            for i in _indices(output, split, name):
                assert labels[i] == label  # each image in its class's folder
                with Image.open(output / split / name / f"{i}.png") as image:
                    assert image.mode == "L" and image.size == (28, 28)
                    np.testing.assert_array_equal(np.asarray(image), images[i])


def test_all_images_of_a_class_without_a_count(tmp_path, idx_dir):
    data_dir, arrays = idx_dir
    output = tmp_path / "all"
    folders.write_folder(output, (0, 1), data_dir=data_dir)
    for split, source, per in (("train", "train", TRAIN_PER_CLASS), ("val", "t10k", 6)):
        labels = arrays[source][1]
        assert _indices(output, split, "T-shirt_top") == list(np.flatnonzero(labels == 0))
        assert len(_indices(output, split, "Trouser")) == per


def test_the_seed_picks_the_training_images_and_not_the_validation_ones(tmp_path, idx_dir):
    data_dir, _ = idx_dir
    chosen = {}
    for name, per, seed in (("a", 5, 0), ("b", 5, 0), ("c", 5, 1), ("d", 2, 0)):
        folders.write_folder(tmp_path / name, (3, 4), per, 4, seed=seed, data_dir=data_dir)
        chosen[name] = {
            split: _indices(tmp_path / name, split, "Coat") for split in ("train", "val")
        }
    assert chosen["a"] == chosen["b"]  # seeded
    assert chosen["a"]["train"] != chosen["c"]["train"]  # another seed, other images
    assert chosen["a"]["val"] == chosen["c"]["val"] == chosen["d"]["val"]  # one val set
    assert set(chosen["d"]["train"]) < set(chosen["a"]["train"])  # nested sizes
    # A class's choice does not depend on the other classes written.
    folders.write_folder(tmp_path / "e", (4, 8), 5, 4, seed=0, data_dir=data_dir)
    assert _indices(tmp_path / "e", "train", "Coat") == chosen["a"]["train"]


def test_an_existing_folder_is_reused_when_equal_and_refused_otherwise(tmp_path, idx_dir):
    data_dir, _ = idx_dir
    output = tmp_path / "images"
    folders.write_folder(output, (5, 6), 3, 2, seed=0, data_dir=data_dir)
    before = sorted(os.walk(output))
    again = folders.write_folder(output, (5, 6), 3, 2, seed=0, data_dir=data_dir)
    assert again["reused"] and sorted(os.walk(output)) == before
    for changed in (dict(seed=1), dict(train_per_class=4), dict(classes=(5, 7))):
        arguments = dict(classes=(5, 6), train_per_class=3, val_per_class=2, seed=0)
        with pytest.raises(FileExistsError, match="does not hold exactly"):
            folders.write_folder(output, **{**arguments, **changed}, data_dir=data_dir)
    (output / "train" / "Sandal" / "extra.png").write_bytes(b"")
    with pytest.raises(FileExistsError):
        folders.write_folder(output, (5, 6), 3, 2, seed=0, data_dir=data_dir)


def test_a_killed_writers_partial_folder_is_replaced(tmp_path, idx_dir):
    data_dir, _ = idx_dir
    output = tmp_path / "images"
    leftover = tmp_path / "images.partial" / "train" / "Sandal"
    leftover.mkdir(parents=True)
    (leftover / "999.png").write_bytes(b"half")
    folders.write_folder(output, (5, 6), 2, 2, data_dir=data_dir)
    assert not (tmp_path / "images.partial").exists()
    assert len(_indices(output, "train", "Sandal")) == 2


def test_bad_arguments_are_refused(tmp_path, idx_dir):
    data_dir, _ = idx_dir
    for classes in ((5,), (5, 5), (5, 10), (-1, 2), (True, 2)):
        with pytest.raises(ValueError, match="classes"):
            folders.write_folder(tmp_path / "x", classes, data_dir=data_dir)
    with pytest.raises(ValueError, match="fewer than asked"):
        folders.write_folder(tmp_path / "x", (0, 1), TRAIN_PER_CLASS + 1, data_dir=data_dir)
    with pytest.raises(ValueError, match="train_per_class"):
        folders.write_folder(tmp_path / "x", (0, 1), 0, data_dir=data_dir)
    assert not (tmp_path / "x").exists()


def test_the_command_line_writes_the_folder(tmp_path, idx_dir, capsys):
    data_dir, _ = idx_dir
    argv = [str(tmp_path / "f"), "--classes", "5", "6", "--train-per-class", "2"]
    assert folders.main([*argv, "--val-per-class", "1", "--data-dir", data_dir]) == 0
    assert json.loads(capsys.readouterr().out)["images"]["val"] == {"Sandal": 1, "Shirt": 1}


# -- the study's plan -------------------------------------------------------------------


def test_a_plan_of_other_settings_is_refused_and_seeds_only_add_runs(tmp_path):
    settings = ts.Settings()
    ts.record_plan(settings, tmp_path)
    with pytest.raises(ts.PlanError, match=r"head_epochs=5 \(recorded: 3\)"):
        ts.check_plan(dataclasses.replace(settings, head_epochs=5), tmp_path)
    with pytest.raises(ts.PlanError, match="epochs="):
        ts.check_plan(dataclasses.replace(settings, epochs=(30, 13)), tmp_path)
    more = ts.check_plan(dataclasses.replace(settings, seeds=(7,)), tmp_path)
    assert more.seeds == (0, 1, 2, 3, 4, 7)
    assert ts.plan_id(more) == ts.plan_id(settings)  # seeds do not change what a run is


def test_rows_of_another_plan_are_refused(tmp_path):
    path = tmp_path / "rows.jsonl"
    ts.append_row(path, {"name": "backbone", "arm": "backbone", "plan": "a", "val_accuracy": 1})
    assert len(ts.read_rows(path, "a")) == 1
    with pytest.raises(ts.PlanError, match="another study"):
        ts.read_rows(path, "b")
    with open(path, "a") as f:
        f.write("not json\n")
    with pytest.raises(ts.PlanError, match="line 2 is not a row"):
        ts.read_rows(path, "a")


def test_settings_are_checked():
    for bad in (
        dict(epochs=(30,)),
        dict(per_class=(20, 20)),
        dict(seeds=()),
        dict(int8_per_class=50),
        dict(target_classes=(5,)),
    ):
        with pytest.raises(ValueError):
            ts.Settings(**bad)


def test_int8_at_several_sizes_and_the_one_size_plans_keep_their_id(tmp_path):
    both = ts.Settings(int8_per_class=(20, 100), end_to_end=False)
    int8 = [s["name"] for s in ts.specs(both) if ts.finetune_arguments(both, s, "w")["int8"]]
    assert int8 == [f"transfer_{n}_seed{seed}" for seed in range(5) for n in (20, 100)]
    with pytest.raises(SystemExit):  # the command refuses it before anything is written
        ts.main(["--int8-per-class", "20", "50", "--results", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match=r"Received: int8_per_class=\(20, 50\)"):
        ts.Settings(int8_per_class=(20, 50))
    # The committed study's plan (one size, an int) keeps its recorded id.
    root = pathlib.Path(__file__).resolve().parents[1]
    plan = json.loads((root / "docs/results/transfer/plan.json").read_text())
    assert ts.plan_id(ts.settings_from_json(plan["settings"])) == plan["plan"]


def test_the_arms_differ_only_in_weights_epochs_and_rate(tmp_path):
    settings = ts.Settings()
    spec = {"arm": "transfer", "per_class": 20, "seed": 3}
    transfer = ts.finetune_arguments(settings, spec, str(tmp_path))
    scratch = ts.finetune_arguments(settings, {**spec, "arm": "scratch"}, str(tmp_path))
    differ = {k for k in transfer if transfer[k] != scratch[k]}
    assert differ == {"weights", "epochs", "head_epochs", "learning_rate"}
    assert transfer["head_epochs"] + transfer["epochs"] == scratch["epochs"] == 20
    assert scratch["weights"] is None and scratch["head_epochs"] == 0
    assert transfer["weights"].endswith(os.path.join("backbone", "model.keras"))
    assert transfer["seed"] == scratch["seed"] == 3
    at_100 = ts.finetune_arguments(settings, {**spec, "per_class": 100}, str(tmp_path))
    # The int8 runs write every runtime's files (each one's int8 file checked).
    assert at_100["int8"] and not transfer["int8"]
    assert at_100["export_formats"] == ("litert", "onnx", "openvino")
    assert scratch["export_formats"] == ("litert",)
    e2e = ts.finetune_arguments(settings, {**spec, "arm": "end_to_end", "per_class": 100}, "w")
    assert e2e["export_formats"] == ("litert", "onnx", "openvino") and e2e["int8"]
    argv = ts.command_line("images", "out", e2e)
    assert argv[-5:] == ["--export-formats", "litert", "onnx", "openvino", "--int8"]


# -- the summary ------------------------------------------------------------------------


def _row(arm, per_class, seed, accuracy, plan="p", **extra):
    return {
        "name": ts.run_name(arm, per_class, seed),
        "arm": arm,
        "per_class": per_class,
        "seed": seed,
        "plan": plan,
        "val_accuracy": accuracy,
        "seconds": 10.0,
        "train_images": 100,
        "started": f"2026-01-01T00:0{seed or 0}:00+00:00",
        "ended": f"2026-01-01T00:0{seed or 0}:09+00:00",
        **extra,
    }


SCRATCH = (0.60, 0.62, 0.58, 0.61, 0.59)
DIFFS_20 = (0.05, 0.07, 0.02, 0.08, 0.03)  # transfer - scratch, by seed
DIFFS_100 = (0.01, -0.02, 0.00, 0.02, -0.01)


def _fake_rows():
    rows = [_row("backbone", None, None, 0.9)]
    for seed in range(5):
        rows.append(_row("scratch", 20, seed, SCRATCH[seed]))
        rows.append(_row("transfer", 20, seed, SCRATCH[seed] + DIFFS_20[seed]))
        rows.append(_row("scratch", 100, seed, SCRATCH[seed] + 0.2))
        int8 = {
            "accuracy": 0.8 - 0.001 * seed,
            "float_accuracy": 0.8,
            "top1_agreement": 0.99 + 0.001 * seed,
            "accuracy_drop_points": 0.1 * seed,
            "size_ratio": 3.0,
            "refused": None,
        }
        accuracy = SCRATCH[seed] + 0.2 + DIFFS_100[seed]
        rows.append(_row("transfer", 100, seed, accuracy, int8=int8))
    return rows


def _hand_interval(diffs_points):
    x = np.asarray(diffs_points)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def test_the_paired_difference_is_a_t_interval_over_seeds():
    summary = ts.summarize(_fake_rows(), ts.Settings())
    small, large = summary["sizes"]
    for entry, diffs in ((small, DIFFS_20), (large, DIFFS_100)):
        mean, low, high = _hand_interval([100 * d for d in diffs])
        assert entry["diff"]["n"] == 5 and entry["seeds"] == [0, 1, 2, 3, 4]
        assert entry["diff"]["mean"] == pytest.approx(mean)
        assert entry["diff"]["low"] == pytest.approx(low)
        assert entry["diff"]["high"] == pytest.approx(high)
    assert small["transfer"]["mean"] == pytest.approx(100 * np.mean(np.add(SCRATCH, DIFFS_20)))
    assert small["scratch"]["std"] == pytest.approx(100 * np.std(SCRATCH, ddof=1))
    assert (small["wins"], small["losses"]) == (5, 0)
    assert (large["wins"], large["losses"]) == (2, 2)
    assert ts.verdict(small).startswith("transfer helps")
    assert ts.verdict(large).startswith("transfer is not shown to help")
    hurts = {"diff": {"mean": -1.0, "low": -2.0, "high": -0.5}}
    assert ts.verdict(hurts).startswith("transfer hurts")
    # int8: the drop (points) and agreement (%) over the five runs.
    mean, low, high = _hand_interval([0.0, 0.1, 0.2, 0.3, 0.4])
    assert summary["int8"]["drop"]["mean"] == pytest.approx(mean)
    assert summary["int8"]["drop"]["low"] == pytest.approx(low)
    mean, low, high = _hand_interval([99.0, 99.1, 99.2, 99.3, 99.4])
    assert summary["int8"]["agreement"]["high"] == pytest.approx(high)
    assert summary["rows"] == 21 and summary["planned"] == 22  # no end-to-end row


def test_unpaired_runs_stay_out_of_the_difference():
    rows = [r for r in _fake_rows() if not (r["arm"] == "scratch" and r["seed"] == 4)]
    small = ts.summarize(rows, ts.Settings())["sizes"][0]
    mean, low, _ = _hand_interval([100 * d for d in DIFFS_20[:4]])
    assert small["seeds"] == [0, 1, 2, 3]
    assert small["diff"]["mean"] == pytest.approx(mean)
    assert small["diff"]["low"] == pytest.approx(low)


def test_the_page_shows_the_intervals_and_the_verdict(tmp_path):
    results = tmp_path / "results"
    plan = ts.record_plan(ts.Settings(), results)
    for row in _fake_rows():
        ts.append_row(results / ts.ROWS_FILE, {**row, "plan": plan["plan"]})
    page = tmp_path / "docs" / "transfer.md"
    ts.write_page(str(results), str(page))
    text = page.read_text()
    mean, low, high = _hand_interval([100 * d for d in DIFFS_20])
    assert f"transfer - scratch {mean:+.2f} points, 95% CI [{low:+.2f}, {high:+.2f}]" in text
    assert "transfer helps" in text and "transfer is not shown to help" in text
    assert "21 of 22 planned runs finished" in text
    assert "(../results/rows.jsonl)" in text
    assert "ended at chance" not in text
    ts.append_row(results / ts.ROWS_FILE, {**_row("scratch", 20, 5, 0.21), "plan": plan["plan"]})
    ts.write_page(str(results), str(page))
    assert "ended at chance** (validation accuracy within 2 points of 20%): scratch_20_seed5" in (
        page.read_text()
    )


def test_the_page_shows_the_command_a_user_runs_and_the_rows_commit(tmp_path):
    # Not the commands given so far (one with the machine's path), the rows' dates, nor
    # the history words a row's `code` may hold: those stay in plan.json and the rows.
    results = tmp_path / "results"
    page_path = "/work/x/transfer.md"  # a machine's path, on purpose
    given = f"python -m experiments.transfer_study --page {page_path}"
    plan = ts.record_plan(ts.Settings(), results, command=given)
    code = "87a292390e84754c7f58c76c3df6078921df5c9e (experiments/transfer_study.py at 9ea0fe2)"
    for row in _fake_rows():
        ts.append_row(results / ts.ROWS_FILE, {**row, "plan": plan["plan"], "code": code})
    page = tmp_path / "docs" / "transfer.md"
    ts.write_page(str(results), str(page))
    text = page.read_text()
    assert text.count("python -m experiments.transfer_study ") == 2  # the study; --summary
    assert "\npython -m experiments.transfer_study   # every run without a row" in text
    assert "- Code: commit 87a2923 (21 runs)" in text and "9ea0fe2" not in text
    assert "/work/x" not in text  # a machine's path, on purpose
    assert "2026-01-01" not in text and "load average" not in text
    other = ts.Settings(
        seeds=(0, 1), per_class=(20,), epochs=(5,), int8_per_class=20, end_to_end=False
    )
    assert ts.reproduce_command(other) == (
        "python -m experiments.transfer_study --seeds 0 1 --per-class 20 --epochs 5 "
        "--int8-per-class 20 --no-end-to-end"
    )
    assert "with uncommitted changes (2 runs)" in ts.code_commits({"abcdef1+dirty": 2})


# -- resuming ---------------------------------------------------------------------------


def _fake_runs(monkeypatch, work, fail=()):
    """subprocess.call in the study replaced by a fake worker: appends a row per run
    (writes a backbone file), or fails for the names in `fail`; returns the names run."""
    called = []

    def call(command):
        name = command[command.index("--worker") + 1]
        results = command[command.index("--results") + 1]
        called.append(name)
        if name in fail:
            return 1
        plan = ts.read_plan(results)
        spec = next(
            s for s in ts.specs(ts.settings_from_json(plan["settings"])) if s["name"] == name
        )
        row = _row(spec["arm"], spec["per_class"], spec["seed"], 0.5, plan=plan["plan"])
        if name == "backbone":
            os.makedirs(os.path.dirname(ts.backbone_path(work)), exist_ok=True)
            with open(ts.backbone_path(work), "wb") as f:
                f.write(b"weights")
            row["model_sha256"] = ts.file_digest(ts.backbone_path(work))
        row["files"] = {"litert": {"accuracy": 0.5, "top1_agreement": 1.0, "size_bytes": 1}}
        row.update(command="autoshuffle-finetune x", int8=None)
        ts.append_row(os.path.join(results, ts.ROWS_FILE), row)
        return 0

    monkeypatch.setattr(ts.subprocess, "call", call)
    return called


def test_a_rerun_trains_only_the_runs_without_a_row(tmp_path, monkeypatch):
    settings = ts.Settings(seeds=(0, 1), per_class=(20,), epochs=(2,), int8_per_class=20)
    results, work, page = str(tmp_path / "r"), str(tmp_path / "w"), str(tmp_path / "p.md")
    called = _fake_runs(monkeypatch, work, fail={"scratch_20_seed1"})
    assert ts.study(settings, results, work, page, log=lambda _: None) == 1
    assert called == [
        "backbone",
        "transfer_20_seed0",
        "scratch_20_seed0",
        "end_to_end_20_seed0",
        "transfer_20_seed1",
        "scratch_20_seed1",
    ]
    rows_path = os.path.join(results, ts.ROWS_FILE)
    before = open(rows_path).read()
    called = _fake_runs(monkeypatch, work)
    assert ts.study(settings, results, work, page, log=lambda _: None) == 0
    assert called == ["scratch_20_seed1"]
    after = open(rows_path).read()
    assert after.startswith(before)  # finished rows kept as they were, one row added
    assert len(after.splitlines()) == len(before.splitlines()) + 1
    called.clear()
    assert ts.study(settings, results, work, page, log=lambda _: None) == 0
    assert called == []  # nothing left
    assert "planned runs finished" not in open(page).read()  # finished: no such note


def test_a_worker_never_writes_a_second_row(tmp_path, monkeypatch):
    results = tmp_path / "r"
    plan = ts.record_plan(ts.Settings(), results)
    ts.append_row(results / ts.ROWS_FILE, _row("backbone", None, None, 0.9, plan=plan["plan"]))
    monkeypatch.setattr(ts, "run", lambda *_: pytest.fail("a finished run ran again"))
    assert ts.worker("backbone", str(results), str(tmp_path / "w")) == 0
    assert len(ts.read_rows(results / ts.ROWS_FILE)) == 1


def test_a_lost_backbone_stops_the_transfer_runs(tmp_path):
    work = str(tmp_path)
    os.makedirs(os.path.dirname(ts.backbone_path(work)))
    with open(ts.backbone_path(work), "wb") as f:
        f.write(b"one")
    rows = [_row("backbone", None, None, 0.9, model_sha256=ts.file_digest(ts.backbone_path(work)))]
    rows.append(_row("transfer", 20, 0, 0.5))
    ts.check_backbone(rows, work)  # the same file: fine
    with open(ts.backbone_path(work), "wb") as f:
        f.write(b"another")
    with pytest.raises(ts.PlanError, match="not .*backbone"):
        ts.check_backbone(rows, work)


def test_rows_are_committed_from_any_working_directory(tmp_path, monkeypatch):
    import subprocess

    repo = tmp_path / "repo"
    results = repo / "docs" / "results"
    results.mkdir(parents=True)
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "config", "user.email", "t@example.com"], check=True)
    subprocess.run([*git, "config", "user.name", "t"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    (repo / "other.txt").write_text("someone else's, staged")
    subprocess.run([*git, "add", "other.txt"], check=True)
    rows = results / ts.ROWS_FILE
    ts.append_row(rows, {"name": "backbone"})
    monkeypatch.chdir(tmp_path)  # not the repository
    assert ts.git_commit([str(rows)], "rows", log=pytest.fail)
    committed = subprocess.run(
        [*git, "show", "--name-only", "--format=%s"], capture_output=True, text=True
    ).stdout.split()
    assert committed == ["rows", "docs/results/rows.jsonl"]  # the staged file left staged
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout.splitlines() == ["A  other.txt"]
    assert ts.git_commit([str(rows)], "nothing new", log=pytest.fail, attempts=1)
