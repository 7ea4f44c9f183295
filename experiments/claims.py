"""One number per claim: the speed and study figures the pages quote, from the committed rows.

The README, the site's home page, the evidence summary and docs/inference.md quote a few
figures: the folded ShuffleNet v2 1.0x against torchvision's graph in ONNX Runtime, OpenVINO
and LiteRT (`experiments.runtime_processes`' rows), what hardened, folded and balanced
shuffles cost in LiteRT (`experiments.benchmark`'s rows) and the Fashion-MNIST study's
verdict (`experiments.study`'s rows); the export guide, the evidence summary and
`export.int8`'s comment quote int8 figures (`experiments.int8_claims`: the int8 accuracy,
transfer study and int8 speed rows), and the lab notes hold the int8 peers' rows with the
way each was timed (`experiments.int8_peers`). This module computes each from its row file,
so that every page states the same number:

- `render` writes the blocks between `<!-- claims:NAME -->` and `<!-- /claims:NAME -->` in
  the pages that hold them (`--write`), or fails when a page's block differs from the rows
  (`--check`; tests/test_claims.py runs the same check);
- `figures()` gives the short forms ("0.81x", "-0.50 [-0.86, -0.15]") that the prose of the
  README and the evidence summary quotes; the tests check that the pages contain them.

Which runs are current: of `runtime_processes`' runs, those made with its defaults of today
(`--warmup` as many calls as a block, `--pause` 0, or 0.1 s with `--runtime litert`, 30
rounds of 20 calls, 8 processes); where a runtime has no such run (OpenVINO: no run with
warm-up calls), all of its runs, and the block says so. The earlier runs stay in the row
files and in docs/lab-notes/inference.md.

Usage:
    python -m experiments.claims [--check | --write]
"""

import argparse
import json
import pathlib
import sys

from experiments import int8_claims

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = pathlib.Path("docs") / "results"
ROWS = {
    "onnxruntime": RESULTS / "runtime_processes_onnxruntime_cpu.json",
    "openvino": RESULTS / "runtime_processes_openvino_cpu.json",
    "litert": RESULTS / "runtime_processes_litert_cpu.json",
    "benchmark": RESULTS / "benchmark_cpu.json",
    "gpu": RESULTS / "h200_jax_train_throughput.json",
    "study": pathlib.Path("docs") / "fashion_mnist" / "results.json",
    **int8_claims.ROWS,
}
# The pages that hold generated blocks, and the blocks each holds.
PAGES = {
    pathlib.Path("docs") / "inference.md": ("runtimes", "shuffle-costs"),
    pathlib.Path("docs") / "guide" / "export.md": ("int8-drops",),
    pathlib.Path("docs") / "lab-notes" / "inference.md": ("int8-peers",),
}
RUNTIME_COMMAND = "python -m experiments.runtime_processes --torchvision tv/ --processes 8"
BENCHMARK_COMMAND = (
    "python -m experiments.benchmark --repeats 9 --balanced-time-limit 10 --json rows.json"
)
NAMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO", "litert": "LiteRT"}


def load(name, root=ROOT):
    return json.loads((pathlib.Path(root) / ROWS[name]).read_text())


def _is_current(run, runtime):
    args = run.get("args", {})
    pause = 0.1 if runtime == "litert" else 0.0
    return (
        args.get("warmup", 0) > 0
        and args.get("warmup") == args.get("calls")
        and args.get("pause") == pause
        and args.get("rounds") == 30
        and args.get("calls") == 20
        and args.get("processes") == 8
    )


def current_runs(document, runtime):
    """[(run number, run)] of the current runs, and whether they had warm-up calls."""
    runs = list(enumerate(document["runs"], start=1))
    current = [(i, run) for i, run in runs if _is_current(run, runtime)]
    return (current, True) if current else (runs, False)


