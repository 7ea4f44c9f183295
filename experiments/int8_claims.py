"""The int8 figures the pages state, each computed from its rows (issue 53, item 5: one
number per claim). `experiments.claims` renders this module's blocks and adds its
figures to the ones tests/test_claims.py finds on the pages:

- `docs/results/int8_levers_minmax.json` (`experiments.int8_levers`), its base setting (the
  export's defaults: `fm_defaults`): the Fashion-MNIST net's int8 files as today's writers
  make them, 3 runtimes x 5 calibration seeds, on 10,000 test images;
- `docs/results/int8_first_layer_float.json`: an earlier net of the same recipe with the
  first convolution in float (ONNX Runtime, OpenVINO), paired with that net's full-integer
  files of the writers before 2026-12-02 (`int8_accuracy.json`, the lab notes' history);
- `docs/results/int8_stem_float_speed_cpu.json`: what that float convolution costs in time;
- `docs/results/transfer/` (`experiments.transfer_study`): the transfer study's fine-tuned
  nets, LiteRT int8 on 500 validation images;
- `docs/results/transfer_int8/`: the same study's transfer arm at both sizes, each
  runtime's int8 file at finetune's defaults (`experiments.transfer_int8`), and the levers
  on those nets (`levers.jsonl`, `experiments.int8_transfer_levers`);
- `docs/results/int8_sensitivity_fashion_mnist.json` (`experiments.int8_sensitivity`):
  LiteRT with the most sensitive tensors in float, on the Fashion-MNIST net;
- `docs/results/openvino_ranges.jsonl` (`experiments.openvino_ranges`): OpenVINO's int8
  files with NNCF's default ranges against min/max ranges.

Usage: `python -m experiments.claims` (prints the figures, these with the others).
"""

import json
import math
import pathlib

RESULTS = pathlib.Path("docs") / "results"
ROWS = {
    "fm_defaults": RESULTS / "int8_levers_minmax.json",
    "int8_first_layer_float": RESULTS / "int8_first_layer_float.json",
    "int8_stem_speed": RESULTS / "int8_stem_float_speed_cpu.json",
    "transfer_rows": RESULTS / "transfer" / "rows.jsonl",
    "transfer_plan": RESULTS / "transfer" / "plan.json",
    "transfer_int8_rows": RESULTS / "transfer_int8" / "rows.jsonl",
    "transfer_int8_plan": RESULTS / "transfer_int8" / "plan.json",
    "transfer_int8_levers": RESULTS / "transfer_int8" / "levers.jsonl",
    "int8_sensitivity": RESULTS / "int8_sensitivity_fashion_mnist.json",
    "int8_peers": RESULTS / "int8_peers_cpu.json",
    "model_table": RESULTS / "model_table_cpu.json",
    "openvino_ranges": RESULTS / "openvino_ranges.jsonl",
}
NAMES = {"litert": "LiteRT", "onnx": "ONNX Runtime", "openvino": "OpenVINO"}
# The check before issue 53 (refused below 99% agreement or above 0.5 points of drop), and
# the default bound since (export.int8.MAX_ACCURACY_DROP; not imported: no TensorFlow here).
OLD_MIN_AGREEMENT, OLD_MAX_DROP = 0.99, 0.5
DEFAULT_MAX_DROP = 2.0


def _load(name, root):
    return json.loads((pathlib.Path(root) / ROWS[name]).read_text())


def transfer_int8(root):
    """The transfer study's int8 summary (`transfer_study.summarize`'s "int8": drop and
    agreement with their t intervals, by seed) and its rows' test images."""
    from experiments import transfer_study

    plan = transfer_study.read_plan(str(pathlib.Path(root) / ROWS["transfer_plan"].parent))
    rows = transfer_study.read_rows(str(pathlib.Path(root) / ROWS["transfer_rows"]), plan["plan"])
    summary = transfer_study.summarize(rows, transfer_study.settings_from_json(plan["settings"]))
    int8 = summary["int8"]
    seeds = set(int8["by_seed"])
    images = {
        r["int8"]["test_examples"]
        for r in rows
        if r["arm"] == "transfer" and r.get("int8") and r["seed"] in seeds
    }
    (int8["test_images"],) = images
    return int8


def _points(value):
    return f"{value:.2f}"


def _range(values, suffix=""):
    """low-high to two decimals (one value when they round alike)."""
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low}{suffix}" if low == high else f"{low}-{high}{suffix}"


