"""Stage `train_rubric_generator` (Co-ReAct 3.2): GRPO of the rubric generator on the collected branching points,
through the one GRPO trainer: G single-turn rubrics per point, rewarded by the listwise Spearman reward (or the
pairwise one, the "w/o listwise" ablation), with the held-out Spearman measured before and after training.

    python -m tasks.train_rubric_generator [--reward pairwise] [--set rubric_generator.epochs=2]

Reads outputs/collect/branching_points.parquet. The generator starts from the base model of the
``trainable_policy`` role (the untrained generator, as in the paper) with a fresh LoRA (``lora``); the
``rubric_generator`` section holds G, lr, KL, epochs and sampling; the evaluator is the
``rubric_generator.evaluator_role`` role. With ``rubric_generator.warm_start=oracle``, the generator is first
SFT-trained on gold-chain rubrics (:mod:`components.methods.coreact.oracle_rubrics`) at the training questions' branching
points and at every prefix of the policy warm start's trajectories (outputs/sft_data: trajectories.jsonl, and the
training worlds' questions.jsonl for their gold chains); that adapter is merged into
the base, GRPO trains a fresh LoRA over it (its KL reference is the warm start), and the held-out Spearman is
measured after the warm start too. Writes under outputs/train_rubric_generator/<reward>/: adapter/ (everything
training changed, served as ``rubric_generator_trained`` / ``rubric_generator_pairwise``; after a warm start, its
adapter and GRPO's concatenated into one, by peft's ``add_weighted_adapter(..., combination_type="cat")``, which
adds their deltas exactly), warm_start/ (always written, so that DVC clears it with the stage: metrics.json, with
``kind`` none or oracle; after an oracle warm start also its adapter/, ckpt/, heldout.json (held-out Spearman after
the warm start) and grpo_adapter/, GRPO's own LoRA over it), ckpt/ (resumable), metrics.csv (one row per step:
reward and each of its terms, evaluator calls and failures; a DVC plot), heldout.json (held-out Spearman before,
after the warm start and after training: greedy, and ``heldout_samples`` sampled rubrics per point; each rubric with its rho; ``change``, the
paired per-point difference of after vs before with its bootstrap interval and Wilcoxon p,
``change_unparsed_as_chance``, the same with an unparseable rubric counted as rho 0, and ``change_grpo[_...]``,
after vs the warm start), metrics.json and timings.json.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from prefect import task
from pydantic import BaseModel

from components.methods.coreact.oracle_rubrics import trajectory_points, warm_start_rows
from components.methods.coreact.rubric_training import (
    Render,
    generator_config,
    held_out_spearman,
    paired_change,
    prompt_items,
    split_points,
    usable_points,
)
from components.io import read_json, read_jsonl, read_parquet, write_json
from components.llm.base import ChatModel
from components.llm.factory import LLMPool
from components.params import Params
from components.methods.coreact.generator_reward import RubricReward
from components.schemas import BranchingPoint, Question, Trajectory
from components.training.rollout import RolloutEngine
from components.training.sft import build_sft_example
from components.training.sft_trainer import SFTTrainer
from components.training.trainer import GRPOTrainer
from tasks.runtime import NullTracker, out_path, params_from_args, resolve, stage_argparser, tracking

RewardKind = Literal["listwise", "pairwise"]


class RubricTrainResult(BaseModel):
    reward: str
    adapter: str
    before: dict[str, float]
    after: dict[str, float]
    metrics: dict[str, float]
    warm_start: dict[str, float] | None = None


@dataclass
class WarmStartInputs:
    """What the oracle warm start needs beyond a GRPO run: the gold chains of the training questions and of the
    trajectories' questions (by id), the tokenizer of its SFT rows, ``rebase(policy, adapter_dir)``, which merges
    the warm-started adapter into the base and returns a fresh LoRA policy over it with the engine that serves it
    (closing the previous engine), and the trajectories whose prefixes add rows."""

    questions: Mapping[str, Question]
    tokenizer: Any
    rebase: Callable[[Any, Path], tuple[Any, RolloutEngine]]
    trajectories: Sequence[Trajectory] = ()  # the policy warm start's episodes: their prefixes are rows too


def oracle_warm_start(params: Params, policy, points: list[BranchingPoint], inputs: WarmStartInputs, folder: Path,
                      *, render: Render, pad_token_id: int) -> tuple[Path, dict[str, float]]:
    """SFT of ``policy``'s LoRA on the oracle rubrics of ``points`` (resumable; skipped when ``folder`` already
    holds its adapter): the adapter folder and the warm start's metrics."""
    s, adapter = params.rubric_generator, folder / "adapter"
    if (adapter / "adapter_config.json").exists():  # a resumed run: the policy gets the finished warm start back
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(policy.model, load_file(adapter / "adapter_model.safetensors"))
        return adapter, read_json(folder / "metrics.json")
    from_trajectories = [p for t in inputs.trajectories for p in trajectory_points(t)]
    rows, skipped = warm_start_rows([*points, *from_trajectories], inputs.questions, render, s.max_criteria,
                                    params.coreact.observation_chars, max_chars=s.max_criterion_chars)
    if not rows:
        raise ValueError(f"rubric_generator.warm_start=oracle: no row from {len(points)} training points ({skipped})")
    examples = [build_sft_example(r, inputs.tokenizer, max_length=params.sft.max_length) for r in rows]
    config = params.sft.model_copy(update={"epochs": s.warm_start_epochs, "lr": s.warm_start_lr, "max_steps": 0})
    trainer = SFTTrainer(policy, examples, config, pad_token_id=pad_token_id, seed=params.seed,
                         checkpoint_dir=folder / "ckpt")
    trainer.resume()
    history = trainer.train()
    trainer.save()
    losses = [h["loss"] for h in trainer.history or history]
    tenth = max(1, len(losses) // 10)
    metrics = {"kind": "oracle", "rows": float(len(rows)), "points.collect": float(len(points)),
               "points.trajectories": float(len(from_trajectories)),
               **{f"skipped.{k}": float(v) for k, v in skipped.items()},
               "optimizer_steps": float(len(losses)), "loss_first_tenth": round(sum(losses[:tenth]) / tenth, 6),
               "loss_last_tenth": round(sum(losses[-tenth:]) / tenth, 6)}
    write_json(folder / "metrics.json", metrics)
    policy.model.save_pretrained(str(adapter))  # last: its presence means the warm start is done
    return adapter, metrics


def save_served_adapter(policy, warm_adapter: Path | None, out: Path) -> None:
    """The adapter that serves the trained generator: GRPO's LoRA alone, or, after a warm start, the warm start's
    adapter and GRPO's concatenated into one (rank r1 + r2; its delta is exactly the sum of theirs)."""
    if warm_adapter is None:
        policy.model.save_pretrained(str(out))
        return
    model = policy.model
    model.load_adapter(str(warm_adapter), adapter_name="warm_start")
    model.add_weighted_adapter(["warm_start", "default"], [1.0, 1.0], "served", combination_type="cat")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        model.save_pretrained(tmp, selected_adapters=["served"])
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(Path(tmp) / "served"), str(out))
    model.set_adapter("default")
    model.delete_adapter("served")
    model.delete_adapter("warm_start")