def ratio_range(values, suffix="x"):
    """The range of `values` to two digits: 0.81x when they round alike, else 0.76-0.77x."""
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low}{suffix}" if low == high else f"{low}-{high}{suffix}"


def _runs_words(numbers):
    if len(numbers) == 1:
        return f"run {numbers[0]}"
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"runs {numbers[0]}-{numbers[-1]}"
    return "runs " + ", ".join(map(str, numbers))


def runtime_rows(root=ROOT):
    """{runtime: {...}} from the current runs of each runtime's row file."""
    table = {}
    for runtime in ("onnxruntime", "openvino", "litert"):
        document = load(runtime, root)
        runs, warm = current_runs(document, runtime)
        summaries = [run["summary"] for _, run in runs]

        def ratios(key, summaries=summaries):
            return [s[key][0] for s in summaries]

        def interval(key, summaries=summaries):
            return min(s[key][1] for s in summaries), max(s[key][2] for s in summaries)

        table[runtime] = {
            "runs": [i for i, _ in runs],
            "warmup": warm,
            "version": document["versions"].get(
                "ai-edge-litert" if runtime == "litert" else runtime
            ),
            "machine": document["machine"],
            "file": ROWS[runtime].as_posix(),
            "folded/torchvision": ratio_range(ratios("manual_folded/torchvision")),
            "folded/torchvision interval": interval("manual_folded/torchvision"),
            "folded/manual": ratio_range(ratios("manual_folded/manual")),
            "folded/manual interval": interval("manual_folded/manual"),
        }
    return table


def benchmark_ratios(root=ROOT):
    """{(task, model, input, batch, variant): median / the manual median} of benchmark_cpu."""
    rows = load("benchmark", root)
    manual = {
        (r["task"], r["model"], r["input"], r["batch"]): r["median_ms"]
        for r in rows
        if r["variant"] == "manual"
    }
    return {
        (r["task"], r["model"], r["input"], r["batch"], r["variant"]): r["median_ms"]
        / manual[(r["task"], r["model"], r["input"], r["batch"])]
        for r in rows
    }


def _litert(ratios, model, variant):
    return ratios[("litert_infer", model, 224, 1, variant)]


def _training_cost(ratios, model):
    values = [
        value - 1
        for (task, name, _, _, variant), value in ratios.items()
        if task == "train_step" and name == model and variant == "relaxed"
    ]
    low, high = round(100 * min(values)), round(100 * max(values))
    return f"{low}%" if low == high else f"{low}-{high}%"


def study_entry(model, arm, root=ROOT):
    for entry in load("study", root)["verdict"]:
        if entry["model"] == model and entry["arm"] == arm:
            return entry
    raise KeyError(f"No verdict row for {model} {arm} in {ROWS['study']}.")


def gpu_training_cost(root=ROOT):
    """Relaxed / manual training step on the H200 with JAX, as a range of percents."""
    rows = load("gpu", root)
    manual = {r["model"]: r["median_ms"] for r in rows if r["variant"] == "manual"}
    values = [r["median_ms"] / manual[r["model"]] - 1 for r in rows if r["variant"] == "relaxed"]
    low, high = round(100 * min(values)), round(100 * max(values))
    return f"{low}%" if low == high else f"{low}-{high}%"


def ten_passes_rounding(root=ROOT):
    """The largest rounding change (points) of the study's ten-passes arm, v1 and v2."""
    changes = [
        abs(run["rounded_accuracy"] - run["relaxed_accuracy"]) * 100
        for run in load("study", root)["runs"]
        if run.get("arm") == "ten_passes"
    ]
    return f"{max(changes):.2f} points"


def _difference(entry):
    """The mean paired difference and its 95% interval in points: -0.50 [-0.86, -0.15]."""
    return f"{entry['diff_mean']:.2f} [{entry['ci_low']:+.2f}, {entry['ci_high']:+.2f}]"


