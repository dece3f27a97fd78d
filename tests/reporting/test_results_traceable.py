"""Every figure on a results page can be traced to a tracked file: a page in docs/results/ names its figures file
beside it (``<page>.json`` or ``<page>.csv``, committed: ``outputs/`` is git-ignored), or it is on ``UNTRACED`` with
the reason, and then says on the page that its figures were not kept. The lab's pages are the lead's, left out.
The second test shows the check catching a page that cites ``outputs/`` alone. Under a second.

    .venv/bin/python -m pytest -q tests/reporting/test_results_traceable.py
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from components.reporting.figures import figures_line, write_figures

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
NOT_KEPT = "Figures: not kept."  # how a page on UNTRACED says so
INDEX = "README.md"  # the index of the pages: the figures it quotes are the linked pages'

_HAND = "assembled by hand from runs under outputs/ that were not kept"
_BEFORE = "written before its writer kept figures beside the page; the outputs it read were not kept"
UNTRACED = {
    "coreact_evaluation.md": _HAND,
    "judges.md": _HAND,
    "method_health.md": _HAND,
    "rubric_generator.md": _HAND,
    "training_variants.md": _HAND,
    "warm_start.md": _HAND + " (the old README's prose)",
    "head_to_head.md": _BEFORE + " (tasks.head_to_head writes head_to_head.json now)",
    "head_to_head_world_2seeds.md": _BEFORE + " (tasks.head_to_head --doc writes the .json beside it now)",
    "judges_bench.md": _BEFORE + " (scripts/judge_bench.py writes the .json beside its page now)",
    "judges_bench_stage.md": _BEFORE + " (scripts/judge_bench.py)",
    "judges_bench_verifier.md": _BEFORE + " (scripts/judge_bench.py)",
    "conformance.md": _BEFORE + ": the rows were in a temporary folder (scripts/conformance_table.py keeps them now)",
    "reproduction.md": _BEFORE + ": outputs/repro_check.json (flows.repro_check writes reproduction.json now)",
}


def tracked(folder: Path) -> set[Path]:
    """The files of ``folder`` git tracks; every file there when this is no git checkout."""
    done = subprocess.run(["git", "ls-files", "-z", "--", str(folder)], cwd=folder, capture_output=True, check=False)
    if done.returncode != 0:
        return {p for p in folder.iterdir() if p.is_file()}
    return {(folder / name).resolve() for name in done.stdout.decode().split("\0") if name}


def figures_of(page: Path, files: set[Path]) -> Path | None:
    """The tracked figures file beside ``page`` that the page names, if any."""
    text = page.read_text()
    for suffix in (".json", ".csv"):
        path = page.with_suffix(suffix)
        if path.resolve() in files and (f"({path.name})" in text or f"`{path.name}`" in text):
            return path
    return None


def untraced(folder: Path, files: set[Path]) -> list[str]:
    """The pages of ``folder`` (the lab's and the index aside) that name no tracked figures file beside them."""
    pages = sorted(p for p in folder.glob("*.md") if not p.name.startswith("lab") and p.name != INDEX)
    return [p.name for p in pages if figures_of(p, files) is None]


def test_every_results_page_names_its_tracked_figures_or_says_they_were_not_kept():
    files = {p.resolve() for p in tracked(RESULTS)}
    missing = untraced(RESULTS, files)
    assert sorted(set(missing) - set(UNTRACED)) == [], (
        "these pages name no committed figures file beside them (components/reporting/figures.py): commit "
        "<page>.json from the writer, or add the page to UNTRACED with its reason and a 'Figures: not kept.' line")
    assert sorted(set(UNTRACED) - set(missing)) == [], "these pages are traced now: take them off UNTRACED"
    for name in UNTRACED:
        text = (RESULTS / name).read_text()
        assert NOT_KEPT in text, f"docs/results/{name} must say on the page that its figures were not kept"
        assert "outputs/" in text or "temporary folder" in text, name
    assert "reliability_kill.md" not in missing  # the kill table's rows are committed beside it


def test_a_page_citing_outputs_alone_is_caught_and_its_figures_beside_it_trace_it(tmp_path):
    page = tmp_path / "runs.md"
    page.write_text("# Runs\n\nEM 0.52, from `outputs/eval/sft/metrics.json`.\n")
    assert untraced(tmp_path, {p.resolve() for p in tmp_path.iterdir()}) == ["runs.md"]
    figures = write_figures(page, {"em": 0.52})
    assert untraced(tmp_path, {figures.resolve()}) == ["runs.md"]  # there, but the page does not name it
    page.write_text(page.read_text() + "\n" + figures_line(page) + "\n")
    assert untraced(tmp_path, {page.resolve(), figures.resolve()}) == []
    assert untraced(tmp_path, {page.resolve()}) == ["runs.md"]  # named, but not tracked