def _drops_range(values):
    return f"{min(values):.2f} to {max(values):.2f}"


def _refused(drops, agreements, old):
    """How many files a check refuses: the old (agreement and drop) or the default bound."""
    if old:
        return sum(
            d > OLD_MAX_DROP or a < OLD_MIN_AGREEMENT
            for d, a in zip(drops, agreements, strict=True)
        )
    return sum(d > DEFAULT_MAX_DROP for d in drops)


def fm_defaults(root) -> dict:
    """The Fashion-MNIST net's int8 files at the export's defaults, as
    `experiments.int8_accuracy` holds such a measurement: {"settings", "rows", "summary"}
    (the summary per runtime). The rows of `int8_levers`' base setting: the files of
    today's writers (7-bit weights in ONNX Runtime and OpenVINO, min/max ranges, the ONNX
    file's joined Concat ranges)."""
    from experiments.int8_accuracy import summarize
    from experiments.int8_levers import BASE

    document = _load("fm_defaults", root)
    rows = [r for r in document["rows"] if r["setting"] == BASE]
    return {"settings": document["settings"], "rows": rows, "summary": summarize(rows)}


def _file_rows(name, root):
    """(drops in points, agreements as fractions, test images) of a results file's rows."""
    document = fm_defaults(root) if name == "fm_defaults" else _load(name, root)
    rows = document["rows"]
    drops = [r["accuracy_drop"] for r in rows]
    agreements = [r["top1_agreement"] for r in rows]
    return drops, agreements, document["settings"]["test_images"]


def _one_in(probability):
    """1 / probability to one significant figure: 0.21 -> 5, 0.0043 -> 200."""
    value = 1 / probability
    digits = 10 ** math.floor(math.log10(value))
    return int(round(value / digits) * digits)


def noise(root):
    """The sampling noise of a drop measured on the transfer study's validation images at its
    mean agreement: the standard error (points), and how often a file truly losing the
    mean drop measures past 1 and past 2 points (normal approximation)."""
    from scipy import stats

    int8 = transfer_int8(root)
    n, agreement = int8["test_images"], round(int8["agreement"]["mean"], 1)
    flips = (100 - agreement) / 100 * n
    error = 100 * math.sqrt(flips) / n
    mean = int8["drop"]["mean"]
    past = {bound: stats.norm.sf((bound - mean) / error) for bound in (1, 2)}
    return {
        "images": n,
        "agreement": f"{agreement:.1f}%",
        "error": f"{error:.2f}",
        "mean drop": _points(mean),
        "past 1": _one_in(past[1]),
        "past 2": _one_in(past[2]),
    }


def drop_sets(root):
    """[(what, rows link, test images, drops in points, agreements as fractions)]: every
    set of int8 files measured on real images (the transfer study's, then the
    Fashion-MNIST net's full-integer and first-convolution-in-float files)."""
    int8 = transfer_int8(root)
    by_seed = [int8["by_seed"][s] for s in sorted(int8["by_seed"])]
    sets = [
        (
            f"{len(by_seed)} fine-tunes of the transfer study, LiteRT",
            "../results/transfer/rows.jsonl",
            int8["test_images"],
            [d for d, _ in by_seed],
            [a / 100 for _, a in by_seed],
        )
    ]
    nets = {
        "fm_defaults": "the Fashion-MNIST net, 5 calibration seeds x LiteRT, ONNX, OpenVINO",
        "int8_first_layer_float": "an earlier net of the same recipe and earlier writers, "
        "first convolution in float, ONNX and OpenVINO",
    }
    for name, words in nets.items():
        drops, agreements, images = _file_rows(name, root)
        sets.append((words, f"../results/{ROWS[name].name}", images, drops, agreements))
    return sets


def render_drops(root):
    """The table of docs/guide/export.md: drops and agreements of every int8 file measured
    on real images, and how many the old check and the default bound refuse."""
    lines = [
        "| nets (rows) | test images | drop (points) | top-1 agreement | refused by the old "
        f"check | by a {DEFAULT_MAX_DROP:g}-point bound |",
        "|---|---|---|---|---|---|",
    ]
    for number, (words, link, images, drops, agreements) in enumerate(drop_sets(root)):
        if number == 0:  # the transfer study's few seeds: each one, and their mean
            mean = _points(sum(drops) / len(drops))
            drop_text = f"{', '.join(map(_points, drops))} (mean {mean})"
        else:
            drop_text = _drops_range(drops)
        lines.append(
            f"| {words} ([rows]({link})) | {images:,} | {drop_text} "
            f"| {_range([100 * a for a in agreements], '%')} "
            f"| {_refused(drops, agreements, True)} of {len(drops)} "
            f"| {_refused(drops, agreements, False)} of {len(drops)} |"
        )
    return "\n".join(lines)