def figures(root=ROOT):
    """The short forms the pages' prose quotes, each computed from its row file."""
    runtimes = runtime_rows(root)
    ratios = benchmark_ratios(root)
    v1, v2 = "v1_g3_1.0", "v2_1.0"
    search = study_entry("v2", "search_retrain", root)
    balanced = study_entry("v2", "balanced_fixed", root)
    paper = study_entry("v2", "paper", root)
    return {
        "onnxruntime folded/torchvision": runtimes["onnxruntime"]["folded/torchvision"],
        "onnxruntime folded/manual": runtimes["onnxruntime"]["folded/manual"],
        "openvino folded/torchvision": runtimes["openvino"]["folded/torchvision"],
        "litert folded/torchvision": runtimes["litert"]["folded/torchvision"],
        "litert folded/manual": runtimes["litert"]["folded/manual"],
        "litert gather/manual": "{:.1f}-{:.1f}x".format(
            _litert(ratios, v1, "hardened_gather"), _litert(ratios, v2, "hardened_gather")
        ),
        "litert v2 gather/manual": f"{_litert(ratios, v2, 'hardened_gather'):.1f}x",
        "litert v2 hardened folded/manual": f"{_litert(ratios, v2, 'hardened_folded'):.2f}x",
        "litert v1 hardened folded/manual": f"{_litert(ratios, v1, 'hardened_folded'):.2f}x",
        "litert v1 balanced folded/manual": f"{_litert(ratios, v1, 'balanced_folded'):.2f}x",
        "litert v2 balanced folded/manual": f"{_litert(ratios, v2, 'balanced_folded'):.2f}x",
        "training v1": _training_cost(ratios, v1),
        "training v2": _training_cost(ratios, v2),
        "training gpu": gpu_training_cost(root),
        "study v2 search_retrain": _difference(search),
        "study v2 search_retrain mean": f"{search['diff_mean']:.2f}",
        "study v2 search_retrain interval": _difference(search).split(" ", 1)[1],
        "study v2 balanced_fixed": _difference(balanced),
        "study v2 balanced_fixed mean": f"{balanced['diff_mean']:.2f}",
        "study v2 balanced_fixed interval": _difference(balanced).split(" ", 1)[1],
        "study v2 paper": f"{paper['diff_mean']:.2f}",
        "study v2 paper rounding": f"{-paper['rounding_change']:.1f} points",
        "study ten passes rounding": ten_passes_rounding(root),
        "study v2 seeds": len(search["seeds"]),
        **int8_claims.figures(root),
    }


def _interval(pair):
    return f"{pair[0]:.2f}-{pair[1]:.2f}"


def render_runtimes(root=ROOT):
    table = runtime_rows(root)
    lines = [
        "| runtime, 2 threads | folded / torchvision's graph | folded / manual | 95% t intervals "
        "| runs | rows |",
        "|---|---|---|---|---|---|",
    ]
    for runtime, row in table.items():
        against = (
            "torchvision's graph in ONNX Runtime, the same process"
            if runtime == "litert"
            else "torchvision's graph in the same runtime"
        )
        warm = "with warm-up calls" if row["warmup"] else "without warm-up calls"
        lines.append(
            f"| {NAMES[runtime]} {row['version']} | {row['folded/torchvision']} ({against}) "
            f"| {row['folded/manual']} "
            f"| {_interval(row['folded/torchvision interval'])}; "
            f"{_interval(row['folded/manual interval'])} "
            f"| {_runs_words(row['runs'])}, {warm} "
            f"| [{pathlib.Path(row['file']).name}](results/{pathlib.Path(row['file']).name}) |"
        )
    # The machine itself; how busy it was (after a ";" in the rows) is a run fact.
    machines = sorted({row["machine"].split(";")[0] for row in table.values()})
    lines += [
        "",
        f"ShuffleNet v2 1.0x, 224x224, batch 1, float32, torchvision's seeded weights; each "
        f"ratio the mean over 8 fresh processes of each one's median per-round ratio (30 "
        f"rounds of 20 calls, a random order each round). Machine: {'; '.join(machines)}. "
        f"Command: `{RUNTIME_COMMAND} --json rows.json` (`--runtime openvino`, "
        f"`--runtime litert`). The current runs are those made with the command's defaults "
        f"of today (20 untimed calls of the same file before each timed block; LiteRT with "
        f"0.1 s idle before each block, as the two runtimes share the process); OpenVINO "
        f"has no such run, so its two runs without warm-up calls are given.",
    ]
    return "\n".join(lines)


