"""The lab experiment's page states the settings each GRPO run ran under (kept in its JSON), not the params the
report happens to read, and refuses to put runs of different settings in one table."""

from __future__ import annotations

import json

import pytest

from components.lab import experiment
from components.params_load import load_params

SFT = {"parameters": 1000, "seed": 0, "vocab": 400, "episodes": 3, "rows": 3, "row_tokens_mean": 10.0,
       "row_tokens_max": 12, "data_s": 1.0, "sft_steps": 2, "sft_s": 60.0, "threads": 1, "final_loss": 0.5,
       "test_n": 100.0, "test_em": 0.38, "test_f1": 0.4, "test_answered": 0.9, "test_turns": 3.0}


def _run(seed: int, lr: float, worlds: int) -> dict:
    settings = {"steps": 200, "prompts_per_step": 4, "group_size": 8, "lr": lr, "kl_coef": 0.0, "temperature": 0.5,
                "grpo_worlds": worlds}
    curve = [{"step": 0.0, "dev_em": 0.42, "wall_s": 0.0}, {"step": 200.0, "dev_em": 0.46, "wall_s": 500.0,
                                                             "time/rollout": 400.0, "time/update": 50.0}]
    return {"seed": seed, "wall_s": 500.0, "cpu_s": 480.0, "settings": settings, "curve": curve,
            "test_before_em": 0.38, "test_em": 0.41, "unseen_before_em": 0.38, "unseen_em": 0.44, "unseen_n": 136.0}


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "RESULTS", tmp_path / "results")
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "sft.json").write_text(json.dumps(SFT))
    # the params the report reads say lr 1e-4 and the lab world's questions: the runs' own settings must win
    return tmp_path, load_params("params.yaml", overlays=["lab"], overrides=[f"run.out_dir={tmp_path}",
                                                                             "grpo.lr=1e-4", "lab.grpo_worlds=0"])


def test_the_page_names_the_settings_its_runs_ran_under(lab):
    folder, params = lab
    for seed in (0, 1):
        (folder / f"grpo_seed{seed}.json").write_text(json.dumps(_run(seed, 3e-5, 2)))
    page = experiment.report(params).read_text()
    kept = json.loads((folder / "results" / "lab.json").read_text())  # the page's figures, tracked beside it
    assert [r["test_em"] for r in kept["runs"]] == [0.41, 0.41] and kept["sft"]["test_em"] == 0.38
    assert "200 steps of 4 questions x 8 attempts on the questions of the SFT's first 2 worlds" in page
    assert "lr 3e-05" in page and "lr 0.0001" not in page
    assert "mean +0.030 (sd 0.000 over 2 seeds" in page
    assert "| 0.380 -> 0.440 (136) |" in page and "never drew (the worlds it trains in, new questions): mean +0.060" in page


def test_runs_of_different_settings_are_not_tabled_together(lab):
    folder, params = lab
    (folder / "grpo_seed0.json").write_text(json.dumps(_run(0, 3e-5, 2)))
    (folder / "grpo_seed1.json").write_text(json.dumps(_run(1, 1e-4, 2)))
    with pytest.raises(ValueError, match="different settings"):
        experiment.report(params)
