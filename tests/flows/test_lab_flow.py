"""The lab sweep's few-step form, end to end (``python -m flows.lab``): a tiny nano start trained by the flow itself,
the world prepared, grpo under one judge and arbor under two, each cell trained, evaluated and recorded in its own
process, the page written with its table, curves and figures; run again, every cell is read back, not retrained.

    .venv/bin/python -m pytest -q -m slow tests/flows/test_lab_flow.py
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from components.params_load import load_params
from tests.lab.test_lab_overlay import TINY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SWEEP = ["lab.sft_own_questions=2", "lab.sweep.seeds=[0]", "lab.sweep.steps=2", "lab.sweep.eval_every=1",
         "lab.sweep.grids.session.variants=[grpo,arbor]",
         "lab.sweep.grids.session.dials={perfect: {}, noisy: {flip_rate: 0.5}}", "lab.sweep.grids.session.variant_seeds={}",
         "lab.sweep.overrides=[train_policy.first_question=2,train_policy.n_questions=2,train_policy.eval_questions=1,"
         "grpo.group_size=2,grpo.prompts_per_step=2]"]


def test_the_session_grid_runs_resumes_and_writes_its_page(repo_root, tmp_path, monkeypatch):
    from flows.lab import lab

    monkeypatch.chdir(tmp_path)  # the overlay's policies read outputs/lab/sft under the working directory
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    params = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=[*TINY, *SWEEP])
    rows = lab(params)["rows"]
    assert [(r["variant"], r["dial"]) for r in rows] == [("grpo", "perfect"), ("arbor", "perfect"), ("arbor", "noisy")]
    page = (tmp_path / "docs/results/lab_sweep.md").read_text()
    assert "| arbor | noisy | 1 |" in page and "matched baseline" in page and "lab_sweep.png" in page
    figures = json.loads((tmp_path / "docs/results/lab_sweep.json").read_text())
    arbor = next(c for c in figures["cells"] if c["variant"] == "arbor" and c["dial"] == "noisy")
    assert [p["step"] for p in arbor["curve"]] == [0.0, 1.0, 2.0]  # before, the curve's point, after
    trained = tmp_path / "outputs/lab/sweep/noisy/seed_0/train/arbor/metrics.csv"
    assert arbor["judge_calls"] == pd.read_csv(trained)["calls/judges"].iloc[-1]  # the pool's count, each step
    assert "zero-variance groups rescued" in arbor["health"]  # ARBOR's own mechanism read from its metrics
    first = trained.stat().st_mtime_ns
    again = lab(params)["rows"]
    assert pd.DataFrame(again).equals(pd.DataFrame(rows)) and trained.stat().st_mtime_ns == first  # read back
