"""The benchmark suite (``python -m perf``, perf/suite.py) with fake benchmarks: what runs and what ``--quick`` skips,
failures recorded as values, rows read from a script's JSON, the table, and the generated part of the performance
page rewritten between its markers while the rest of the page stays; the page in the tree is what ``--page`` writes
from ``perf/results/``. Plus ``perf/bench_retrieval.py`` at 1k paragraphs without the dense model, for the fields of
its JSON. About 5 s.

    .venv/bin/python -m pytest -q tests/test_perf_suite.py
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"perf_{name}", ROOT / "perf" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


suite = load("suite")

WRITES_ROWS = """
import argparse, json, os
p = argparse.ArgumentParser(); p.add_argument("--scale", type=float, default=1.0); p.add_argument("--out")
a = p.parse_args()
print("fake bench running")
json.dump({"rows": [{"measure": "speed", "ratio": 2.0 * a.scale, "target": ">= 1.5", "met": 2.0 * a.scale >= 1.5},
                    {"measure": "memory", "value": 3, "unit": "GiB", "target": "<= 2", "met": False}]},
          open(a.out, "w"))
"""
OLD_STYLE = """
import argparse, json
p = argparse.ArgumentParser(); p.add_argument("--out"); a = p.parse_args()
json.dump({"results": {"fast": 1.25}}, open(a.out, "w"))
"""
CRASHES = "import sys; print('something broke'); sys.exit(3)\n"
WRITES_NOTHING = "print('forgot the json')\n"


@pytest.fixture
def registry(tmp_path):
    scripts = {}
    for name, text in [("rows", WRITES_ROWS), ("old", OLD_STYLE), ("crash", CRASHES), ("nothing", WRITES_NOTHING),
                       ("long", WRITES_ROWS)]:
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(text)
    return [
        suite.Benchmark("rows", str(scripts["rows"]), ["--scale", "0.5"], targets="speed >= 1.5"),
        suite.Benchmark("old", str(scripts["old"]), extract=lambda d: [suite.info("fast", d["results"]["fast"], "x")]),
        suite.Benchmark("crash", str(scripts["crash"])),
        suite.Benchmark("nothing", str(scripts["nothing"])),
        suite.Benchmark("long", str(scripts["long"]), quick_skip="needs the real models"),
        suite.Benchmark("absent", str(tmp_path / "bench_absent.py")),
    ]


def by_name(result: dict) -> dict:
    return {e["name"]: e for e in result["benchmarks"]}


def test_quick_runs_each_script_and_records_failures_and_skips_as_values(registry, tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "nothing.json").write_text('{"rows": []}')  # a stale file from an earlier run is not read
    result = by_name(suite.run_suite(registry, quick=True, run_dir=tmp_path / "runs", echo=lambda _: None))

    rows = result["rows"]
    assert rows["status"] == "ran" and rows["command"].endswith("rows.py --scale 0.5")
    # the script's own arguments reached it: 2.0 x 0.5 = 1.0 misses the target it reports
    assert [(r["measure"], r["value"], r["met"]) for r in rows["rows"]] == [("speed", 1.0, False), ("memory", 3, False)]
    assert set(rows["load_before"]) == {"loadavg", "cpu_count"} and len(rows["load_after"]["loadavg"]) == 3
    assert json.loads((tmp_path / "runs" / "rows.json").read_text())["rows"][0]["ratio"] == 1.0

    assert [(r["measure"], r["value"], r["target"], r["met"]) for r in result["old"]["rows"]] == [("fast", 1.25, None, None)]
    assert result["crash"]["status"] == "failed" and result["crash"]["reason"] == "exit status 3"
    assert result["crash"]["output_tail"] == ["something broke"]
    assert result["nothing"]["status"] == "failed" and "no readable JSON" in result["nothing"]["reason"]
    assert result["long"]["status"] == "skipped" and result["long"]["reason"] == "--quick: needs the real models"
    assert result["absent"]["status"] == "skipped" and "is not in this tree" in result["absent"]["reason"]


def test_without_quick_the_long_benchmark_runs_and_only_selects(registry, tmp_path):
    result = suite.run_suite(registry, quick=False, only=["long"], run_dir=tmp_path, echo=lambda _: None)
    assert [e["name"] for e in result["benchmarks"]] == ["long"]
    assert result["benchmarks"][0]["status"] == "ran" and result["command"] == "python -m perf --only long"
    with pytest.raises(suite.SuiteError, match="unknown benchmark.*nope.*known: rows, old"):
        suite.run_suite(registry, quick=False, only=["nope"], run_dir=tmp_path)


def test_a_named_only_benchmark_runs_only_when_only_names_it(registry, tmp_path):
    """The newcomer's clock (two hours) is not part of a full run; ``--only newcomer`` runs it."""
    long = registry[4]
    long.named_only = "two hours"
    everything = by_name(suite.run_suite(registry[:1] + [long], quick=False, run_dir=tmp_path, echo=lambda _: None))
    assert everything["rows"]["status"] == "ran"
    assert everything["long"]["status"] == "skipped" and everything["long"]["reason"] == "runs only as --only long: two hours"
    named = suite.run_suite([long], quick=False, only=["long"], run_dir=tmp_path, echo=lambda _: None)
    assert named["benchmarks"][0]["status"] == "ran"
    assert next(b for b in suite.REGISTRY if b.name == "newcomer").named_only


