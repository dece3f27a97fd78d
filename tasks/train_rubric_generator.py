"""Stage `train_rubric_generator` (Co-ReAct 3.2): GRPO of the rubric generator on the collected branching points,
through the one GRPO trainer: G single-turn rubrics per point, rewarded by the listwise Spearman reward (or the
pairwise one, the "w/o listwise" ablation), with the held-out Spearman measured before and after training.

    python -m tasks.train_rubric_generator [--reward pairwise] [--set rubric_generator.epochs=2]

Reads outputs/collect/branching_points.parquet. The generator starts from the base model of the
``trainable_policy`` role (the untrained generator, as in the paper) with a fresh LoRA (``lora``); the
``rubric_generator`` section holds G, lr, KL, epochs and sampling; the evaluator is the
``rubric_generator.evaluator_role`` role. Writes under outputs/train_rubric_generator/<reward>/: adapter/ (served
as ``rubric_generator_trained`` / ``rubric_generator_pairwise``), ckpt/ (resumable), metrics.csv (one row per
step: reward and each of its terms, evaluator calls and failures; a DVC plot), heldout.json (held-out Spearman
before and after: greedy, and ``heldout_samples`` sampled rubrics per point; each rubric with its rho; ``change``,
the paired per-point difference with its bootstrap interval and Wilcoxon p, and ``change_unparsed_as_chance``,
the same with an unparseable rubric counted as rho 0),
metrics.json and timings.json.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from prefect import task
from pydantic import BaseModel

from components.coreact.rubric_training import (
    Render,
    generator_config,
    held_out_spearman,
    paired_change,
    prompt_items,
    split_points,
    usable_points,
)
from components.io import read_json, read_parquet, write_json
from components.llm.base import ChatModel
from components.llm.factory import LLMPool
from components.params import Params
from components.rewards.spearman import RubricReward
from components.schemas import BranchingPoint
from components.training.rollout import RolloutEngine
from components.training.trainer import GRPOTrainer
from tasks.runtime import NullTracker, out_path, params_from_args, resolve, stage_argparser, tracking

RewardKind = Literal["listwise", "pairwise"]


class RubricTrainResult(BaseModel):
    reward: str
    adapter: str
    before: dict[str, float]
    after: dict[str, float]
    metrics: dict[str, float]


def run_training(params: Params, policy, engine: RolloutEngine, evaluator: ChatModel,
                 points: list[BranchingPoint], folder: Path, *, render: Render, reward: RewardKind = "listwise",
                 pad_token_id: int = 0, tracker: Any = None,
                 on_metrics: Callable[[int, dict[str, float]], None] | None = None) -> RubricTrainResult:
    """The stage's work on given objects (tests pass a tiny policy and a scripted evaluator)."""
    s, tracker = params.rubric_generator, tracker or NullTracker()
    folder.mkdir(parents=True, exist_ok=True)
    usable, dropped = usable_points(points)
    train, held_out = split_points(usable, s.held_out_fraction, params.seed)
    if not train:
        raise ValueError(f"no branching point to train on ({len(points)} read, dropped: {dropped}); run collect first")
    obs = params.coreact.observation_chars
    train_items = prompt_items(train, render, s.max_criteria, obs, max_chars=s.max_criterion_chars)
    held_items = prompt_items(held_out, render, s.max_criteria, obs, max_chars=s.max_criterion_chars)
    reward_fn = RubricReward(evaluator, s, pairwise=reward == "pairwise", seed=params.seed, observation_chars=obs)
    scorer = RubricReward(evaluator, s, seed=params.seed, observation_chars=obs)  # held-out Spearman is listwise
    config = generator_config(params, len(train))
    sampling = {"samples": s.heldout_samples, "temperature": s.temperature, "top_p": s.top_p}

    before_path = folder / "heldout_before.json"  # measured once, on the untrained weights (a resume keeps it)
    if before_path.exists():
        stored = read_json(before_path)
        before, rubrics_before = (stored["summary"], stored["rubrics"]) if "summary" in stored else (stored, [])
    else:
        before, rubrics_before = held_out_spearman(engine, held_items, scorer, s.max_tokens, **sampling)
        write_json(before_path, {"summary": before, "rubrics": rubrics_before})
    rows: list[dict[str, float]] = []

    def save_rows() -> None:
        pd.DataFrame(rows).to_csv(folder / "metrics.csv", index=False)

    def log(step: int, metrics: dict[str, float]) -> None:
        rows.append({"step": step, **metrics})
        tracker.log_metrics(metrics, step=step)
        save_rows()
        if on_metrics is not None:
            on_metrics(step, metrics)

    trainer = GRPOTrainer(policy, engine, reward_fn, train_items, config, on_metrics=log,
                          checkpoint_dir=folder / "ckpt", seed=params.seed, pad_token_id=pad_token_id)
    if trainer.resume():  # the resumed steps' rows: a run resumed after its last step still writes metrics.csv
        rows.extend(dict(h) for h in trainer.history)
        save_rows()
    history = trainer.train(config.steps)
    trainer.save()
    policy.model.save_pretrained(str(folder / "adapter"))
    after, rubrics_after = held_out_spearman(engine, held_items, scorer, s.max_tokens, **sampling)
    change = paired_change(rubrics_before, rubrics_after, seed=params.seed)
    as_chance = paired_change(rubrics_before, rubrics_after, seed=params.seed, unparsed_as_chance=True)
    write_json(folder / "heldout.json", {"before": before, "after": after, "change": change,
                                         "change_unparsed_as_chance": as_chance,
                                         "rubrics_before": rubrics_before, "rubrics_after": rubrics_after})
    last = {k: round(float(v), 6) for k, v in history[-1].items()} if history else {}
    metrics = {**last, "points_train": float(len(train)), "points_held_out": float(len(held_out)),
               **{f"points_dropped.{k}": float(v) for k, v in dropped.items()},
               **{f"heldout_before.{k}": round(v, 6) for k, v in before.items()},
               **{f"heldout_after.{k}": round(v, 6) for k, v in after.items()},
               **{f"heldout_change.{k}": round(v, 6) for k, v in change.items()},
               **{f"heldout_change_unparsed_as_chance.{k}": round(v, 6) for k, v in as_chance.items()}}
    write_json(folder / "metrics.json", metrics)
    return RubricTrainResult(reward=reward, adapter=str(folder / "adapter"), before=before, after=after,
                             metrics=metrics)


