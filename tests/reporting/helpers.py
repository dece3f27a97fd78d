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


def write_evaluation(folder: Path, em: list[int], judge: list[bool | None] | None = None,
                     cost: dict[str, dict[str, float]] | None = None) -> Path:
    """An evaluation folder exactly as ``evaluate@<method>`` writes it (trajectories.jsonl, per_question.csv,
    metrics.json, timings.json, run_key.json), scored by the stage's own code: question ``q<i>`` is answered
    right when ``em[i]`` is 1; ``judge`` gives the answer judge's verdicts (None: the judge failed); ``cost`` is
    each trajectory's per-role accounting (``metadata.guided.cost``)."""
    from components.io import write_json
    from components.methods.coreact.guided_metrics import guided_metrics
    from components.run_files import write_trajectories
    from components.schemas import Question, Step, Trajectory
    from tasks.evaluate import score

    folder.mkdir(parents=True, exist_ok=True)
    questions = [Question(id=f"q{i}", question=f"Where is thing {i}?", answers=["Paris"], type="bridge",
                          source="world", split="test") for i in range(len(em))]
    meta = {"guided": {"cost": cost}} if cost else {}
    trajectories = [Trajectory(question_id=q.id, question=q.question, final_answer="Paris" if right else "London",
                               steps=[Step(index=0)], prompt_tokens=50, completion_tokens=10, metadata=meta)
                    for q, right in zip(questions, em)]
    write_trajectories(folder / "trajectories.jsonl", trajectories)
    verdicts = judge if judge is not None else [bool(right) for right in em]
    table, metrics = score(questions, trajectories, verdicts)
    metrics.update(guided_metrics(table, trajectories))
    table.to_csv(folder / "per_question.csv", index=False)
    write_json(folder / "metrics.json", metrics)
    write_json(folder / "timings.json", {"wall_s": 1.0, "agent_s": 1.0, "s_per_question": 0.1, "resumed": 0})
    (folder / "run_key.json").write_text(json.dumps({"run_key": "test"}))
    return folder