def test_quick_arguments_and_missing_requirements(registry, tmp_path):
    rows = registry[0]
    rows.quick_args = ["--scale", "1.0"]
    rows.requires = ("json",)
    absent_module = suite.Benchmark("needs", rows.script, requires=("no_such_module_here",))
    result = by_name(suite.run_suite([rows, absent_module], quick=True, run_dir=tmp_path, echo=lambda _: None))
    assert result["rows"]["command"].endswith("rows.py --scale 1.0") and result["rows"]["rows"][0]["met"] is True
    assert result["needs"]["status"] == "skipped"
    assert result["needs"]["reason"] == "needs no_such_module_here, not installed"
    full = suite.run_suite([rows], quick=False, run_dir=tmp_path, echo=lambda _: None)["benchmarks"][0]
    assert full["command"].endswith("rows.py --scale 0.5") and full["rows"][0]["met"] is False


def test_a_suite_stopped_part_way_has_written_what_it_measured(registry, tmp_path):
    """After each benchmark the suite so far reaches ``on_entry`` (main writes it to the JSON and the page), the
    rest listed as not reached; stopping after the first one keeps its rows."""
    seen = []

    def stop_after_first(partial: dict) -> None:
        seen.append(partial)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        suite.run_suite(registry[:3], quick=True, run_dir=tmp_path, echo=lambda _: None, on_entry=stop_after_first)
    [partial] = seen
    result = by_name(partial)
    assert result["rows"]["status"] == "ran" and result["rows"]["rows"][0]["measure"] == "speed"
    assert [result[n]["status"] for n in ("old", "crash")] == ["skipped", "skipped"]
    assert result["old"]["reason"].startswith("not reached yet")
    section = suite.markdown_section(partial)
    assert "not run (not reached yet" in section and "### rows\n" in section and "| speed | 1 |" in section


