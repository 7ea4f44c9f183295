"""The int8 part of a transfer study's page (issue 53): each runtime's int8 file of every
transfer run that wrote all three (`transfer_study`'s `int8_runtimes` field: finetune's
default int8 settings, checked on the run's validation images against the float file),
by size and over both sizes; and, where the results folder holds them, the levers
measured on the same nets (`experiments.int8_transfer_levers`' rows, paired by net).

`render(rows, levers)` gives the page's lines; `summarize(rows)` the numbers.
"""

from experiments.transfer_study import t_interval

RUNTIMES = {"litert": "LiteRT", "onnx": "ONNX Runtime", "openvino": "OpenVINO"}


def summarize(rows: list[dict]) -> list[dict]:
    """Per runtime and size (and "all" sizes): runs, files written and refused at the
    defaults, the drop (points) and the top-1 agreement (%) with their 95% t intervals."""
    runs = [r for r in rows if r["arm"] == "transfer" and r.get("int8_runtimes")]
    sizes = sorted({r["per_class"] for r in runs})
    entries = []
    for runtime in RUNTIMES:
        for size in [*sizes, "all"]:
            checks = [
                r["int8_runtimes"][runtime]
                for r in runs
                if runtime in r["int8_runtimes"] and size in ("all", r["per_class"])
            ]
            if not checks:
                continue
            entries.append(
                {
                    "runtime": runtime,
                    "per_class": size,
                    "runs": len(checks),
                    "refused": sum(bool(c.get("refused")) for c in checks),
                    "bound": sorted({c.get("max_accuracy_drop") for c in checks}, key=str),
                    "drop": t_interval([c["accuracy_drop_points"] for c in checks]),
                    "agreement": t_interval([100 * c["top1_agreement"] for c in checks]),
                }
            )
    return entries


def _ci(stat, signed=False):
    form = "{:+.2f}" if signed else "{:.2f}"
    if stat["low"] is None:
        return f"{form.format(stat['mean'])} [-]"
    return f"{form.format(stat['mean'])} [{form.format(stat['low'])}, {form.format(stat['high'])}]"


def latency_ratios(levers: list[dict]) -> dict:
    """{setting: (k-file / default file, k-file / float file)} of the LiteRT rows timed in
    the same run, mean and 95% t interval over the nets."""
    timed = [r for r in levers if r["runtime"] == "litert" and "latency_ms" in r]
    default = {r["net"]: r["latency_ms"] for r in timed if r["setting"] == "default"}
    ratios = {}
    for setting in sorted({r["setting"] for r in timed} - {"default"}):
        picked = [r for r in timed if r["setting"] == setting and r["net"] in default]
        if picked:
            ratios[setting] = (
                t_interval([r["latency_ms"] / default[r["net"]] for r in picked]),
                t_interval([r["latency_ms"] / r["float_latency_ms"] for r in picked]),
            )
    return ratios


def of_these_nets(rows: list[dict], measured: list[dict]) -> bool:
    """Whether `measured` (levers', margins' or the phase's rows, each with its net's float
    accuracy on the validation images) is of the nets of the study's `rows`: every net's
    float accuracy is its run's."""
    accuracy = {r["name"]: r["val_accuracy"] for r in rows if r["arm"] == "transfer"}
    return all(
        r["net"] in accuracy and abs(r["float_accuracy"] - accuracy[r["net"]]) < 1e-9
        for r in measured
        if r.get("setting", "default") == "default"
    )


def _nets(count: int, these_nets: bool) -> str:
    """How a section names the nets it measured ("10 of these nets" or, where
    `of_these_nets` said no, which nets they are)."""
    if these_nets:
        return f"{count} of these nets"
    return (
        f"{count} nets (nets of an earlier run of this plan, not the tables' above: their "
        "float accuracies differ; `default` here is their own files, measured in the same run)"
    )


