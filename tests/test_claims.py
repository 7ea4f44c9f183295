"""One number per claim: the figures the README, the home page, the evidence summary and
docs/inference.md state are the committed rows' (`experiments/claims.py`).

No training and no timing: the rows are read and the pages compared with them.
"""

import json
import pathlib
import re
import shutil

import pytest

from experiments import claims

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = claims.figures()
# The pages a new user reads first, and the evidence summary.
USER_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/getting-started.md",
    "docs/inference.md",
    "docs/training.md",
    "docs/evidence/index.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "guide").glob("*.md")),
]


def _text(path):
    """The page with its line breaks and indents as single spaces (prose wraps anywhere)."""
    return " ".join((ROOT / path).read_text().split())


def test_generated_blocks_match_the_rows():
    # Fails when a block is edited by hand or the rows change without
    # `python -m experiments.claims --write`.
    assert claims.main(["--check"]) == 0


def test_current_runs_are_those_made_with_todays_defaults():
    runs = {name: claims.current_runs(claims.load(name), name) for name in claims.NAMES}
    assert [i for i, _ in runs["onnxruntime"][0]] == [10, 11] and runs["onnxruntime"][1]
    assert [i for i, _ in runs["litert"][0]] == [3, 4] and runs["litert"][1]
    # OpenVINO has no run with warm-up calls: both of its runs, said so in the block.
    assert [i for i, _ in runs["openvino"][0]] == [1, 2] and not runs["openvino"][1]
    assert "runs 1-2, without warm-up calls" in claims.render_runtimes()


def test_key_figures_recomputed_from_the_rows():
    # The claims the issue found stated differently on different pages, from the rows.
    onnx = claims.load("onnxruntime")["runs"]
    means = [onnx[i - 1]["summary"]["manual_folded/torchvision"][0] for i in (10, 11)]
    assert claims.ratio_range(means) == FIGURES["onnxruntime folded/torchvision"] == "0.81x"
    litert = claims.load("litert")["runs"]
    means = [litert[i - 1]["summary"]["manual_folded/manual"][0] for i in (3, 4)]
    assert claims.ratio_range(means) == FIGURES["litert folded/manual"] == "0.93-0.94x"
    study = json.loads((ROOT / claims.ROWS["study"]).read_text())
    (entry,) = [e for e in study["verdict"] if e["model"] == "v2" and e["arm"] == "search_retrain"]
    assert f"{entry['diff_mean']:.2f}" == "-0.50"
    assert (round(entry["ci_low"], 2), round(entry["ci_high"], 2)) == (-0.86, -0.15)
    assert FIGURES["study v2 search_retrain"] == "-0.50 [-0.86, -0.15]"


def test_readme_states_the_rows_figures():
    text = _text("README.md")
    f = FIGURES
    assert f"{f['litert folded/torchvision']} torchvision's graph in ONNX Runtime" in text
    assert f"{f['onnxruntime folded/torchvision']} torchvision's graph in ONNX Runtime" in text
    assert f"{f['openvino folded/torchvision']} in OpenVINO" in text
    mean, interval = f["study v2 search_retrain mean"], f["study v2 search_retrain interval"]
    assert f"({mean} points, 95% interval {interval} over nine seeds)" in text
    assert f["study v2 seeds"] == 9


def test_home_page_states_the_rows_figures():
    mean, interval = (
        FIGURES["study v2 search_retrain mean"],
        FIGURES["study v2 search_retrain interval"],
    )
    assert f"({mean} points, 95% CI {interval} over nine seeds)" in _text("docs/index.md")


def test_evidence_summary_states_the_rows_figures():
    text = _text("docs/evidence/index.md")
    f = FIGURES
    expected = [
        f"hardened (GATHER) shuffles {f['litert gather/manual']}",
        f"hardened, then folded: v2 {f['litert v2 hardened folded/manual']}, "
        f"v1 {f['litert v1 hardened folded/manual']} "
        f"(balanced-hardened v1: {f['litert v1 balanced folded/manual']})",
        f"(balanced) v2 routing {f['litert v2 balanced folded/manual']}",
        f"{f['onnxruntime folded/torchvision']} in ONNX Runtime, "
        f"{f['openvino folded/torchvision']} in OpenVINO, "
        f"{f['litert folded/torchvision']} in LiteRT",
        f"folded / manual in LiteRT {f['litert folded/manual']}",
        f"{f['training v1']} (v1) and {f['training v2']} (v2) per step on a CPU; "
        f"{f['training gpu']} on an H200",
        f"({f['study v2 search_retrain']} and {f['study v2 balanced_fixed']})",
        f"loses {f['study v2 paper'].lstrip('-')} points on v2",
        f"on v2 {f['study v2 paper rounding']}",
        f"within {f['study ten passes rounding']} on every seed",
    ]
    for phrase in expected:
        assert phrase in text, phrase