def _mean_ci(stat, scale=1.0, unit=""):
    """mean[unit] [low, high] to two decimals: "98.98% [98.89, 99.07]"."""
    low, high = stat["ci95"]
    return f"{scale * stat['mean']:.2f}{unit} [{scale * low:.2f}, {scale * high:.2f}]"


def _percent_costs(runs, runtime):
    """The stem-in-float / full-integer time of `runtime` over the widths, as percents."""
    values = [
        round(100 * (run["summary"]["stem_float/full"][0] - 1))
        for run in runs
        if run["runtime"] == runtime
    ]
    low, high = min(values), max(values)
    return f"{low}%" if low == high else f"{low}-{high}%"


def figures(root):
    """The int8 short forms the pages' prose quotes (see tests/test_claims.py)."""
    accuracy = fm_defaults(root)
    summary = accuracy["summary"]
    first = _load("int8_first_layer_float", root)
    paired = first["paired_differences"]
    transfer = transfer_int8(root)
    drops = [r["accuracy_drop"] for r in accuracy["rows"]]
    agreements = [r["top1_agreement"] for r in accuracy["rows"]]
    litert = [r for r in accuracy["rows"] if r["runtime"] == "litert"]
    sizes = {(r["bytes"], r["float_bytes"]) for r in litert}
    (litert_bytes, float_bytes) = sizes.pop() if len(sizes) == 1 else (None, None)
    sets = drop_sets(root)
    refused = sum(_refused(drops, agreements, False) for *_, drops, agreements in sets)
    files = sum(len(drops) for *_, drops, _ in sets)
    under = sum(a < OLD_MIN_AGREEMENT for *_, agreements in sets for a in agreements)
    out = {
        "fm float accuracy": f"{100 * accuracy['rows'][0]['float_accuracy']:.2f}%",
        "fm seeds": summary["litert"]["seeds"],
        "fm test images": f"{accuracy['settings']['test_images']:,}",
        "fm calibration images": accuracy["settings"]["calibration_images"],
        "fm drop range": _drops_range(drops),
        "fm agreement range": _range([100 * a for a in agreements], "%"),
        "fm agreement means": _range(
            [100 * s["top1_agreement"]["mean"] for s in summary.values()], "%"
        ),
        "fm litert bytes": f"{litert_bytes:,} against {float_bytes:,} bytes",
        "fm litert smaller": f"{float_bytes / litert_bytes:.2f}x",
        "stem onnx agreement gain": _points(100 * paired["onnx"]["top1_agreement"]["mean"]),
        "stem openvino agreement gain": _points(100 * paired["openvino"]["top1_agreement"]["mean"]),
        "stem onnx cost": _percent_costs(_load("int8_stem_speed", root)["runs"], "onnxruntime"),
        "stem openvino cost": _percent_costs(_load("int8_stem_speed", root)["runs"], "openvino"),
        "transfer mean drop": _points(transfer["drop"]["mean"]),
        "transfer drop interval": "[{:+.2f}, {:+.2f}]".format(
            transfer["drop"]["low"], transfer["drop"]["high"]
        ),
        "transfer agreement": f"{transfer['agreement']['mean']:.2f}%",
        "transfer runs": transfer["drop"]["n"],
        "refused by the bound": f"{refused} of {files}",
        "under 99% agreement": f"{under} of {files}",
    }
    for runtime, stat in summary.items():
        out[f"fm {runtime}"] = (
            f"{NAMES[runtime]} {_mean_ci(stat['top1_agreement'], 100, '%')}, "
            f"{_mean_ci(stat['accuracy_drop'])}"
        )
    out.update({f"noise {name}": value for name, value in noise(root).items()})
    out.update(lever_figures(root))
    out.update(openvino_range_figures(root))
    return {f"int8 {name}": value for name, value in out.items()}