@task(name="train_rubric_generator")
def train_rubric_generator(params: Params | None = None, reward: RewardKind = "listwise",
                           parent_run_id: str | None = None, pool: LLMPool | None = None) -> RubricTrainResult:
    params = resolve(params)
    import torch

    from components.training.agent_rollout import chat_template_renderer
    from components.training.model import LoRASettings, build_policy
    from tasks.sft import load_trainable_policy
    from tasks.train_policy import make_engine

    torch.manual_seed(params.seed)
    points = read_parquet(out_path(params, "collect", "branching_points.parquet"), BranchingPoint)
    folder = out_path(params, "train_rubric_generator", reward, "metrics.json").parent
    own_pool = pool is None
    pool = pool or LLMPool(params)
    started = time.perf_counter()
    engine = None
    try:
        model, tokenizer = load_trainable_policy(params)
        lora = params.lora
        policy = build_policy(model, lora=LoRASettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout) if lora.r else None)
        engine = make_engine(params, policy, tokenizer)  # the base model: no warm-start adapter under it
        with tracking(params, f"train_rubric_generator@{reward}", parent_run_id, tags={"reward": reward}) as tracker:
            tracker.log_params({"reward": reward, "rubric_generator": params.rubric_generator.model_dump(),
                                "lora": params.lora.model_dump()})
            result = run_training(params, policy, engine, pool.role(params.rubric_generator.evaluator_role), points,
                                  folder, render=chat_template_renderer(tokenizer), reward=reward,
                                  pad_token_id=tokenizer.pad_token_id or 0, tracker=tracker)
            write_json(folder / "timings.json", {"wall_s": time.perf_counter() - started})
            tracker.log_metrics({k: v for k, v in result.metrics.items() if k.startswith("heldout")})
            tracker.log_metrics(pool.accounting.metrics())
            tracker.log_artifact(folder / "metrics.csv")
            tracker.log_artifact(folder / "heldout.json")
    finally:
        if engine is not None and hasattr(engine, "close"):
            engine.close()
        if own_pool:
            pool.close()
    return result


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--reward", choices=["listwise", "pairwise"], default="listwise")
    args = parser.parse_args()
    print(train_rubric_generator.fn(params_from_args(args), reward=args.reward).model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
