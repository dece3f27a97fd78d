"""The ``train_rubric_generator`` stage's recipe (Co-ReAct 3.2): GRPO of the rubric generator on the collected
branching points through the one GRPO trainer, G single-turn rubrics per point rewarded by the listwise Spearman
reward (or the pairwise one, the "w/o listwise" ablation), the held-out Spearman measured before and after
training, and the optional oracle warm start (``rubric_generator.warm_start=oracle``: SFT on gold-chain rubrics,
:mod:`components.methods.coreact.oracle_rubrics`, merged into the base before GRPO trains a fresh LoRA over it).

    torch.manual_seed(params.seed)
    with GeneratorRun(params) as run:            # base of trainable_policy + fresh LoRA, its engine, warm-start inputs
        result = run.train(points, evaluator_model(pool.role, params.rubric_generator), folder, reward="listwise")

:func:`run_training` is the same work on given objects (a policy, an engine, an evaluator). It writes in ``folder``:
heldout_before.json, warm_start/ (metrics.json with ``kind`` none or oracle; after an oracle warm start also its
adapter/, ckpt/, heldout.json and grpo_adapter/), ckpt/ (resumable), metrics.csv (one row per step), adapter/
(GRPO's LoRA, or after a warm start both adapters concatenated into one: :func:`save_served_adapter`),
heldout.json (before, after the warm start and after training, with the paired changes) and metrics.json.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import pandas as pd
from pydantic import BaseModel

from components.adapters import save_adapter
from components.io import read_json, read_jsonl, write_json
from components.llm.base import ChatModel
from components.methods.coreact.generator_reward import RubricReward
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
from components.params import Params, RunParams
from components.policy_run import make_engine
from components.run_files import SFT_METHOD, out_path
from components.run_spec import run_spec
from components.schemas import BranchingPoint, Question, Trajectory
from components.training.engines.rollout import RolloutEngine
from components.training.grpo.agent_rollout import chat_template_renderer
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy, load_trainable_policy
from components.training.sft.examples import build_sft_example
from components.training.sft.trainer import SFTTrainer
from components.training.speed.int8_base import restore_fp32

RewardKind = Literal["listwise", "pairwise"]

logger = logging.getLogger(__name__)


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
                                    params.coreact.observation_chars, max_chars=s.max_criterion_chars,
                                    format_reward=s.format_reward)
    if not rows:
        raise ValueError(f"rubric_generator.warm_start=oracle: no row from {len(points)} training points ({skipped})")
    examples = [build_sft_example(r, inputs.tokenizer, max_length=params.sft.max_length) for r in rows]
    config = params.sft.model_copy(update={"epochs": s.warm_start_epochs, "lr": s.warm_start_lr, "max_steps": 0})
    trainer = SFTTrainer(policy, examples, config, pad_token_id=pad_token_id, seed=params.seed,
                         checkpoint_dir=folder / "ckpt")
    trainer.resume()
    history = trainer.train(progress="train_rubric_generator (SFT warm-up)")
    trainer.save()
    losses = [h["loss"] for h in trainer.history or history]
    tenth = max(1, len(losses) // 10)
    metrics = {"kind": "oracle", "rows": float(len(rows)), "points.collect": float(len(points)),
               "points.trajectories": float(len(from_trajectories)),
               **{f"skipped.{k}": float(v) for k, v in skipped.items()},
               "optimizer_steps": float(len(losses)), "loss_first_tenth": round(sum(losses[:tenth]) / tenth, 6),
               "loss_last_tenth": round(sum(losses[-tenth:]) / tenth, 6)}
    write_json(folder / "metrics.json", metrics)
    save_adapter(policy.model, adapter)  # last: its presence means the warm start is done
    return adapter, metrics


def save_served_adapter(policy, warm_adapter: Path | None, out: Path) -> None:
    """The adapter that serves the trained generator: GRPO's LoRA alone, or, after a warm start, the warm start's
    adapter and GRPO's concatenated into one (rank r1 + r2; its delta is exactly the sum of theirs)."""
    if warm_adapter is None:
        save_adapter(policy.model, out)
        return
    model = policy.model
    model.load_adapter(str(warm_adapter), adapter_name="warm_start")
    model.add_weighted_adapter(["warm_start", "default"], [1.0, 1.0], "served", combination_type="cat")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        save_adapter(model, tmp, selected_adapters=["served"])
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(Path(tmp) / "served"), str(out))
    model.set_adapter("default")
    model.delete_adapter("served")
    model.delete_adapter("warm_start")


