"""perf/bench_newcomer.py: it times the README's own commands, reads GNU time's report and pytest's summary, reads
the main job's stage times from the MLflow store the flow writes, and judges setup and the main job against the
issue's targets from a run's files (``--report-only``)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time

import pytest

from components.params_load import load_params
from tasks.runtime import tracking


@pytest.fixture(scope="module")
def bench(repo_root):
    spec = importlib.util.spec_from_file_location("bench_newcomer", repo_root / "perf" / "bench_newcomer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_newcomer"] = module
    spec.loader.exec_module(module)
    return module


def test_the_phases_are_the_readme_commands(bench, repo_root):
    readme = repo_root / "README.md"
    blocks = [line.strip() for line in readme.read_text().splitlines() if line.startswith("    ")]
    assert {bench.SETUP, bench.TESTS, bench.MAIN} <= set(blocks)
    ci = [line.strip() for line in (repo_root / ".ci" / "run").read_text().splitlines()]
    assert ci.count(bench.TESTS) == 1  # the default run, once (the vllm step is a command of its own)
    assert ci.count(bench.SETUP) == 1


TIME_V = """\tCommand being timed: "bash -c bash scripts/setup.sh"
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.50
\tMaximum resident set size (kbytes): 2097152
\tExit status: 0
"""


def test_gnu_time_report_and_pytest_summary(bench):
    assert bench.parse_time_v(TIME_V) == {"wall_s": 3723.5, "peak_rss_mib": 2048.0, "exit_status": 0}
    assert bench.parse_time_v("\tElapsed (wall clock) time (h:mm:ss or m:ss): 12:03.07\n")["wall_s"] == 723.1
    log = "....\n1225 passed, 54 deselected in 807.12s (0:13:27)\n"
    assert bench.pytest_summary(log) == "1225 passed, 54 deselected in 807.12s (0:13:27)"
    assert bench.pytest_summary("=== 3 failed, 2 passed in 1.0s ===") == "3 failed, 2 passed in 1.0s"


def test_stage_times_are_the_pipeline_runs_children(bench, repo_root, tmp_path, monkeypatch):
    """A stage's time runs from the end of the stage before it, since a stage may open its MLflow run only at its
    end (evaluate logs once its episodes are done): here ``evaluate@react`` works 0.3 s before opening its run."""
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "1")
    monkeypatch.chdir(tmp_path)
    params = load_params(repo_root / "params.yaml", overrides=[
        f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"run.mlflow_artifact_root={tmp_path / 'mlruns'}",
        "run.experiment=test"])
    with tracking(params, "prepare"):  # a stage run outside any pipeline: not the main job's
        pass
    with tracking(params, "pipeline") as parent:
        with tracking(params, "prepare", parent.run_id) as child:
            time.sleep(0.05)
            with tracking(params, "prepare@child", child.run_id):  # a grandchild (head_to_head's rows)
                pass
        time.sleep(0.3)  # evaluate's episodes, before its run opens
        with tracking(params, "evaluate@react", parent.run_id):
            pass
    stages = bench.stage_times(tmp_path / "mlflow.db")
    assert [s["stage"] for s in stages] == ["prepare", "evaluate@react"]
    assert stages[0]["wall_s"] >= 0.05 and stages[1]["wall_s"] >= 0.3
    assert stages[1]["end_s"] == pytest.approx(stages[0]["end_s"] + stages[1]["wall_s"], abs=0.11)
    assert {s["status"] for s in stages} == {"FINISHED"}


def test_report_judges_setup_and_main_against_their_targets(bench, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for phase, seconds, rc in (("setup", 11 * 60, 0), ("tests", 800, 0), ("main", 61 * 60, 0)):
        (work / f"{phase}.time").write_text(TIME_V.replace("1:02:03.50", f"{seconds // 60}:{seconds % 60:02d}"))
        with open(work / "phases.jsonl", "a") as f:
            f.write(json.dumps({"phase": phase, "command": bench.PHASES[phase], "rc": rc, "start": "", "end": "",
                                "load_before": 0.5, "load_after": 1.0}) + "\n")
    (work / "tests.log").write_text("1 passed in 1.0s\n")
    result = bench.report(work)
    met = {r["measure"].split(" ")[0]: (r["value"], r["met"]) for r in result["rows"]}
    assert met == {"setup": (11.0, True), "main": (61.0, False)}
    assert next(p for p in result["phases"] if p["phase"] == "tests")["summary"] == "1 passed in 1.0s"
    # a phase that failed is never met, however fast
    with open(work / "phases.jsonl", "a") as f:
        f.write(json.dumps({"phase": "setup", "command": bench.SETUP, "rc": 1, "start": "", "end": "",
                            "load_before": 0.5, "load_after": 1.0}) + "\n")
    setup = next(r for r in bench.report(work)["rows"] if r["measure"].startswith("setup"))
    assert setup["met"] is False and "rc 1" in setup["measure"]
