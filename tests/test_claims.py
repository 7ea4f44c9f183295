"""One number per claim: the figures the README, the home page, the evidence summary and
docs/inference.md state are the committed rows' (`experiments/claims.py`).

No training and no timing: the rows are read and the pages compared with them.
"""

import json
import pathlib
import re
import shutil

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
        r"|\b(?:machine|cores?|CPUs?|VM) (?:was |were )?idle",
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