def untrained_result(policy, points: list[BranchingPoint], dropped: dict[str, int], held_out: int, folder: Path,
                     reward: RewardKind) -> RubricTrainResult:
    """The stage's files when there is no training point (a collect that kept none, e.g. every council vote
    unreadable): the untrained LoRA as the adapter (zero delta: the base generator is what the trained roles serve),
    no step, nothing measured, ``skipped`` 1 in metrics.json and the reason in heldout.json."""
    reason = f"no branching point to train on ({len(points)} read, dropped: {dropped or 'none'})"
    logger.warning("train_rubric_generator@%s: %s; the untrained generator is written as its adapter", reward, reason)
    (folder / "ckpt").mkdir(parents=True, exist_ok=True)
    write_json(folder / "warm_start" / "metrics.json", {"kind": "none", "skipped": reason})
    save_adapter(policy.model, folder / "adapter")
    pd.DataFrame(columns=["step"]).to_csv(folder / "metrics.csv", index=False)
    write_json(folder / "heldout_before.json", {"summary": {}, "rubrics": [], "skipped": reason})
    write_json(folder / "heldout.json", {"before": {}, "warm_start": None, "after": {}, "skipped": reason})
    metrics = {"skipped": 1.0, "optimizer_steps": 0.0, "points_train": 0.0, "points_held_out": float(held_out),
               **{f"points_dropped.{k}": float(v) for k, v in dropped.items()}}
    write_json(folder / "metrics.json", metrics)
    return RubricTrainResult(reward=reward, adapter=str(folder / "adapter"), before={}, after={}, metrics=metrics)


def run_training(params: Params, policy, engine: RolloutEngine, evaluator: ChatModel,
                 points: list[BranchingPoint], folder: Path, *, render: Render, reward: RewardKind = "listwise",
                 pad_token_id: int = 0, on_metrics: Callable[[int, dict[str, float]], None] | None = None,
                 warm_start: WarmStartInputs | None = None) -> RubricTrainResult:
    """GRPO of ``policy`` (served by ``engine``) on ``points``, everything written in ``folder`` (see the module
    docstring; without a usable training point, :func:`untrained_result`); ``on_metrics(step, metrics)`` sees each
    step's row. Tests pass a tiny policy and a scripted evaluator; :class:`GeneratorRun` passes the trainable
    policy."""
    s = params.rubric_generator
    folder.mkdir(parents=True, exist_ok=True)
    usable, dropped = usable_points(points)
    train, held_out = split_points(usable, s.held_out_fraction, params.seed)
    if not train:  # collect kept no usable point: no step to take, and the stage says so
        return untrained_result(policy, points, dropped, len(held_out), folder, reward)
    obs = params.coreact.observation_chars
    asked = {"max_chars": s.max_criterion_chars, "format_reward": s.format_reward}
    train_items = prompt_items(train, render, s.max_criteria, obs, **asked)
    held_items = prompt_items(held_out, render, s.max_criteria, obs, **asked)
    reward_fn = RubricReward(evaluator, s, pairwise=reward == "pairwise", seed=params.seed, observation_chars=obs)
    scorer = RubricReward(evaluator, s, seed=params.seed, observation_chars=obs)  # held-out Spearman is listwise
    config = generator_config(params.grpo, params.rubric_generator, len(train))
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
        save_rows()
        if on_metrics is not None:
            on_metrics(step, metrics)

    trainer = GRPOTrainer(policy, engine, reward_fn, train_items, config, on_metrics=log,
                          checkpoint_dir=folder / "ckpt", seed=params.seed, pad_token_id=pad_token_id)
    if trainer.resume():  # the resumed steps' rows: a run resumed after its last step still writes metrics.csv
        rows.extend(dict(h) for h in trainer.history)
        save_rows()
    history = trainer.train(config.steps, progress="train_rubric_generator (GRPO)")
    trainer.save()
    if warm_adapter is not None:
        save_adapter(policy.model, folder / "warm_start" / "grpo_adapter")
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