def render(
    rows: list[dict],
    int8_levers: list[dict] = (),
    int8_qat: list[dict] = (),
    int8_margins: list[dict] = (),
) -> list[str]:
    """The page's lines: the defaults' table, then the levers', the margins' and the
    quantization-aware phase's (where measured)."""
    entries = summarize(rows)
    if not entries:
        return []
    lines = [
        "### Each runtime at finetune's defaults",
        "",
        "Every transfer run here wrote the int8 files of LiteRT, ONNX Runtime and OpenVINO "
        "at finetune's defaults (`--int8`: calibrated on the run's first training images, "
        "up to 500; ONNX Runtime and OpenVINO with 7-bit weights; refused beyond "
        "`--int8-max-drop`), each checked against its float file on the 500 validation "
        "images: the accuracy drop (points, float - int8) and the top-1 agreement, mean "
        "[95% t interval] over the runs.",
        "",
        "| runtime | images per class | runs | written | refused | drop (points) "
        "| top-1 agreement (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        lines.append(
            f"| {RUNTIMES[e['runtime']]} | {e['per_class']} | {e['runs']} "
            f"| {e['runs'] - e['refused']} | {e['refused']} | {_ci(e['drop'], True)} "
            f"| {_ci(e['agreement'])} |"
        )
    bounds = sorted({b for e in entries for b in e["bound"]}, key=str)
    lines += ["", f"The bound of these runs (points): {', '.join(map(str, bounds))}.", ""]
    if int8_levers:
        lines += render_levers(int8_levers, of_these_nets(rows, int8_levers))
    if int8_margins:
        lines += render_margins(int8_margins, of_these_nets(rows, int8_margins))
    if int8_qat:
        lines += render_qat(int8_qat, of_these_nets(rows, int8_qat))
    return lines


def render_levers(levers: list[dict], these_nets: bool = True) -> list[str]:
    """The levers' table (`int8_levers.table`, paired by net) and the LiteRT files'
    latencies."""
    from experiments import int8_levers

    nets = sorted({r["net"] for r in levers})
    lines = [
        "### The levers on the same nets" if these_nets else "### The levers",
        "",
        f"{_nets(len(nets), these_nets)} ({', '.join(nets)}), each int8 file made again from "
        "the same calibration images (`python -m experiments.int8_transfer_levers`): "
        "`default` (as above), `8bit` (ONNX Runtime and OpenVINO with 8-bit weights), "
        "`augmented` (calibrated on the images and one pad-2 crop and flip of each), `k<k>` "
        "(LiteRT with the k tensors of largest int8 error, by TensorFlow's quantization "
        "debugger on the calibration images, kept in float). Mean [95% t interval] over the "
        "nets; the change is paired by net against `default`.",
        "",
        int8_levers.table(int8_levers.summarize(levers, "default"), "default"),
        "",
    ]
    ratios = latency_ratios(levers)
    if ratios:
        lines.append(
            "LiteRT at batch 1, one thread, each file timed in turn in one process (medians "
            "of rounds): "
            + "; ".join(
                f"{setting} / default {_ci(by_default)}, / float {_ci(by_float)}"
                for setting, (by_default, by_float) in ratios.items()
            )
            + "."
        )
        lines.append("")
    return lines


def qat_float_change(rows: list[dict], setting: str = "qat") -> dict | None:
    """The phase's effect on the float nets (`experiments.int8_qat`'s rows of `setting`:
    "qat", or "float_phase", the phase without rounding; one value per net): the change
    of float accuracy (points), the two float nets' top-1 agreement (%), and each
    runtime's int8 drop against the float net before the phase (points), mean and 95% t
    interval; the phase's parameters."""
    import json

    nets = {r["net"]: r for r in rows if r["setting"] == setting}
    if not nets:
        return None
    return {
        "nets": len(nets),
        "accuracy_change": t_interval([r["float_accuracy_change"] for r in nets.values()]),
        "agreement": t_interval([100 * r["float_agreement"] for r in nets.values()]),
        "phases": sorted(
            {json.dumps(_without(r["qat"], "train_images"), sort_keys=True) for r in nets.values()}
        ),
        "drop_from_original": {
            runtime: t_interval(
                [
                    r["drop_from_original_float"]
                    for r in rows
                    if r["setting"] == setting and r["runtime"] == runtime
                ]
            )
            for runtime in RUNTIMES
            if any(r["setting"] == setting and r["runtime"] == runtime for r in rows)
        },
    }