def test_guide_states_the_rows_figures():
    assert f"GATHER shuffles runs at {FIGURES['litert v2 gather/manual']} the" in _text(
        "docs/guide/folding.md"
    )
    mean, interval = (
        FIGURES["study v2 balanced_fixed mean"],
        FIGURES["study v2 balanced_fixed interval"],
    )
    text = _text("docs/guide/hardening.md")
    assert (
        f"{mean.lstrip('-')} points below the manual net over nine seeds (95% CI {interval})"
        in text
    )


def _pages_users_read():
    """README.md and every page under docs/ except the lab notes, the rows (docs/results/)
    and the reports a run wrote beside its results.json (docs/example_report/report.md):
    those record runs, with their dates and machines, by design."""
    pages = ["README.md"]
    for path in sorted((ROOT / "docs").rglob("*.md")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("docs/lab-notes/", "docs/results/")):
            continue
        if (path.parent / "results.json").exists():
            continue
        pages.append(relative)
    return pages


# A run's facts: they belong with its rows and in the lab notes, not on a page users read.
RUN_FACTS = {
    "a load average": re.compile(r"load averages?", re.IGNORECASE),
    "the machine's state": re.compile(
        r"quiet machine|nothing else running|no other jobs?\b|shared with other work"
        r"|\bidle (?:\w+ )?(?:machine|cores?|CPUs?|VM)\b"
        r"|\b(?:machine|cores?|CPUs?|VM) (?:was |were )?idle"
        r"|\bbusy (?:[\w-]+ )?(?:machine|cores?|CPUs?|VM)\b",
        re.IGNORECASE,
    ),
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
}


def test_superseded_figures_and_run_logs_stay_in_the_lab_notes():
    # Figures of superseded runs, and run logs, that once stood on the user pages.
    superseded = ["0.88-0.91x", "0.76-0.77x", "the manual net's time", "target met", "not met"]
    dated = re.compile(r"^#+ .*20\d\d-\d\d-\d\d", re.MULTILINE)
    for page in USER_PAGES:
        raw = (ROOT / page).read_text()
        text = " ".join(raw.split())
        for phrase in superseded:
            assert phrase not in text, (page, phrase)
        assert not dated.search(raw), page


def test_pages_users_read_state_no_run_facts():
    # The whole page, generated blocks included (the README's model table once said "load
    # average 1.4 at the start, 2.2 at the end; quiet machine").
    pages = _pages_users_read()
    assert {"README.md", "docs/inference.md", "docs/evidence/transfer.md"} <= set(pages)
    found = []
    for page in pages:
        text = " ".join((ROOT / page).read_text().split())
        for what, pattern in RUN_FACTS.items():
            found += [(page, what, m.group()) for m in pattern.finditer(text)]
    assert not found, found


def test_check_fails_on_a_page_edited_by_hand(tmp_path):
    for path in [*claims.ROWS.values(), *claims.PAGES]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    assert claims.main(["--check", "--root", str(tmp_path)]) == 0
    page = tmp_path / "docs" / "inference.md"
    page.write_text(page.read_text().replace("| 0.81x", "| 0.79x", 1))
    assert claims.main(["--check", "--root", str(tmp_path)]) == 1
    assert claims.main(["--write", "--root", str(tmp_path)]) == 0
    assert claims.main(["--check", "--root", str(tmp_path)]) == 0
    # An int8 figure edited by hand in the export guide's table fails the same way.
    guide = tmp_path / "docs" / "guide" / "export.md"
    guide.write_text(guide.read_text().replace("| 11 of 15 |", "| 3 of 15 |", 1))
    assert claims.main(["--check", "--root", str(tmp_path)]) == 1


# -- int8 (issue 53, item 5): every int8 figure from its rows -------------------------------


def test_int8_figures_recomputed_from_the_rows():
    # The Fashion-MNIST net's files at the export's defaults: int8_levers' base setting.
    levers = json.loads((ROOT / "docs/results/int8_levers_minmax.json").read_text())
    drops = [row["accuracy_drop"] for row in levers["rows"] if row["setting"] == "7bit"]
    assert len(drops) == 15
    assert FIGURES["int8 fm drop range"] == f"{min(drops):.2f} to {max(drops):.2f}"
    assert FIGURES["int8 fm drop range"] == "-0.02 to 0.33"
    transfer = [
        json.loads(line)
        for line in (ROOT / "docs/results/transfer/rows.jsonl").read_text().splitlines()
    ]
    int8 = [r["int8"] for r in transfer if r["arm"] == "transfer" and r.get("int8")]
    mean = sum(r["accuracy_drop_points"] for r in int8) / len(int8)
    assert FIGURES["int8 transfer mean drop"] == f"{mean:.2f}" == "0.56"
    assert FIGURES["int8 fm litert"] == "LiteRT 99.05% [98.89, 99.20], 0.05 [-0.02, 0.13]"
    # 5 transfer files + 15 + 10 Fashion-MNIST files; the old check refused 4 + 11 + 9.
    assert FIGURES["int8 refused by the bound"] == "0 of 30"
    assert FIGURES["int8 under 99% agreement"] == "24 of 30"