def test_a_timed_out_benchmark_is_killed_and_recorded(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time; time.sleep(30)\n")
    record = suite.run_one(suite.Benchmark("slow", str(script)), tmp_path / "slow.json", timeout_s=1,
                           echo=lambda _: None)
    assert record["status"] == "failed" and record["reason"] == "killed after 1 s" and record["wall_s"] < 10


def test_rows_with_a_target_are_found_at_any_depth():
    data = {"machine": {"load": 1}, "sides": {"grpo": [{"metric": "tok/s", "side": "ours/trl", "ratio": 0.8,
                                                        "target": 1.0, "met": False}]}}
    assert suite.target_rows(data) == [{"measure": "tok/s (ours/trl)", "value": 0.8, "unit": "", "figures": "",
                                        "target": ">= 1", "met": False}]
    trl_style = {"ratios": [{"case": "tiny", "metric": "grpo tokens/s", "ours": 10.0, "trl": 8.0,
                             "ratio_ours_over_trl": 1.25, "target": 1.0, "met": True}]}
    assert [(r["measure"], r["value"], r["figures"], r["target"], r["met"]) for r in suite.target_rows(trl_style)] == [
        ("grpo tokens/s (tiny)", 1.25, "ours 10, trl 8", ">= 1", True)]


def test_table_and_doc_section(registry, tmp_path):
    result = suite.run_suite(registry, quick=True, run_dir=tmp_path / "runs", echo=lambda _: None)
    lines = suite.table_rows(result)
    speed = next(line for line in lines if line[1] == "speed")
    assert speed[:6] == ["rows", "speed", "1", "-", ">= 1.5", "NO"] and "->" in speed[6]
    assert next(line for line in lines if line[1] == "memory")[2] == "3 GiB"
    assert next(line for line in lines if line[0] == "crash")[1] == "FAILED: exit status 3"
    assert not any(line[0] in ("long", "absent") for line in lines)
    assert ["long", "--quick: needs the real models", "-"] in suite.skipped_rows(result)
    assert "--quick: needs the real models" in suite.text_table(result)

    section = suite.markdown_section(result)
    assert "Targets met: 0 of 2." in section and "| speed | 1 | - | >= 1.5 | NO |" in section
    rows_part = section[section.index("### rows\n"):section.index("### old\n")]
    assert f"`{by_name(result)['rows']['command']}`, measured {result['date']}" in rows_part
    assert "| fast | 1.25 x | - |\n" in section  # no target in old's rows: no target or met column
    assert "### long\n" in section and "not run (--quick: needs the real models)" in section
    assert "`crash.py` FAILED" not in section and "FAILED" in section[section.index("### crash\n"):]
    assert f"`{result['command']}`" in section and result["date"] in section

    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nhand-written intro\n\n{suite.BEGIN}\nold table\n{suite.END}\n\nhand-written end\n")
    suite.write_doc(doc, section)
    text = doc.read_text()
    assert "old table" not in text and "| speed | 1 |" in text
    assert text.startswith("# Performance\n\nhand-written intro\n\n") and text.endswith(f"{suite.END}\n\nhand-written end\n")
    suite.write_doc(doc, section)  # idempotent: a second write leaves the same page
    assert doc.read_text() == text

    doc.write_text("# Performance\n\nno markers\n")
    with pytest.raises(suite.SuiteError, match="performance.md: the generated section needs"):
        suite.write_doc(doc, section)


def test_the_registry_names_each_perf_script_once_and_trl_by_name():
    scripts = [b.script for b in suite.REGISTRY]
    assert len(set(scripts)) == len(scripts) and len({b.name for b in suite.REGISTRY}) == len(scripts)
    on_disk = {f"perf/{p.name}" for p in (ROOT / "perf").glob("*.py")} - {"perf/suite.py", "perf/__main__.py"}
    assert on_disk <= set(scripts), f"perf scripts missing from the registry: {on_disk - set(scripts)}"
    assert "perf/bench_trl.py" in scripts
    assert all(b.quick_skip for b in suite.REGISTRY if b.needs_models)


def test_bench_retrieval_small_corpus_writes_rows_against_the_targets(tmp_path):
    out = tmp_path / "retrieval.json"
    subprocess.run([sys.executable, str(ROOT / "perf" / "bench_retrieval.py"), "--paragraphs", "1000", "--queries",
                    "10", "--repeats", "1", "--no-dense", "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    report = json.loads(out.read_text())
    assert report["corpus"]["paragraphs"] == 1000 and report["queries"] == 10 and report["pools"] == 10
    rows = {r["key"]: r for r in report["rows"]}
    assert set(rows) == {"mmr", "bm25", "dense"}
    for key, target in [("mmr", 5.0), ("bm25", 20.0)]:
        r = rows[key]
        assert r["calls"] == 10 and 0 < r["p50_ms"] <= r["p95_ms"] == r["value"]
        assert 0 < r["cpu_p50_ms"] <= r["cpu_p95_ms"]
        assert r["target"] == f"p95 < {target:g} ms" and r["met"] == (r["p95_ms"] < target)
    assert rows["dense"]["met"] is None and rows["dense"]["skipped"] == "--no-dense"
    assert len(report["machine"]["loadavg_before"]) == 3
    # the suite reads these rows as they are
    assert [r["measure"] for r in suite.target_rows(report)] == [rows[k]["measure"] for k in ("mmr", "bm25", "dense")]


@pytest.mark.parametrize("bench", [b for b in suite.REGISTRY if b.recorded and (ROOT / b.recorded).exists()],
                         ids=lambda b: b.name)
def test_each_recorded_results_file_reads_as_rows(bench):
    got = suite.recorded_rows(bench)
    assert "recorded_error" not in got, got.get("recorded_error")
    assert got["rows"] and all(r["measure"] and r["value"] is not None or r["figures"] for r in got["rows"])


def full_history() -> bool:
    """A git checkout with its whole history: the page dates a recorded file without a date of its own by the commit
    that last wrote it, which a shallow clone or an exported tree does not have."""
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                         text=True, check=False)
    return out.returncode == 0 and out.stdout.strip() == "false"


@pytest.mark.skipif(not full_history(), reason="needs the repository's git history (the recorded files' commits)")
def test_the_page_is_what_page_writes_from_the_results_files(tmp_path):
    """docs/performance.md's generated part is up to date: ``python -m perf --page`` would write the same text."""
    page = (ROOT / "docs" / "performance.md").read_text()
    begin, end = suite.section_bounds(page, ROOT / "docs" / "performance.md")
    regenerated = suite.markdown_section(json.loads(suite.SUITE_JSON.read_text()), suite.REGISTRY)
    assert page[begin + len(suite.BEGIN) + 1:end] == regenerated, "stale: run .venv/bin/python -m perf --page"
    assert len(page.encode()) < 16_000  # a summary; the history is in git


def test_a_benchmark_the_suite_never_ran_shows_its_recorded_files_with_their_commit_and_command(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text('"""Time the x. More about it.\n\nRun::\n\n    python bench_x.py\n"""\n')
    (tmp_path / "x.json").write_text(json.dumps({"command": "python bench_x.py --fast", "working_tree_head": "abc1234def",
                                                 "rows": [{"measure": "x time", "value": 0.5, "target": "<= 1",
                                                           "met": True}]}))
    (tmp_path / "x_more.json").write_text(json.dumps({"results": {"fast": 3.0}}))
    bench = suite.Benchmark("x", str(script), recorded=str(tmp_path / "x.json"), also=(str(tmp_path / "x_more.json"),),
                            extract=lambda d: [suite.info("fast", d["results"]["fast"], "x")])
    assert suite.what_it_measures(bench) == "Time the x."
    empty = {"date": "2026-12-01", "commit": "0000000", "command": "python -m perf", "cpu_count": 2, "benchmarks": []}
    section = suite.markdown_section(empty, [bench])
    assert "### x\n\nTime the x. `python " in section and "not run (not in the suite's JSON yet)" in section
    assert "at `abc1234 " in section and "by `python bench_x.py --fast`:" in section  # the file's own commit
    assert "| x time | 0.5 | - | <= 1 | yes |" in section and "Also recorded in" in section
    assert "| fast | 3 x | - |" in section and "Targets met: 1 of 1." in section


def test_eval_determinism_json_as_the_script_writes_it():
    data = {"summary": {"batched": {"distinct_answer_lists": 2, "questions_changed": 1, "em": [0.0, 0.2]},
                        "invariant": {"distinct_answer_lists": 1, "questions_changed": 0, "em": [0.2, 0.2]}},
            "invariant_over_batched_wall": 1.4}
    bench = next(b for b in suite.REGISTRY if b.name == "eval_determinism")
    assert [(r["measure"], r["value"]) for r in suite.read_rows(bench, data)] == [
        ("invariant / batched evaluation wall time", 1.4), ("questions whose answer changed, batched", 1),
        ("questions whose answer changed, invariant", 0)]


def test_the_update_modes_json_gives_each_mode_against_the_base_and_the_two_mode_files_before_it_still_read():
    bench = next(b for b in suite.REGISTRY if b.name == "int8_base")
    fid = {"gradient_cosine": 0.98, "policy_logprob_abs_diff": {"mean": 0.012}}
    results = [{"mode": "fp32", "update_s": 70.0}, {"mode": "int8", "update_s": 35.0}, {"mode": "fused", "update_s": 63.0}]
    data = {"results": results, "ratios": {"int8": {"update_s": 0.5}, "fused": {"update_s": 0.9}},
            "fidelity": {"int8": fid, "fused": {**fid, "gradient_cosine": 1.0}}}
    assert [(r["measure"], r["value"]) for r in suite.read_rows(bench, data)] == [
        ("GRPO update of agent rows, int8 / fp32", 0.5), ("LoRA gradient, int8 vs fp32: cosine", 0.98),
        ("GRPO update of agent rows, fused / fp32", 0.9), ("LoRA gradient, fused vs fp32: cosine", 1.0)]
    before = {"results": results[:2], "ratios": {"update_s": 0.5}, "fidelity": fid}  # fp32 and int8, unkeyed
    assert [r["value"] for r in suite.read_rows(bench, before)] == [0.5, 0.98]


def test_the_arco_mu_json_gives_warm_up_and_writing_of_each_mode_against_the_base():
    bench = next(b for b in suite.REGISTRY if b.name == "arco_mu")
    results = [{"mode": "fp32", "warmup_s": 100.0, "score_s": 10.0, "write_s": 40.0},
               {"mode": "fused", "warmup_s": 90.0, "score_s": 9.0, "write_s": 40.0}]
    data = {"results": results, "ratios": {"fused": {"warmup_s": 0.9, "score_s": 0.9, "write_s": 1.0}},
            "fidelity": {"fused": {"adapter_max_abs_diff": 0.0, "step_reward_max_abs_diff": 0.0,
                                   "replies_identical": "4 of 4"}}}
    rows = suite.read_rows(bench, data)
    assert [(r["measure"], r["value"]) for r in rows] == [("ARCO mu warm-up, fused / fp32", 0.9),
                                                          ("ARCO mu writing criteria, fused / fp32", 1.0)]
    assert "adapter max abs diff 0" in rows[0]["figures"] and "4 of 4" in rows[1]["figures"]
    # a run without writing (--write-steps 0) has no writing row; its warm-up row gives the peak memory
    for row, peak in zip(results, (5120.0, 1024.0)):
        row.update(write_s=None, warmup_peak_above_start_mib=peak)
    del data["ratios"]["fused"]["write_s"]
    rows = suite.read_rows(bench, data)
    assert [r["measure"] for r in rows] == ["ARCO mu warm-up, fused / fp32"]
    assert "peak +1.0 vs +5.0 GB" in rows[0]["figures"]


def test_an_out_path_inside_the_repository_is_passed_relative_so_no_machine_path_is_recorded(tmp_path):
    bench = suite.Benchmark("trl", "perf/bench_trl.py", ["--cases", "tiny"])
    inside = bench.command(suite.REPO / "perf" / "results" / "suite" / "trl.json")
    assert inside[-2:] == ["--out", str(Path("perf") / "results" / "suite" / "trl.json")]
    assert bench.command(tmp_path / "trl.json")[-1] == str(tmp_path / "trl.json")  # elsewhere: as given


def test_only_reruns_what_it_names_and_carries_the_other_benchmarks_rows_over(registry, tmp_path):
    out, doc = tmp_path / "suite.json", tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\n{suite.BEGIN}\n{suite.END}\n")
    two = registry[:2]  # rows, old
    assert suite.main(["--quick", "--out", str(out), "--doc", str(doc)], registry=two) == 0
    first = json.loads(out.read_text())
    rows_entry = by_name(first)["rows"]

    two[1].extract = lambda d: [suite.info("fast", d["results"]["fast"] * 2, "x")]  # a rerun measures otherwise
    assert suite.main(["--quick", "--only", "old", "--out", str(out), "--doc", str(doc)], registry=two) == 0
    second = by_name(json.loads(out.read_text()))
    assert list(second) == ["rows", "old"]  # registry order, the carried one first
    assert second["old"]["rows"][0]["value"] == 2.5 and "carried_from" not in second["old"]
    assert {k: v for k, v in second["rows"].items() if k != "carried_from"} == rows_entry  # as it was measured
    assert second["rows"]["carried_from"] == {k: first[k] for k in ("date", "commit", "command")}
    section = doc.read_text()
    assert "| speed | 1 |" in section and "| fast | 2.5 x |" in section
    rows_part = section[section.index("### rows\n"):section.index("### old\n")]
    assert f"measured {first['date']}, `{first['commit']}` (carried)" in rows_part
    assert "(carried)" not in section[section.index("### old\n"):]

    # carried twice, it still names the run that measured it
    assert suite.main(["--quick", "--only", "old", "--out", str(out), "--doc", str(doc)], registry=two) == 0
    assert by_name(json.loads(out.read_text()))["rows"]["carried_from"]["command"] == first["command"]
