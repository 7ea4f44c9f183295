"""Does fine-tuning a pretrained base beat training from scratch on a few real images?

    python -m experiments.transfer_study --git-commit      # runs (resuming), writes the page
    python -m experiments.transfer_study --summary         # the page from the rows so far

Fashion-MNIST written as folders of PNG files (`experiments.fashion_mnist_folder`), run
through `keras_autoshuffle.finetuning.finetune` (the `autoshuffle-finetune` command's
function), ShuffleNet v2 at `width`, `image_size` pixels:

1. the backbone: one network trained from scratch on classes 0-4 (T-shirt/top, Trouser,
   Pullover, Dress, Coat), all their training images (validation: test images of those
   classes). One backbone, one seed: the study measures fine-tuning it, not the spread
   of backbones.
2. classes 5-9 (Sandal, Shirt, Sneaker, Bag, Ankle boot), none seen by the backbone, with
   `per_class` training images per class (20 and 100), for each seed (the seed picks the
   training images and is the run's seed); one validation set of `val_per_class` test
   images per class for every run. Two arms on each (size, seed):
   - `transfer`: `finetune(weights=<the backbone's model.keras>)`: `head_epochs` epochs of
     the new head alone, then `epochs` of the whole net (BatchNormalization frozen),
     finetune's defaults for pretrained weights (learning rate 0.01, the head's 10x);
   - `scratch`: the same network from random weights (`weights=None`) for the same total
     number of epochs (`head_epochs + epochs`), finetune's default learning rate from
     scratch (0.1).
   Everything else is equal (folder, batch, label smoothing, class weights, flips, seed).
3. the transfer arm at the `int8_per_class` size(s) also exports the full-integer files
   of LiteRT, ONNX and OpenVINO (`int8=True`, finetune's default int8 settings): each
   one's accuracy drop and top-1 agreement against its float file.
4. one end-to-end run of the command itself on the seed's first folder at the largest
   `int8_per_class` (`autoshuffle-finetune ... --export-formats litert onnx openvino
   --int8`, the transfer arm's settings): each exported file's validation accuracy.

Each run is its own process and appends its row to `<results>/rows.jsonl` (JSON lines)
when it ends; a rerun trains only the runs without a row and never rewrites a row. The
settings are recorded in `<results>/plan.json` before the first run; a rerun with other
settings is refused (seeds only add runs). A killed run resumes from its last finished
epoch (finetune's own guarantee), its folders and models kept under `--work` (not in
git). `--git-commit` commits the rows and the page after every run.
"""

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

from experiments import fashion_mnist_folder as folders
from experiments.scale_study import append_row  # one JSON line, locked and flushed

RESULTS = os.path.join("docs", "results", "transfer")
WORK = os.path.join("runs", "transfer")
PAGE = os.path.join("docs", "evidence", "transfer.md")
ROWS_FILE, PLAN_FILE = "rows.jsonl", "plan.json"
# experiments.int8_transfer_levers' rows, beside the study's.
LEVERS_FILE = "levers.jsonl"
# experiments.int8_qat's rows: the quantization-aware lever and its paired defaults.
QAT_FILE = "qat.jsonl"
# experiments.int8_margins' rows: agreement by the float net's top-1 margin.
MARGINS_FILE = "margins.jsonl"
# {summary key: file} of the int8 measurements on a study's nets that its page shows.
INT8_FILES = {"int8_levers": LEVERS_FILE, "int8_qat": QAT_FILE, "int8_margins": MARGINS_FILE}
ARMS = ("backbone", "transfer", "scratch", "end_to_end")
# finetune's report: each runtime's int8 check.
INT8_REPORT_KEYS = {"litert": "int8", "onnx": "onnx_int8", "openvino": "openvino_int8"}
# A study's rows are a few kB each: more than this is not a rows file.
MAX_ROWS_BYTES = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the study runs (every field but `seeds` defines its runs)."""

    backbone_classes: tuple = (0, 1, 2, 3, 4)
    target_classes: tuple = (5, 6, 7, 8, 9)
    width: float = 0.5
    image_size: int = 32
    batch_size: int = 32
    backbone_epochs: int = 2
    # None: every training image of the backbone's classes (6,000 each).
    backbone_train_per_class: int | None = None
    backbone_val_per_class: int | None = 300
    # finetune's default from scratch.
    backbone_learning_rate: float = 0.1
    per_class: tuple = (20, 100)
    # The transfer arm's whole-net epochs at each size of `per_class`; the scratch arm
    # trains `head_epochs` more (the same total).
    epochs: tuple = (17, 7)
    head_epochs: int = 3
    # finetune's defaults: pretrained (the head phase 10x), and from scratch.
    transfer_learning_rate: float = 0.01
    scratch_learning_rate: float = 0.1
    label_smoothing: float = 0.1
    class_weights: str | None = "balanced"
    flip: bool = True
    val_per_class: int | None = 100
    # Picks the validation images, the same for every run.
    val_seed: int = 0
    # The size (or tuple of sizes) whose transfer runs also export int8 (None: none); the
    # end-to-end run's is the largest.
    int8_per_class: int | tuple | None = 100
    end_to_end: bool = True
    seeds: tuple = (0, 1, 2, 3, 4)

    def __post_init__(self):
        folders.check_classes(self.backbone_classes)
        folders.check_classes(self.target_classes)
        for name in ("per_class", "epochs", "seeds"):
            values = getattr(self, name)
            if not values or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= (name != "seeds")
                for v in values
            ):
                raise ValueError(
                    f"`{name}` must be a non-empty tuple of "
                    f"{'non-negative' if name == 'seeds' else 'positive'} integers. "
                    f"Received: {name}={values!r}"
                )
        if len(self.epochs) != len(self.per_class) or len(set(self.per_class)) != len(
            self.per_class
        ):
            raise ValueError(
                "`epochs` gives the epochs of each size of `per_class` (distinct sizes). "
                f"Received: per_class={self.per_class!r}, epochs={self.epochs!r}"
            )
        sizes = int8_sizes(self)
        if not all(n in self.per_class for n in sizes) or len(set(sizes)) != len(sizes):
            raise ValueError(
                "`int8_per_class` must be one of `per_class`, a tuple of distinct ones, or None. "
                f"Received: int8_per_class={self.int8_per_class!r}"
            )
        if self.end_to_end and not sizes:
            raise ValueError("The end-to-end run uses `int8_per_class`: set it, or end_to_end.")


def int8_sizes(settings):
    """The sizes whose transfer runs export int8, a tuple (empty for None)."""
    value = settings.int8_per_class
    if value is None:
        return ()
    return tuple(value) if isinstance(value, tuple | list) else (value,)


# Settings that only add runs: a study unites the recorded ones with those given.
RUN_ADDING = ("seeds",)


def run_defining(settings):
    """The settings that define the runs, as JSON values."""
    values = json.loads(json.dumps(dataclasses.asdict(settings)))
    return {k: v for k, v in values.items() if k not in RUN_ADDING}


def plan_id(settings):
    """A short digest of the run-defining settings, recorded in every row."""
    text = json.dumps(run_defining(settings), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def settings_from_json(values):
    """`Settings` from the JSON of `dataclasses.asdict` (lists back to tuples)."""
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"Unknown settings {unknown}: a plan of another version of the study.")
    return Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


class PlanError(RuntimeError):
    """The results folder holds a study of other settings, or rows that do not belong."""


def check_plan(settings, results):
    """`settings` with the recorded seeds united in, refused (PlanError) where a
    run-defining setting differs from `results/plan.json`'s; `settings` where none."""
    path = os.path.join(results, PLAN_FILE)
    if not os.path.exists(path):
        return settings
    with open(path) as f:
        recorded = json.load(f)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("settings"), dict):
        raise PlanError(f"{path} is not a transfer study's plan (no 'settings' dict).")
    old = settings_from_json(recorded["settings"])
    mine, theirs = run_defining(settings), run_defining(old)
    differ = [f"{k}={mine[k]!r} (recorded: {theirs[k]!r})" for k in mine if mine[k] != theirs[k]]
    if differ:
        raise PlanError(
            f"{results} holds a study run with other settings; its page would mix two "
            "studies. Use the recorded values or another --results. Received: " + ", ".join(differ)
        )
    seeds = tuple(dict.fromkeys((*old.seeds, *settings.seeds)))
    return dataclasses.replace(settings, seeds=seeds)