def test_export_guide_states_the_rows_int8_figures():
    text = _text("docs/guide/export.md")
    f = FIGURES
    expected = [
        f"{f['int8 noise error']} points at {f['int8 noise agreement']} agreement on "
        f"{f['int8 noise images']} images",
        f"the transfer study's mean {f['int8 noise mean drop']} points measures more than 1 "
        f"point one time in {f['int8 noise past 1']}, more than 2 points about one time in "
        f"{f['int8 noise past 2']}",
        f"float test accuracy {f['int8 fm float accuracy']}",
        f"{f['int8 fm calibration images']} training images drawn with each of "
        f"{f['int8 fm seeds']} seeds, checked on all {f['int8 fm test images']} test images",
        f"{f['int8 fm litert']}; {f['int8 fm onnx']}; {f['int8 fm openvino']};",
        f"LiteRT's file {f['int8 fm litert bytes']} ({f['int8 fm litert smaller']} smaller)",
        f"({f['int8 fm agreement means']}, {f['int8 fm seeds']} calibration seeds)",
        f"by {f['int8 stem onnx agreement gain']} points in ONNX Runtime and "
        f"{f['int8 stem openvino agreement gain']} in OpenVINO",
        f"about {f['int8 stem openvino cost']} more latency in OpenVINO and "
        f"{f['int8 stem onnx cost']} in ONNX Runtime",
    ]
    for phrase in expected:
        assert phrase in text, phrase


def test_export_guide_states_the_transfer_int8_figures():
    # Each runtime's files at the defaults on the transfer study's nets, every lever
    # measured on them and the sensitivity lever on the Fashion-MNIST net: from the rows.
    text = _text("docs/guide/export.md")
    prefixes = (
        "int8 defaults ",
        "int8 lever ",
        "int8 fm sens",
        "int8 fm latency ",
        "int8 openvino ranges ",
    )
    keys = [k for k in FIGURES if k.startswith(prefixes)]
    assert len([k for k in keys if k.startswith("int8 defaults ")]) == 3
    for key in keys:
        assert FIGURES[key] in text, key
    index = _text("docs/evidence/index.md")
    for runtime in ("litert", "onnx", "openvino"):
        assert FIGURES[f"int8 defaults {runtime}"] in index, runtime


def test_evidence_summary_and_readme_state_the_rows_int8_figures():
    f = FIGURES
    expected = [
        f"top-1 agreement with float is under 99% in {f['int8 under 99% agreement']} files",
        f"({f['int8 fm seeds']} calibration seeds x 3 runtimes, {f['int8 fm test images']} test "
        f"images): drops of {f['int8 fm drop range']} points, top-1 agreement "
        f"{f['int8 fm agreement range']}",
        f"the transfer study's {f['int8 transfer runs']} fine-tuned nets (LiteRT, "
        f"{f['int8 noise images']} images each): a mean drop of {f['int8 transfer mean drop']} "
        f"points {f['int8 transfer drop interval']}, agreement {f['int8 transfer agreement']}",
        f"LiteRT's file {f['int8 fm litert smaller']} smaller",
        f"{f['int8 refused by the bound']} files refused at the default 2-point bound",
    ]
    text = _text("docs/evidence/index.md")
    for phrase in expected:
        assert phrase in text, phrase
    # The README's int8 caption (experiments.model_table's, from the same rows) and the
    # export guide give the same agreement and drop per runtime.
    readme = _text("README.md")
    for runtime in ("litert", "onnx", "openvino"):
        assert f[f"int8 fm {runtime}"] in readme, runtime


@pytest.mark.parametrize(
    "results, committed",
    [("transfer", "transfer.md"), ("transfer_int8", "transfer_int8.md")],
)
def test_transfer_page_int8_figures_are_its_rows(tmp_path, results, committed):
    # The int8 study's page holds each runtime's files at the defaults and the levers'
    # table (levers.jsonl beside the rows): all of it from the rows.
    from experiments import transfer_study

    page = tmp_path / "transfer.md"
    transfer_study.write_page(str(ROOT / "docs/results" / results), str(page))

    def int8_part(text):  # from "## int8" to the end-to-end run
        return text.split("## int8", 1)[1].split("## The command end to end", 1)[0]

    committed = (ROOT / "docs/evidence" / committed).read_text()
    assert int8_part(page.read_text()) == int8_part(committed)