def run_training(params: Params, policy, engine: RolloutEngine, evaluator: ChatModel,
                 points: list[BranchingPoint], folder: Path, *, render: Render, reward: RewardKind = "listwise",
                 pad_token_id: int = 0, tracker: Any = None,
                 on_metrics: Callable[[int, dict[str, float]], None] | None = None,
                 warm_start: WarmStartInputs | None = None) -> RubricTrainResult:
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

    def measured_once(path: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The held-out measure of the engine's current weights, stored at ``path`` (a resume reads it back)."""
        if path.exists():
            stored = read_json(path)
            return (stored["summary"], stored["rubrics"]) if "summary" in stored else (stored, [])
        summary, rubrics = held_out_spearman(engine, held_items, scorer, s.max_tokens, **sampling)
        write_json(path, {"summary": summary, "rubrics": rubrics})
        return summary, rubrics

    before, rubrics_before = measured_once(folder / "heldout_before.json")  # the untrained weights
    warm_adapter, warm, rubrics_warm, warm_metrics = None, None, [], {}
    if s.warm_start == "oracle":
        if warm_start is None:
            raise ValueError("rubric_generator.warm_start=oracle needs the training questions (WarmStartInputs)")
        held_questions = {p.question_id for p in held_out}
        warm_adapter, warm_metrics = oracle_warm_start(
            params, policy, [p for p in points if p.question_id not in held_questions], warm_start,
            folder / "warm_start", render=render, pad_token_id=pad_token_id)
        policy, engine = warm_start.rebase(policy, warm_adapter)
        warm, rubrics_warm = measured_once(folder / "warm_start" / "heldout.json")
    else:
        write_json(folder / "warm_start" / "metrics.json", {"kind": "none"})
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
    if warm_adapter is not None:
        policy.model.save_pretrained(str(folder / "warm_start" / "grpo_adapter"))
    save_served_adapter(policy, warm_adapter, folder / "adapter")
    after, rubrics_after = held_out_spearman(engine, held_items, scorer, s.max_tokens, **sampling)
    pairs = [("change", rubrics_before, rubrics_after)]
    if warm is not None:
        pairs += [("change_warm_start", rubrics_before, rubrics_warm), ("change_grpo", rubrics_warm, rubrics_after)]
    changes = {name + suffix: paired_change(a, b, seed=params.seed, unparsed_as_chance=as_chance)
               for name, a, b in pairs for suffix, as_chance in (("", False), ("_unparsed_as_chance", True))}
    write_json(folder / "heldout.json", {"before": before, "warm_start": warm, "after": after, **changes,
                                         "rubrics_before": rubrics_before, "rubrics_warm_start": rubrics_warm,
                                         "rubrics_after": rubrics_after})
    last = {k: round(float(v), 6) for k, v in history[-1].items()} if history else {}
    metrics = {**last, "points_train": float(len(train)), "points_held_out": float(len(held_out)),
               **{f"points_dropped.{k}": float(v) for k, v in dropped.items()},
               **{f"warm_start.{k}": v for k, v in warm_metrics.items() if k != "kind"},
               **{f"heldout_before.{k}": round(v, 6) for k, v in before.items()},
               **{f"heldout_warm_start.{k}": round(v, 6) for k, v in (warm or {}).items()},
               **{f"heldout_after.{k}": round(v, 6) for k, v in after.items()},
               **{f"heldout_{name}.{k}": round(v, 6) for name, c in changes.items() for k, v in c.items()}}
    write_json(folder / "metrics.json", metrics)
    return RubricTrainResult(reward=reward, adapter=str(folder / "adapter"), before=before, after=after,
                             metrics=metrics, warm_start=warm)


def warm_start_sources(params: Params) -> tuple[list[Trajectory], dict[str, Question]]:
    """The policy warm start's trajectories (the ``sft_data`` stage's) and every question a warm-start row may
    come from, by id: the run's train split (the collect's questions) and the questions of sft_data's training
    worlds (outputs/sft_data/worlds/seed-N/questions.jsonl)."""
    from tasks.collect import questions_by_id
    from tasks.runtime import SFT_METHOD, warm_start_folder

    folder = warm_start_folder(params, "sft_data", SFT_METHOD)
    path = folder / "trajectories.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"rubric_generator.warm_start=oracle: {path} is missing; run the sft_data stage")
    questions = questions_by_id(params)
    for world in sorted((folder / "worlds").glob("seed-*/questions.jsonl")):
        questions |= {q.id: q for q in read_jsonl(world, Question)}
    return read_jsonl(path, Trajectory), questions


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
    engines: list[RolloutEngine] = []  # the open one; a warm start replaces it
    try:
        model, tokenizer = load_trainable_policy(params)
        lora = params.lora
        settings = LoRASettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout) if lora.r else None
        policy = build_policy(model, lora=settings)
        engine = make_engine(params, policy, tokenizer)  # the base model: no policy warm start under it
        engines.append(engine)

        def rebase(trained, adapter: Path):
            old = engines.pop()
            if hasattr(old, "close"):
                old.close()
            fresh = build_policy(trained.model.merge_and_unload(), lora=settings)
            engines.append(make_engine(params, fresh, tokenizer, base_adapters=[adapter]))
            return fresh, engines[-1]

        warm_start = None
        if params.rubric_generator.warm_start == "oracle":
            trajectories, questions = warm_start_sources(params)
            warm_start = WarmStartInputs(questions, tokenizer, rebase, trajectories)
        with tracking(params, f"train_rubric_generator@{reward}", parent_run_id, tags={"reward": reward}) as tracker:
            tracker.log_params({"reward": reward, "rubric_generator": params.rubric_generator.model_dump(),
                                "lora": params.lora.model_dump()})
            result = run_training(params, policy, engine, pool.role(params.rubric_generator.evaluator_role), points,
                                  folder, render=chat_template_renderer(tokenizer), reward=reward,
                                  pad_token_id=tokenizer.pad_token_id or 0, tracker=tracker, warm_start=warm_start)
            write_json(folder / "timings.json", {"wall_s": time.perf_counter() - started})
            tracker.log_metrics({k: v for k, v in result.metrics.items() if k.startswith("heldout")})
            tracker.log_metrics(pool.accounting.metrics())
            tracker.log_artifact(folder / "metrics.csv")
            tracker.log_artifact(folder / "heldout.json")
    finally:
        for e in engines:
            if hasattr(e, "close"):
                e.close()
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