def questions_by_id(run: RunParams) -> dict[str, Question]:
    """Every question collect may draw its branching points from (the train split, whatever
    ``collect.n_questions`` was), by id: where a point's gold chain is."""
    return {q.id: q for q in read_jsonl(out_path(run, "data", "train.jsonl"), Question)}


def warm_start_sources(params: Params) -> tuple[list[Trajectory], dict[str, Question]]:
    """The policy warm start's trajectories (the ``sft_data`` stage's) and every question a warm-start row may
    come from, by id: the run's train split (the collect's questions) and the questions of sft_data's training
    worlds (outputs/sft_data/worlds/seed-N/questions.jsonl)."""
    folder = run_spec(params).warm_start_folder("sft_data", SFT_METHOD)
    path = folder / "trajectories.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"rubric_generator.warm_start=oracle: {path} is missing; run the sft_data stage")
    questions = questions_by_id(params.run)
    for world in sorted((folder / "worlds").glob("seed-*/questions.jsonl")):
        questions |= {q.id: q for q in read_jsonl(world, Question)}
    return read_jsonl(path, Trajectory), questions


class GeneratorRun:
    """The generator the stage trains, open from construction until :meth:`close` (or the end of a ``with``
    block): the base model of the ``trainable_policy`` role (the untrained generator, as in the paper) with a
    fresh LoRA (``lora``), served by the engine ``train_policy.engine`` names, and with
    ``rubric_generator.warm_start=oracle`` the warm start's inputs (:func:`warm_start_sources`)."""

    def __init__(self, params: Params):
        self.params, self.spec = params, run_spec(params)
        self.engines: list[RolloutEngine] = []  # the open one; a warm start replaces it
        try:
            model, self.tokenizer = load_trainable_policy(self.spec)
            lora = params.lora
            self.lora = LoRASettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout) if lora.r else None
            self.policy = build_policy(model, lora=self.lora, int8_base=params.grpo.int8_base,
                                       fused_lora=params.grpo.fused_lora)
            self.engine = make_engine(self.spec, self.policy, self.tokenizer)  # the base: no policy warm start under it
            self.engines.append(self.engine)
            self.warm_start = None
            if params.rubric_generator.warm_start == "oracle":
                trajectories, questions = warm_start_sources(params)
                self.warm_start = WarmStartInputs(questions, self.tokenizer, self._rebase, trajectories)
        except BaseException:
            self.close()
            raise

    def _rebase(self, trained, adapter: Path):
        old = self.engines.pop()
        if hasattr(old, "close"):
            old.close()
        restore_fp32(trained.model)  # int8 copies of the base would go stale under the merge
        fresh = build_policy(trained.model.merge_and_unload(), lora=self.lora, int8_base=self.params.grpo.int8_base,
                             fused_lora=self.params.grpo.fused_lora)
        self.engines.append(make_engine(self.spec, fresh, self.tokenizer, base_adapters=[adapter]))
        return fresh, self.engines[-1]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def train(self, points: list[BranchingPoint], evaluator: ChatModel, folder: Path, *,
              reward: RewardKind = "listwise",
              on_metrics: Callable[[int, dict[str, float]], None] | None = None) -> RubricTrainResult:
        """:func:`run_training` of this generator, rubrics scored by ``evaluator``."""
        return run_training(self.params, self.policy, self.engine, evaluator, points, folder,
                            render=chat_template_renderer(self.tokenizer), reward=reward,
                            pad_token_id=self.tokenizer.pad_token_id or 0, on_metrics=on_metrics,
                            warm_start=self.warm_start)

    def close(self) -> None:
        for e in self.engines:
            if hasattr(e, "close"):
                e.close()