def _without(entry: dict, key: str) -> dict:
    return {k: v for k, v in entry.items() if k != key}


def qat_table(rows: list[dict]) -> list[str]:
    """`experiments.int8_qat`'s rows as the levers' table ("qat" paired by net against the
    "default" files measured in the same run) and the float nets' change."""
    from experiments import int8_levers

    # A setting measured on one net has no interval: the paragraph below states it alone.
    nets = {}
    for row in rows:
        nets.setdefault(row["setting"], set()).add(row["net"])
    tabled = [row for row in rows if len(nets[row["setting"]]) > 1]
    lines = [int8_levers.table(int8_levers.summarize(tabled, "default"), "default"), ""]
    for setting, phase in (("qat", "the phase"), ("float_phase", "the phase without rounding")):
        change = qat_float_change(rows, setting)
        if not change:
            continue
        lines += [
            f"`{setting}`: the float nets after {phase} against before ({change['nets']} "
            f"net{'s' if change['nets'] != 1 else ''}): accuracy change "
            f"{_ci(change['accuracy_change'], True)} points, top-1 "
            f"agreement {_ci(change['agreement'])}%. Its int8 files against the float net "
            "before it, drop (points): "
            + ", ".join(
                f"{RUNTIMES[runtime]} {_ci(drop, True)}"
                for runtime, drop in change["drop_from_original"].items()
            )
            + f". The phase (each net's own training images): {'; '.join(change['phases'])}.",
            "",
        ]
    return lines


def render_margins(rows: list[dict], these_nets: bool = True) -> list[str]:
    """Where the default files disagree: `experiments.int8_margins`' table."""
    from experiments import int8_margins

    nets = len({r["net"] for r in rows})
    return [
        "### Where the int8 files disagree",
        "",
        f"{_nets(nets, these_nets)}: each runtime's "
        "int8 file at the defaults (the same calibration images) against the float net on "
        "the validation images, counted by the float net's top-1 margin (its top "
        "probability minus the second; bins fixed before measuring) "
        "(`python -m experiments.int8_margins measure`, rows in "
        "[margins.jsonl](../results/transfer_int8/margins.jsonl)). Agreement pooled over the "
        "nets and, per net, its mean [95% t interval] over the nets with images in the bin.",
        "",
        int8_margins.table(int8_margins.summarize(rows)),
        "",
    ]


def render_qat(rows: list[dict], these_nets: bool = True) -> list[str]:
    """The quantization-aware lever's section of the page."""
    nets = sorted({r["net"] for r in rows})
    return [
        "### A quantization-aware phase",
        "",
        f"{_nets(len(nets), these_nets)}: each folded float net "
        "trained a few more epochs on its own "
        "training images with int8 rounding simulated (kernels per output channel, "
        "symmetric; each activation the int8 files keep per tensor, over its range on the "
        "calibration images; gradients straight through; BatchNormalization frozen), then "
        "the ordinary post-training int8 files from the same calibration images "
        "(`python -m experiments.int8_qat transfer --results docs/results/transfer_int8 "
        "--work runs/transfer_int8`, rows in [qat.jsonl](../results/transfer_int8/qat.jsonl)). "
        "`qat` is paired by net against `default`, the same nets' files measured again in "
        "the same run; `qat`'s agreement and drop are against its own float net, the one "
        "a user of the phase would ship. `float_phase` (where measured, `--control`): the "
        "same phase without any rounding, a control for what the extra training alone does.",
        "",
        *qat_table(rows),
    ]