def openvino_range_figures(root):
    """Per data set: OpenVINO's agreement and drop with NNCF's default ranges and with
    min/max ranges, and the change paired by net and seed (`experiments.openvino_ranges`)."""
    from experiments.openvino_ranges import AFTER, BEFORE, interval_text, summarize

    out = {}
    for dataset, settings in summarize(_jsonl("openvino_ranges", root)).items():
        before, after = settings[BEFORE], settings[AFTER]
        out[f"openvino ranges {dataset}"] = (
            f"agreement {before['agreement']['mean']:.2f}% -> {after['agreement']['mean']:.2f}% "
            f"({interval_text(after['change']['agreement'], True)} points), drop "
            f"{before['drop']['mean']:.2f} -> {after['drop']['mean']:.2f} points "
            f"({interval_text(after['change']['drop'], True)}), {after['n']} pairs"
        )
    return out


def _jsonl(name, root):
    path = pathlib.Path(root) / ROWS[name]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def transfer_defaults(root):
    """`experiments.transfer_int8.summarize` of the transfer_int8 rows: each runtime's int8
    file at finetune's defaults, by size and over all ("all")."""
    from experiments import transfer_int8, transfer_study

    folder = str(pathlib.Path(root) / ROWS["transfer_int8_plan"].parent)
    plan = transfer_study.read_plan(folder)
    rows = transfer_study.read_rows(
        str(pathlib.Path(root) / ROWS["transfer_int8_rows"]), plan["plan"]
    )
    return transfer_int8.summarize(rows)


def _ci(stat, signed=False):
    form = "{:+.2f}" if signed else "{:.2f}"
    return f"{form.format(stat['mean'])} [{form.format(stat['low'])}, {form.format(stat['high'])}]"


def lever_figures(root):
    """The short forms of the int8 targets on the transfer study's nets: per runtime, the
    files written at the defaults over both sizes with the drop and agreement intervals;
    per runtime and lever, the agreement over the nets measured (`int8_levers.summarize`,
    paired by net); the sensitivity lever on the Fashion-MNIST net."""
    from experiments import int8_levers, transfer_int8

    out = {}
    for e in transfer_defaults(root):
        if e["per_class"] == "all":
            out[f"defaults {e['runtime']}"] = (
                f"{NAMES[e['runtime']]}: written in {e['runs'] - e['refused']} of {e['runs']}, "
                f"drop {_ci(e['drop'], True)} points, agreement {_ci(e['agreement'])}%"
            )
    levers = int8_levers.summarize(_jsonl("transfer_int8_levers", root), "default")
    sensitivity = _load("int8_sensitivity", root)["summary"]["litert"]
    for prefix, summary, units in (
        ("lever", levers, "nets"),
        ("fm sensitivity", {"litert": sensitivity}, "seeds"),
    ):
        for runtime, settings in summary.items():
            for setting, stat in settings.items():
                key = f"{prefix} {setting}" if units == "seeds" else f"{prefix} {runtime} {setting}"
                out[key] = f"{_agreement(stat['top1_agreement'])} over {stat['seeds']} {units}"
                if setting != "default":  # paired with the default file of the same net or seed
                    out[key] += f", {_agreement(stat['minus_base']['top1_agreement'], True)} points"
    fm_rows = [{**r, "net": r["seed"]} for r in _load("int8_sensitivity", root)["rows"]]
    for prefix, rows in (("lever", _jsonl("transfer_int8_levers", root)), ("fm", fm_rows)):
        for setting, (by_default, _) in transfer_int8.latency_ratios(rows).items():
            interval = (
                f"[{by_default['low']:.2f}, {by_default['high']:.2f}]"
                if by_default["low"] is not None
                else "(one value)"
            )
            out[f"{prefix} latency {setting}"] = (
                f"{by_default['mean']:.2f}x {interval} the full-integer file's"
            )
    return out


def _agreement(stat, change=False):
    """A fraction's mean [95% interval] in percent (points with `change`, signed), or the
    mean alone where one value gives no interval."""
    form = "{:+.2f}" if change else "{:.2f}"
    low, high = stat["ci95"]
    unit = "" if change else "%"
    if math.isnan(low):
        return f"{form.format(100 * stat['mean'])}{unit} (one value)"
    return (
        f"{form.format(100 * stat['mean'])}{unit} "
        f"[{form.format(100 * low)}, {form.format(100 * high)}]"
    )


def render_peers(root):
    """experiments.int8_peers' page of its rows (the lab notes' block)."""
    from experiments import int8_peers

    return int8_peers.render(_load("int8_peers", root))