def record_plan(settings, results, command=None):
    """Writes `results/plan.json` (atomically) before any run: the settings, their id, the
    machine and the commands given so far."""
    os.makedirs(results, exist_ok=True)
    path = os.path.join(results, PLAN_FILE)
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    commands = list(old.get("commands", []))
    if command and command not in commands:
        commands.append(command)
    plan = {
        "settings": dataclasses.asdict(settings),
        "plan": plan_id(settings),
        "runs": [spec["name"] for spec in specs(settings)],
        "commands": commands,
        "created": old.get("created", _now()),
        "cpu": old.get("cpu", cpu_name()),
    }
    temporary = path + ".partial"
    with open(temporary, "w") as f:
        json.dump(plan, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    return plan


def read_plan(results):
    path = os.path.join(results, PLAN_FILE)
    if not os.path.exists(path):
        raise PlanError(f"{results} holds no {PLAN_FILE}: no study was started there.")
    with open(path) as f:
        return json.load(f)


def _now():
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def cpu_name():
    """The CPU (`finetuning.metrics.cpu_name`: its model and speed features) and the cores."""
    from keras_autoshuffle.finetuning.metrics import cpu_name as name

    return f"{name()}, {os.cpu_count()} cores"


# -- the runs ---------------------------------------------------------------------------


def run_name(arm, per_class=None, seed=None):
    return "backbone" if arm == "backbone" else f"{arm}_{per_class}_seed{seed}"


def specs(settings):
    """Every run, in the order run: the backbone, then seed by seed each size's transfer
    and scratch runs (partial results stay paired), the end-to-end run after the first
    seed's."""
    runs = [{"name": "backbone", "arm": "backbone", "per_class": None, "seed": None}]
    for i, seed in enumerate(settings.seeds):
        for n in settings.per_class:
            for arm in ("transfer", "scratch"):
                runs.append({"name": run_name(arm, n, seed), "arm": arm, "per_class": n})
                runs[-1]["seed"] = seed
        if i == 0 and settings.end_to_end:
            n = max(int8_sizes(settings))
            runs.append(
                {"name": run_name("end_to_end", n, seed), "arm": "end_to_end", "per_class": n}
            )
            runs[-1]["seed"] = seed
    return runs


def epochs_of(settings, arm, per_class):
    """(head epochs, whole-net epochs) of a run."""
    if arm == "backbone":
        return 0, settings.backbone_epochs
    epochs = settings.epochs[settings.per_class.index(per_class)]
    if arm == "scratch":
        return 0, settings.head_epochs + epochs
    return settings.head_epochs, epochs


def folder_of(work, per_class=None, seed=None):
    name = "backbone" if per_class is None else f"target_{per_class}_seed{seed}"
    return os.path.join(work, "folders", name)


def write_images(settings, work, per_class=None, seed=None):
    """The run's image folder (written once, then reused: `write_folder` checks it)."""
    os.makedirs(os.path.join(work, "folders"), exist_ok=True)
    if per_class is None:
        return folders.write_folder(
            folder_of(work),
            settings.backbone_classes,
            settings.backbone_train_per_class,
            settings.backbone_val_per_class,
            seed=0,
            val_seed=settings.val_seed,
        )
    return folders.write_folder(
        folder_of(work, per_class, seed),
        settings.target_classes,
        per_class,
        settings.val_per_class,
        seed=seed,
        val_seed=settings.val_seed,
    )


def backbone_path(work):
    return os.path.join(work, "runs", "backbone", "model.keras")


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def finetune_arguments(settings, spec, work):
    """finetune's keyword arguments for a run (besides the folder and output)."""
    head, epochs = epochs_of(settings, spec["arm"], spec["per_class"])
    pretrained = spec["arm"] in ("transfer", "end_to_end")
    if spec["arm"] == "backbone":
        rate = settings.backbone_learning_rate
    else:
        rate = settings.transfer_learning_rate if pretrained else settings.scratch_learning_rate
    int8 = spec["arm"] == "end_to_end" or (
        spec["arm"] == "transfer" and spec["per_class"] in int8_sizes(settings)
    )
    # Every run writes its LiteRT file (finetune checks it against Keras and measures its
    # accuracy; export_formats=() fails in finetune at this commit); the int8 runs all three
    # runtimes' files (each one's int8 file is checked against its float file).
    formats = ("litert", "onnx", "openvino") if int8 else ("litert",)
    return dict(
        width=settings.width,
        weights=os.path.abspath(backbone_path(work)) if pretrained else None,
        image_size=settings.image_size,
        epochs=epochs,
        head_epochs=head,
        batch_size=settings.batch_size,
        learning_rate=rate,
        label_smoothing=settings.label_smoothing,
        class_weights=settings.class_weights,
        flip=settings.flip,
        seed=0 if spec["seed"] is None else spec["seed"],
        export_formats=formats,
        int8=int8,
    )


def command_line(images, output, arguments):
    """The `autoshuffle-finetune` arguments equal to `finetune(images, output, **arguments)`."""
    argv = [images, "--output", output]
    for key in ("width", "image_size", "epochs", "head_epochs", "batch_size", "learning_rate"):
        argv += [f"--{key.replace('_', '-')}", str(arguments[key])]
    argv += ["--weights", "none" if arguments["weights"] is None else arguments["weights"]]
    argv += ["--label-smoothing", str(arguments["label_smoothing"])]
    argv += ["--class-weights", str(arguments["class_weights"]).lower()]
    argv += ["--seed", str(arguments["seed"])]
    if not arguments["flip"]:
        argv.append("--no-flip")
    if arguments["export_formats"]:
        argv += ["--export-formats", *arguments["export_formats"]]
    if arguments["int8"]:
        argv.append("--int8")
    return argv


def run(settings, spec, work):
    """Trains one run (resuming a killed one) and returns its row."""
    from keras_autoshuffle.finetuning import finetune

    start, started = time.time(), _now()
    images = write_images(settings, work, spec["per_class"], spec["seed"])
    output = os.path.join(work, "runs", spec["name"])
    resumed = os.path.exists(output)
    arguments = finetune_arguments(settings, spec, work)
    report_path = os.path.join(output, "report.json")
    argv = command_line(images["output"], output, arguments)
    if arguments["weights"] is not None and not os.path.exists(arguments["weights"]):
        raise PlanError(f"The backbone {arguments['weights']} is missing: run it first.")
    if os.path.exists(report_path):  # finished, killed before its row was written
        with open(report_path) as f:
            report = json.load(f)
    elif spec["arm"] == "end_to_end":  # the command itself
        from keras_autoshuffle.commands import finetune as command

        code = command.main([*argv, "--verbose", "2"])
        if code:
            raise RuntimeError(f"autoshuffle-finetune exited with status {code}")
        with open(report_path) as f:
            report = json.load(f)
    else:
        report = finetune(images["output"], output, verbose=2, **arguments)
    head, epochs = epochs_of(settings, spec["arm"], spec["per_class"])
    row = {
        "name": spec["name"],
        "arm": spec["arm"],
        "per_class": spec["per_class"],
        "seed": spec["seed"],
        "plan": plan_id(settings),
        "train_images": report["data"]["train_examples"],
        "val_images": report["data"]["val_examples"],
        "classes": report["data"]["classes"],
        "base_weights": report["settings"].get("base_weights"),
        "head_epochs": head,
        "epochs": epochs,
        "total_epochs": head + epochs,
        "learning_rate": arguments["learning_rate"],
        "val_accuracy": report["validation"]["accuracy"],
        "per_class_accuracy": {
            entry["name"]: entry["accuracy"] for entry in report["validation"]["per_class"]
        },
        "files": {
            fmt: {k: v for k, v in entry.items() if k in ("accuracy", "top1_agreement")}
            | {"size_bytes": entry.get("size_bytes")}
            for fmt, entry in report.get("files", {}).items()
        },
        "int8": int8_fields(report.get("int8")),
        # Each runtime's int8 check (LiteRT's is "int8" above too).
        "int8_runtimes": {
            runtime: int8_fields(report.get(key))
            for runtime, key in INT8_REPORT_KEYS.items()
            if report.get(key)
        },
        "seconds": time.time() - start,
        "resumed": resumed,
        "started": started,
        "ended": _now(),
        "cpu": cpu_name(),
        "code": code_version(),
        "load_average": list(os.getloadavg()),
        "history": phase_histories(output),
        "command": "autoshuffle-finetune " + " ".join(_relative(a) for a in argv),
    }
    if spec["arm"] == "backbone":
        row["model_sha256"] = file_digest(backbone_path(work))
    return row


def phase_histories(output):
    """Each phase's per-epoch training loss, validation loss and accuracy, from its
    history.csv: `{"train_head"|"train_all": {"loss": [...], ...}}` (phases found)."""
    import csv

    histories = {}
    for phase in ("train_head", "train_all"):
        path = os.path.join(output, phase, "history.csv")
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            epochs = list(csv.DictReader(f))
        histories[phase] = {
            key: [float(epoch[key]) for epoch in epochs if epoch.get(key)]
            for key in ("loss", "val_loss", "val_accuracy")
        }
    return histories


def code_version():
    """The commit of the code that ran: $TRANSFER_STUDY_CODE (a snapshot's, set by whoever
    ran the study from one), else this checkout's HEAD, "+dirty" with uncommitted changes."""
    if os.environ.get("TRANSFER_STUDY_CODE"):
        return os.environ["TRANSFER_STUDY_CODE"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def _root():
    """Where the page's paths are relative to: $TRANSFER_STUDY_ROOT, else the working
    directory."""
    return os.environ.get("TRANSFER_STUDY_ROOT") or os.getcwd()


def _relative(argument):
    """Paths under the root (`_root`) as relative ones (the page's commands)."""
    root = _root()
    if os.path.isabs(argument) and argument.startswith(root + os.sep):
        return os.path.relpath(argument, root)
    return argument


def int8_fields(entry):
    """The int8 check's numbers (None without int8): accuracies, drop in points (float -
    int8), top-1 agreement, size ratio, and why the file was refused, if it was."""
    if not entry:
        return None
    fields = {
        k: entry.get(k)
        for k in (
            "accuracy",
            "float_accuracy",
            "top1_agreement",
            "size_ratio",
            "test_examples",
            "max_accuracy_drop",
        )
    }
    if entry.get("accuracy") is not None and entry.get("float_accuracy") is not None:
        fields["accuracy_drop_points"] = 100 * (entry["float_accuracy"] - entry["accuracy"])
    fields["refused"] = entry.get("refused")
    return fields


# -- rows -------------------------------------------------------------------------------


def read_rows(path, plan=None):
    """The rows of a rows file, the first of each name (a later duplicate is ignored);
    PlanError naming the line for anything not a row, or a row of another plan."""
    if not os.path.exists(path):
        return []
    if os.path.getsize(path) > MAX_ROWS_BYTES:
        raise PlanError(f"{path} is over {MAX_ROWS_BYTES} bytes: not a rows file")
    rows, names = [], set()
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not {"name", "arm", "plan", "val_accuracy"} <= set(row):
                raise PlanError(f"{path} line {number} is not a row. Received: {line[:120]}")
            if plan is not None and row["plan"] != plan:
                raise PlanError(
                    f"{path} line {number} is a row of another study (plan {row['plan']}, "
                    f"this one {plan}); use another --results."
                )
            if row["name"] not in names:
                names.add(row["name"])
                rows.append(row)
    return rows


def runs_to_do(settings, rows):
    """The runs of `settings` without a row."""
    done = {row["name"] for row in rows}
    return [spec for spec in specs(settings) if spec["name"] not in done]


def check_backbone(rows, work):
    """Refuses to go on where the backbone the rows were fine-tuned from is not the one
    in `work` (a lost or retrained backbone: its transfer rows would mix two)."""
    backbone = [row for row in rows if row["arm"] == "backbone"]
    if not backbone:
        return
    path = backbone_path(work)
    if len(rows) == 1 and not os.path.exists(path):
        return
    digest = file_digest(path) if os.path.exists(path) else None
    if digest != backbone[0].get("model_sha256"):
        raise PlanError(
            f"The backbone the rows were fine-tuned from ({backbone[0].get('model_sha256')}) "
            f"is not {path} ({digest or 'missing'}); the transfer runs cannot go on from it. "
            "Use the --work folder of the recorded runs, or start another --results."
        )


# -- the study --------------------------------------------------------------------------


def git_commit(paths, message, log=print, attempts=5):
    """`git add` and `git commit -- paths`; retried while another git holds the index lock,
    never fatal (the rows stay on disk)."""
    error = ""
    paths = [os.path.abspath(path) for path in paths]
    git = ["git", "-C", os.path.dirname(paths[0])]  # the repository of the rows
    for attempt in range(attempts):
        add = subprocess.run([*git, "add", "--", *paths], capture_output=True, text=True)
        if add.returncode == 0:
            commit = subprocess.run(
                [*git, "commit", "-q", "-m", message, "--", *paths],
                capture_output=True,
                text=True,
            )
            said = commit.stdout + commit.stderr
            if commit.returncode == 0 or "nothing" in said or "no changes" in said:
                return True
            error = said
        else:
            error = add.stderr
        time.sleep(2 + 3 * attempt)
    log(f"git commit failed (left for later): {error[-300:]}")
    return False


def study(settings, results, work, page, commit=False, log=print, command=None, only=None):
    """Runs every run without a row (of `only`, names or arms, where given), one process
    at a time, and rewrites the page after each; returns 0, or the exit status of a failed
    run (the study stops there)."""
    settings = check_plan(settings, results)
    plan = record_plan(settings, results, command)
    rows_path = os.path.join(results, ROWS_FILE)
    check_backbone(read_rows(rows_path, plan["plan"]), work)
    todo = runs_to_do(settings, read_rows(rows_path, plan["plan"]))
    if only:
        todo = [spec for spec in todo if spec["name"] in only or spec["arm"] in only]
    log(f"{len(todo)} of {len(specs(settings))} runs to do")
    for spec in todo:
        log(f"{_now()} {spec['name']}")
        worker = [sys.executable, "-m", "experiments.transfer_study", "--worker", spec["name"]]
        code = subprocess.call([*worker, "--results", results, "--work", work])
        rows = read_rows(rows_path, plan["plan"])
        if code or spec["name"] not in {row["name"] for row in rows}:
            log(f"{spec['name']} failed (exit status {code}); rerun to resume it")
            return code or 1
        row = next(r for r in rows if r["name"] == spec["name"])
        log(f"  val accuracy {row['val_accuracy']:.4f}, {row['seconds']:.0f} s")
        write_page(results, page, work)
        if commit:
            git_commit(
                [rows_path, os.path.join(results, PLAN_FILE), page],
                f"transfer study: row {spec['name']} (val accuracy {row['val_accuracy']:.4f})",
                log,
            )
    write_page(results, page, work)
    return 0


def worker(name, results, work):
    """One run of the recorded plan, its row appended to the rows file."""
    plan = read_plan(results)
    settings = settings_from_json(plan["settings"])
    spec = next((s for s in specs(settings) if s["name"] == name), None)
    if spec is None:
        raise PlanError(f"{name} is not a run of {results}'s plan.")
    rows_path = os.path.join(results, ROWS_FILE)
    if name in {row["name"] for row in read_rows(rows_path, plan["plan"])}:
        return 0  # never a second row
    row = run(settings, spec, work)
    append_row(rows_path, row)
    return 0


# -- the summary ------------------------------------------------------------------------


def t_interval(values):
    """Mean and 95% Student-t interval (experiments.study._t_interval); None bounds for
    fewer than two values."""
    from experiments.study import _t_interval

    values = np.asarray(values, dtype=np.float64)
    low, high = _t_interval(values)
    return {"n": int(values.size), "mean": float(values.mean()), "low": low, "high": high}


def _spread(values):
    values = np.asarray(values, dtype=np.float64)
    return {
        "n": int(values.size),
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if values.size > 1 else None,
    }


def summarize(rows, settings):
    """Per size: each arm's accuracy over seeds (points), the paired difference transfer
    - scratch with its 95% t interval, wins/losses; the int8 check's drop and agreement;
    the backbone and end-to-end rows; the time."""
    by = {(r["arm"], r["per_class"], r["seed"]): r for r in rows}
    sizes = []
    for n in settings.per_class:
        arms = {
            arm: {seed: by[arm, n, seed] for seed in settings.seeds if (arm, n, seed) in by}
            for arm in ("transfer", "scratch")
        }
        paired = sorted(set(arms["transfer"]) & set(arms["scratch"]))
        diffs = [
            100 * (arms["transfer"][s]["val_accuracy"] - arms["scratch"][s]["val_accuracy"])
            for s in paired
        ]
        entry = {"per_class": n, "seeds": paired}
        for arm, runs in arms.items():
            accuracies = [100 * r["val_accuracy"] for r in runs.values()]
            entry[arm] = _spread(accuracies) if accuracies else None
            entry[arm + "_seconds"] = (
                float(np.mean([r["seconds"] for r in runs.values()])) if runs else None
            )
        entry["epochs"] = {arm: epochs_of(settings, arm, n) for arm in ("transfer", "scratch")}
        entry["diff"] = t_interval(diffs) if diffs else None
        entry["diffs"] = dict(zip(paired, diffs, strict=True))
        entry["wins"] = int(sum(d > 0 for d in diffs))
        entry["losses"] = int(sum(d < 0 for d in diffs))
        sizes.append(entry)
    int8_rows = [
        r for r in rows if r["arm"] == "transfer" and r.get("int8") and r["seed"] in settings.seeds
    ]
    int8 = None
    if int8_rows:
        int8 = {
            "per_class": settings.int8_per_class,
            "drop": t_interval([r["int8"]["accuracy_drop_points"] for r in int8_rows]),
            "agreement": t_interval([100 * r["int8"]["top1_agreement"] for r in int8_rows]),
            "int8_accuracy": _spread([100 * r["int8"]["accuracy"] for r in int8_rows]),
            "float_accuracy": _spread([100 * r["int8"]["float_accuracy"] for r in int8_rows]),
            "size_ratio": float(np.mean([r["int8"]["size_ratio"] for r in int8_rows])),
            "refused": sum(bool(r["int8"].get("refused")) for r in int8_rows),
            # The check's bound, where the rows record it (the rows since issue 53's policy).
            "bound": max((r["int8"].get("max_accuracy_drop") or 0 for r in int8_rows), default=0)
            or None,
            "by_seed": {
                r["seed"]: (r["int8"]["accuracy_drop_points"], 100 * r["int8"]["top1_agreement"])
                for r in int8_rows
            },
        }
    times = [r["seconds"] for r in rows]
    starts = [r["started"] for r in rows if r.get("started")]
    ends = [r["ended"] for r in rows if r.get("ended")]
    return {
        "sizes": sizes,
        "int8": int8,
        "backbone": next((r for r in rows if r["arm"] == "backbone"), None),
        "end_to_end": next((r for r in rows if r["arm"] == "end_to_end"), None),
        "run_seconds": float(np.sum(times)) if times else 0.0,
        "first_start": min(starts) if starts else None,
        "last_end": max(ends) if ends else None,
        "rows": len(rows),
        "planned": len(specs(settings)),
    }


def verdict(entry):
    """A sentence on one size's paired difference."""
    diff = entry["diff"]
    if diff is None or diff["low"] is None:
        return "too few paired seeds for an interval"
    if diff["low"] > 0:
        return "transfer helps: its interval lies above 0"
    if diff["high"] < 0:
        return "transfer hurts: its interval lies below 0"
    return "transfer is not shown to help: the interval includes 0"


def _interval(stat, digits=2, signed=True):
    if stat is None:
        return "-", "-"
    sign = "+" if signed else ""
    mean = f"{stat['mean']:{sign}.{digits}f}"
    if stat["low"] is None:
        return mean, "-"
    return mean, f"[{stat['low']:{sign}.{digits}f}, {stat['high']:{sign}.{digits}f}]"


def _mean_sd(stat):
    if stat is None:
        return "-"
    if stat["std"] is None:
        return f"{stat['mean']:.2f}"
    return f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def _duration(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


# The command-line options of the settings (`main`), for the page's command.
OPTIONS = {
    "seeds": "--seeds",
    "per_class": "--per-class",
    "epochs": "--epochs",
    "head_epochs": "--head-epochs",
    "backbone_epochs": "--backbone-epochs",
    "backbone_train_per_class": "--backbone-train-per-class",
    "val_per_class": "--val-per-class",
    "int8_per_class": "--int8-per-class",
}


def reproduce_command(settings):
    """The command that runs the study of `settings` (its options that differ from the
    defaults), as a user types it: no machine's paths, no run history."""
    defaults, words = Settings(), ["python -m experiments.transfer_study"]
    for field, option in OPTIONS.items():
        value = getattr(settings, field)
        if value != getattr(defaults, field):
            values = value if isinstance(value, tuple) else (value,)
            words.append(" ".join([option, *map(str, values)]))
    if not settings.end_to_end:
        words.append("--no-end-to-end")
    return " ".join(words)


def code_commits(codes):
    """The commits the rows ran at, from their `code` fields ({code: runs}; a field may add
    words after the commit, a snapshot's history, which the rows keep): "commit abc1234 (21
    runs)", "+dirty" said as uncommitted changes, None as not recorded."""
    commits = {}
    for code, count in codes.items():
        match = re.match(r"[0-9a-f]{7,40}(\+dirty)?", code or "")
        key = None
        if match:
            key = f"commit {match.group()[:7]}"
            key += " with uncommitted changes" if match.group(1) else ""
        commits[key] = commits.get(key, 0) + count
    return "; ".join(
        f"{key or 'not recorded'} ({count} run{'s' if count > 1 else ''})"
        for key, count in commits.items()
    )


def render_page(summary, plan, rows_link):
    """The evidence page (Markdown) of a study's summary and plan."""
    s = settings_from_json(plan["settings"])
    names = [folders.CLASS_NAMES[c] for c in s.target_classes]
    base_names = [folders.CLASS_NAMES[c] for c in s.backbone_classes]
    lines = ["# Evidence: fine-tuning a pretrained base on a few real images", ""]
    finished = summary["rows"] == summary["planned"]
    verdicts = []
    for e in summary["sizes"]:
        mean, ci = _interval(e["diff"])
        if not e["seeds"]:
            verdicts.append(f"**{e['per_class']} images per class: no paired seed yet.**")
            continue
        verdicts.append(
            f"**{e['per_class']} images per class: transfer - scratch {mean} points, 95% CI "
            f"{ci} over {len(e['seeds'])} paired seed{'s' if len(e['seeds']) > 1 else ''} "
            f"({e['wins']}/{e['losses']} "
            f"wins/losses): {verdict(e)}.**"
        )
    if not any(r["arm"] == "scratch" for r in summary.get("all_rows", [])):
        verdicts = [
            "No scratch run here: this folder holds the transfer arm only (run with "
            "`--only backbone transfer`), for its int8 files ([int8](#int8)); transfer "
            "against scratch is [the study's page](transfer.md)."
        ]
        finished = True
    lines += [
        "**The verdict.** "
        + " ".join(verdicts)
        + (
            ""
            if finished
            else f" ({summary['rows']} of {summary['planned']} planned runs finished; the "
            "study is still running or was stopped, and rerunning it resumes.)"
        ),
        "",
        f"The question: does `autoshuffle-finetune`'s recipe (a pretrained base, the new head "
        f"trained alone, then the whole net) beat training the same network from scratch "
        f"when a folder holds few images? Real images nobody here made: Fashion-MNIST "
        f"written as PNG folders. The base was trained here on classes "
        f"{', '.join(base_names)}; the fine-tuning runs learn {', '.join(names)}, which it "
        "never saw.",
        "",
        "## Accuracy, transfer against scratch",
        "",
        f"Validation accuracy (%) on the same {s.val_per_class or 1000} test images per class "
        f"({(s.val_per_class or 1000) * len(s.target_classes)} images) for every run, mean "
        "± standard deviation over seeds; transfer - scratch paired by seed (the same "
        "training images and seed), in points, with its 95% Student-t interval.",
        "",
        "| images per class | epochs (transfer: head + whole; scratch) | transfer | scratch "
        "| transfer - scratch | 95% CI | wins/losses | seeds | mean s per run (transfer, "
        "scratch) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary["sizes"]:
        mean, ci = _interval(e["diff"])
        (h, w), (_, total) = e["epochs"]["transfer"], e["epochs"]["scratch"]
        seconds = ", ".join(
            "-" if e[a + "_seconds"] is None else f"{e[a + '_seconds']:.0f}"
            for a in ("transfer", "scratch")
        )
        lines.append(
            f"| {e['per_class']} | {h} + {w}; {total} | {_mean_sd(e['transfer'])} "
            f"| {_mean_sd(e['scratch'])} | {mean} | {ci} | {e['wins']}/{e['losses']} "
            f"| {len(e['seeds'])} | {seconds} |"
        )
    lines.append("")
    for e in summary["sizes"]:
        if e["diffs"]:
            by_seed = ", ".join(f"seed {k}: {v:+.2f}" for k, v in e["diffs"].items())
            lines.append(f"- {e['per_class']} per class, transfer - scratch by seed: {by_seed}.")
    lines.append("")
    int8 = summary["int8"]
    lines += ["## int8", ""]
    if int8 is None:
        lines += ["No int8 run has finished yet.", ""]
    elif len(int8_sizes(s)) > 1:  # each size apart: the table below
        lines += [
            f"The transfer arm at {' and '.join(map(str, int8_sizes(s)))} images per class "
            "also writes the int8 files.",
            "",
        ]
    else:
        drop, drop_ci = _interval(int8["drop"])
        agree, agree_ci = _interval(int8["agreement"], signed=False)
        lines += [
            f"The transfer arm at {int8['per_class']} images per class also writes a "
            "full-integer LiteRT file (`int8=True`: calibrated on 500 training images, checked "
            "against the float LiteRT file on the validation images).",
            "",
            "| runs | float accuracy | int8 accuracy | drop (points, float - int8) | 95% CI "
            "| top-1 agreement (%) | 95% CI | float / int8 size | refused by the check |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {int8['drop']['n']} | {_mean_sd(int8['float_accuracy'])} "
            f"| {_mean_sd(int8['int8_accuracy'])} | {drop} | {drop_ci} | {agree} | {agree_ci} "
            f"| {int8['size_ratio']:.2f}x | {int8['refused']} |",
            "",
            "By seed (drop in points, agreement %): "
            + ", ".join(f"seed {k}: {d:+.2f}, {a:.2f}" for k, (d, a) in int8["by_seed"].items())
            + ". "
            + (
                f"The check of these runs refused a file whose drop exceeded {bound:g} points "
                "(--int8-max-drop, finetune's default), the agreement reported."
                if (bound := int8.get("bound")) is not None
                else "The check of these runs refused a file whose drop exceeded 0.5 points or "
                "whose agreement was under 99%; today's writes one whose drop is within "
                "--int8-max-drop (default 2 points), the agreement reported (the numbers are "
                "recorded either way)."
            ),
            "",
        ]
    if int8 is not None:
        from experiments import transfer_int8

        lines += transfer_int8.render(
            summary["all_rows"], **{key: summary.get(key, []) for key in INT8_FILES}
        )
    e2e = summary["end_to_end"]
    lines += ["## The command end to end", ""]
    if e2e is None:
        done = "has not finished yet" if s.end_to_end else "is not in this study (--no-end-to-end)"
        lines += [f"The end-to-end run {done}.", ""]
    else:
        lines += [
            f"`{e2e['command']}` on the {e2e['per_class']}-per-class folder of seed "
            f"{e2e['seed']} (the transfer arm's settings, every export; {e2e['seconds']:.0f} s): "
            "each file's accuracy on the validation images, and its top-1 agreement with the "
            "Keras model.",
            "",
            "| file | accuracy (%) | agreement with Keras (%) | size (kB) |",
            "|---|---|---|---|",
        ]
        for fmt, f in e2e["files"].items():
            size = "-" if f.get("size_bytes") is None else f"{f['size_bytes'] / 1e3:.0f}"
            lines.append(
                f"| {fmt} | {100 * f['accuracy']:.2f} | {100 * f['top1_agreement']:.2f} | {size} |"
            )
        refused = (e2e.get("int8") or {}).get("refused")
        if refused:
            i8 = e2e["int8"]
            lines += [
                "",
                f"`--int8`: the full-integer file was refused by finetune's check and not "
                f"written (top-1 agreement with the float model {100 * i8['top1_agreement']:.1f}%, "
                f"under the 99% minimum of that run's check, since replaced by a bound on the "
                f"drop; accuracy {100 * i8['accuracy']:.2f}% against "
                f"{100 * i8['float_accuracy']:.2f}% float, a drop of "
                f"{i8['accuracy_drop_points']:.2f} points); the float files are kept.",
            ]
        same = next(
            (
                r
                for r in summary.get("transfer_rows", [])
                if r["per_class"] == e2e["per_class"] and r["seed"] == e2e["seed"]
            ),
            None,
        )
        lines.append("")
        if same is not None:
            lines += [
                f"The transfer run of the same folder and seed, through the function: "
                f"{100 * same['val_accuracy']:.2f}% (the command: "
                f"{100 * e2e['val_accuracy']:.2f}%).",
                "",
            ]
    chance = [
        r
        for r in summary.get("all_rows", [])
        if r["arm"] in ("transfer", "scratch")
        and r["val_accuracy"] <= 1 / len(s.target_classes) + 0.02
    ]
    if chance:
        notes = []
        for r in chance:
            history = (r.get("history") or {}).get("train_all")
            note = f"{r['name']} ({100 * r['val_accuracy']:.1f}%"
            if history and history.get("loss"):
                note += (
                    f"; training loss up to {max(history['loss']):.1f}, validation loss up "
                    f"to {max(history['val_loss']):.3g}"
                )
            notes.append(note + ")")
        lines += [
            "**Runs that ended at chance** (validation accuracy within 2 points of "
            f"{100 / len(s.target_classes):.0f}%): " + "; ".join(notes) + ". They stay in "
            "the comparison: they are what the recipe gave."
            + (
                " Scratch runs like these are finetune's default learning rate from scratch "
                f"({s.scratch_learning_rate}) blowing up on a handful of batches an epoch (the "
                "loss spikes, and BatchNormalization's statistics with it); a lower rate for "
                "scratch was not measured."
                if all(r["arm"] == "scratch" for r in chance)
                else ""
            ),
            "",
        ]
    backbone = summary["backbone"]
    lines += [
        "## Setup",
        "",
        f"- ShuffleNet v2 {s.width}x, {s.image_size}x{s.image_size} RGB inputs made from the "
        "28x28 grey PNGs by finetune's folder reader: in training an Inception-style "
        "random-resized crop (8-100% of the area) and a random flip, in evaluation a resize "
        f"to {round(s.image_size * 256 / 224)} and a centre crop; batch {s.batch_size}, "
        f"label smoothing {s.label_smoothing}, class weights {s.class_weights}, horizontal "
        f"flips {'on' if s.flip else 'off'}; SGD with momentum 0.9, the rate decaying "
        "linearly to 0 in each phase (finetune's recipe).",
        f"- The backbone: classes {', '.join(base_names)}, "
        + (
            "all their training images"
            if s.backbone_train_per_class is None
            else f"{s.backbone_train_per_class} training images each"
        )
        + f", {s.backbone_epochs} epochs from scratch at learning rate "
        f"{s.backbone_learning_rate}, validated on {s.backbone_val_per_class or 1000} of "
        "their test images each"
        + (
            f": {100 * backbone['val_accuracy']:.2f}% after {backbone['seconds'] / 60:.0f} "
            f"min ({backbone['train_images']} training images). "
            if backbone
            else " (not finished yet). "
        )
        + "One backbone (seed 0): the study measures fine-tuning this base, not how much "
        "another base would change it.",
        f"- Transfer: `weights=<the backbone's model.keras>`, its head replaced by a "
        f"{len(s.target_classes)}-way one; {s.head_epochs} head epochs at "
        f"{10 * s.transfer_learning_rate:g}, then the whole net (BatchNormalization frozen) at "
        f"{s.transfer_learning_rate}. Scratch: `weights=None`, the same total epochs at "
        f"{s.scratch_learning_rate}. The learning rates are finetune's defaults for each "
        "start; everything else is equal.",
        f"- Sizes {list(s.per_class)} training images per class, seeds {list(s.seeds)}: the "
        "seed picks the training images (a seeded choice per class; for one seed the 20 are "
        f"among the 100) and seeds the run. Epochs {dict(zip(s.per_class, s.epochs, strict=True))}"
        " (transfer's whole-net phase), after timing runs here: an epoch of 100 images "
        "with its validation pass took 4-6 s, of 500 images 9-10 s, and each run has 2-3 min "
        "of fixed cost (starting Python and TensorFlow, compiling each phase, the LiteRT "
        "export and its checks, the report), so epochs were cut to aim at about an hour in "
        "all; the backbone's 2 epochs of 30,000 images took 19 min alone. The study took "
        "longer (Time below; each row records the machine's load during its run).",
        f"- Validation: {s.val_per_class or 'all'} test images per class, one fixed choice "
        f"(seed {s.val_seed}) for every run; no run sees them in training.",
        f"- CPU: {plan.get('cpu', 'unknown')}.",
        f"- Code: {code_commits(summary.get('code', {}))}; each row's `code` says more.",
        f"- Time: {_duration(summary['run_seconds'])} of runs in all (each run's start and "
        "end: the rows).",
        f"- Rows: [{os.path.basename(rows_link)}]({rows_link}) (one per run), the settings "
        f"in [{PLAN_FILE}]({os.path.join(os.path.dirname(rows_link), PLAN_FILE)}).",
        "",
        "## Reproduce",
        "",
        "```bash",
        "apt-get install dataset-fashion-mnist   # the original IDX files, offline",
        f"{reproduce_command(s)}   # every run without a row (resuming), then this page",
        "python -m experiments.transfer_study --summary   # this page from the rows",
        "# one folder by hand (what the study writes under runs/transfer/folders):",
        "python -m experiments.fashion_mnist_folder images --classes 5 6 7 8 9 "
        f"--train-per-class 100 --val-per-class {s.val_per_class} --seed 0",
        "```",
        "",
        "Each run is its own process and appends its row when it ends; a rerun of the same "
        "command trains only the runs without a row (a killed run resumes from its last "
        "finished epoch) and refuses other settings.",
        "",
    ]
    return "\n".join(lines)


def write_page(results, page, work=None):
    """Writes the evidence page from `results`' plan and rows; returns the summary. Rows
    written before they kept their phase histories get them from `work`'s runs, where
    those still are."""
    plan = read_plan(results)
    settings = settings_from_json(plan["settings"])
    rows = read_rows(os.path.join(results, ROWS_FILE), plan["plan"])
    for row in rows:
        if "history" not in row and work and os.path.isdir(os.path.join(work, "runs")):
            row["history"] = phase_histories(os.path.join(work, "runs", row["name"]))
    summary = summarize(rows, settings)
    summary["transfer_rows"] = [r for r in rows if r["arm"] == "transfer"]
    summary["all_rows"] = rows
    for key, name in INT8_FILES.items():
        if os.path.exists(os.path.join(results, name)):
            with open(os.path.join(results, name)) as f:
                summary[key] = [json.loads(line) for line in f if line.strip()]
    summary["code"] = {}
    for row in rows:
        code = row.get("code")
        summary["code"][code] = summary["code"].get(code, 0) + 1
    link = os.path.relpath(os.path.join(results, ROWS_FILE), os.path.dirname(page) or ".")
    os.makedirs(os.path.dirname(page) or ".", exist_ok=True)
    temporary = page + ".partial"
    with open(temporary, "w") as f:
        f.write(render_page(summary, plan, link))
    os.replace(temporary, page)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--results", default=RESULTS, help="rows.jsonl and plan.json")
    parser.add_argument("--work", default=WORK, help="image folders and runs (not in git)")
    parser.add_argument("--page", default=PAGE, help="the evidence page written")
    parser.add_argument("--summary", action="store_true", help="only write the page")
    parser.add_argument("--git-commit", action="store_true", help="commit rows after each run")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(defaults.seeds))
    parser.add_argument("--per-class", type=int, nargs="+", default=list(defaults.per_class))
    parser.add_argument("--epochs", type=int, nargs="+", default=list(defaults.epochs))
    parser.add_argument("--head-epochs", type=int, default=defaults.head_epochs)
    parser.add_argument("--backbone-epochs", type=int, default=defaults.backbone_epochs)
    parser.add_argument("--backbone-train-per-class", type=int, default=None)
    parser.add_argument("--val-per-class", type=int, default=defaults.val_per_class)
    parser.add_argument("--int8-per-class", type=int, nargs="+", default=[defaults.int8_per_class])
    parser.add_argument("--no-end-to-end", action="store_true")
    parser.add_argument("--only", nargs="+", help="only these runs (names or arms) this time")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.worker:
            return worker(args.worker, args.results, args.work)
        if args.summary:
            write_page(args.results, args.page, args.work)
            print(f"wrote {args.page}")
            return 0
        settings = Settings(
            seeds=tuple(args.seeds),
            per_class=tuple(args.per_class),
            epochs=tuple(args.epochs),
            head_epochs=args.head_epochs,
            backbone_epochs=args.backbone_epochs,
            backbone_train_per_class=args.backbone_train_per_class,
            val_per_class=args.val_per_class,
            # One size stays an int (the plans recorded before sizes were tuples).
            int8_per_class=(
                args.int8_per_class[0]
                if len(args.int8_per_class) == 1
                else tuple(args.int8_per_class)
            ),
            end_to_end=not args.no_end_to_end,
        )
        command = "python -m experiments.transfer_study " + " ".join(
            _relative(os.path.abspath(a)) if os.path.exists(a) else a
            for a in (argv if argv is not None else sys.argv[1:])
            if a != "--git-commit"
        )
        if args.only:  # a part of the study: not the command that reproduces it
            command = None
        return study(
            settings,
            args.results,
            args.work,
            args.page,
            commit=args.git_commit,
            log=lambda m: print(m, flush=True),
            command=command and command.strip(),
            only=args.only,
        )
    except (PlanError, ValueError, FileExistsError) as error:
        parser.error(str(error))


if __name__ == "__main__":
    sys.exit(main())
