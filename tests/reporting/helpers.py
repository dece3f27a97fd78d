"""Hand-made training-run folders, as ``train_policy@<variant>`` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def make_run(folder: Path, rewards: list[float], reward_stds: list[float] | None = None,
             final: dict[str, float] | None = None, wall_s: float | None = 100.0) -> Path:
    """metrics.csv (steps 1..n with the given reward/mean, reward/std and trainer columns), metrics.json (the
    last step plus ``final``) and timings.json."""
    folder.mkdir(parents=True, exist_ok=True)
    stds = reward_stds or [0.1] * len(rewards)
    rows = [{"step": i + 1, "reward/mean": r, "reward/std": s, "loss": 0.5, "kl": 0.01, "time/rollout": 3.0}
            for i, (r, s) in enumerate(zip(rewards, stds))]
    pd.DataFrame(rows).to_csv(folder / "metrics.csv", index=False)
    last = {k: v for k, v in rows[-1].items() if not k.startswith("time/")} if rows else {}
    (folder / "metrics.json").write_text(json.dumps({**last, **(final or {})}))
    if wall_s is not None:
        (folder / "timings.json").write_text(json.dumps({"wall_s": wall_s}))
    return folder


def dev(before_em: float, after_em: float, before_f1: float, after_f1: float) -> dict[str, float]:
    return {"dev_before.em": before_em, "dev_after.em": after_em, "dev_before.f1": before_f1,
            "dev_after.f1": after_f1, "dev_before.answered": 1.0, "dev_after.answered": 1.0}


def make_evaluation(folder: Path, metrics: dict[str, float], s_per_question: float | None = 6.0) -> Path:
    """metrics.json and timings.json as ``evaluate@<method>`` writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    if s_per_question is not None:
        (folder / "timings.json").write_text(json.dumps({"wall_s": 10 * s_per_question,
                                                         "s_per_question": s_per_question}))
    return folder