def render_shuffle_costs(root=ROOT):
    ratios = benchmark_ratios(root)
    variants = [
        ("hardened_gather", "hardened, not folded (a GATHER per shuffle)"),
        ("hardened_folded", "hardened (a random permutation), folded"),
        ("balanced_folded", "balanced-hardened, folded"),
        ("no_shuffle", "no shuffle at all (the floor)"),
    ]
    lines = [
        "| LiteRT, 224x224, batch 1, 2 threads: time / the manual net's | ShuffleNet v1 g3 1.0x "
        "| ShuffleNet v2 1.0x |",
        "|---|---|---|",
    ]
    for variant, words in variants:
        lines.append(
            f"| {words} | {_litert(ratios, 'v1_g3_1.0', variant):.2f} "
            f"| {_litert(ratios, 'v2_1.0', variant):.2f} |"
        )
    lines += [
        "",
        f"Training step with learned (relaxed) shuffles / the manual net's (TensorFlow CPU, "
        f"32x32 batch 128 and 224x224 batch 32): v1 +{_training_cost(ratios, 'v1_g3_1.0')}, "
        f"v2 +{_training_cost(ratios, 'v2_1.0')}. Medians of 9 interleaved rounds in one "
        f"process on a 2-core CPU with AVX-512 (not the AMD EPYC of the table above; the "
        f"run's date and the machine's state: the lab notes), TensorFlow 2.21, "
        f"ai-edge-litert 2.3.0; command `{BENCHMARK_COMMAND}`; rows "
        f"[results/benchmark_cpu.json](results/benchmark_cpu.json). These rows were measured "
        f"when the builders padded with Keras's 'same' (before the PAD ops of PyTorch's "
        f"padding): a later run with the PAD ops has no committed rows "
        f"([lab notes](lab-notes/inference.md#pytorchs-padding-in-litert-and-folded-manual-nets)).",
    ]
    return "\n".join(lines)


BLOCKS = {
    "runtimes": render_runtimes,
    "shuffle-costs": render_shuffle_costs,
    "int8-drops": int8_claims.render_drops,
    "int8-peers": int8_claims.render_peers,
}


def markers(name):
    return (
        f"<!-- claims:{name}: python -m experiments.claims --write -->",
        f"<!-- /claims:{name} -->",
    )


def read_block(text, name, path="page"):
    begin, end = markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no claims:{name} markers ({begin!r} ... {end!r}).")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace_block(text, name, block, path="page"):
    read_block(text, name, path)
    begin, end = markers(name)
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{begin}\n{block}\n{end}{tail}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail if a page's block differs")
    mode.add_argument("--write", action="store_true", help="rewrite the pages' blocks")
    parser.add_argument("--root", default=str(ROOT), help="the repository's root")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root)
    if not args.check and not args.write:
        for name, value in figures(root).items():
            print(f"{name}: {value}")
        return 0
    stale = []
    for page, names in PAGES.items():
        path = root / page
        text = path.read_text()
        new = text
        for name in names:
            new = replace_block(new, name, BLOCKS[name](root), page)
        if new != text:
            stale.append(page.as_posix())
            if args.write:
                path.write_text(new)
    if args.check and stale:
        print(
            f"Blocks differ from the rows in: {', '.join(stale)} "
            "(python -m experiments.claims --write)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
