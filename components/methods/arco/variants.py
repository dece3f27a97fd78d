"""ARCO (Adaptive Rubric CO-evolution) as ``train_policy`` variants, params section ``arco``: ``arco`` (the policy
learns from the outcome reward, then from the per-step rewards of a rubric model mu that a teacher's criteria warm
up and the policy's own trajectories keep updating), ``arco_frozen`` (mu warmed up, never updated: no
co-evolution) and ``arco_no_decomp`` (mu's score head regressed to the terminal reward at every step instead of the
sum constraint: ``per_step_outcome_loss``). mu is a model of its own with its own AdamW, stepped in
``on_step_end`` and saved in every checkpoint. The run step by step, the choices the summary leaves open and where
this differs from it are in docs/methods/arco.md; a paper-profile run must pass
:func:`components.methods.arco.model_setup.setup_overrides` or the builder refuses it.

    python -m tasks.train_policy --variant arco          # or arco_frozen, arco_no_decomp
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.evaluation.metrics import exact_match_yes_no_first3
from components.methods.arco.criteria import (
    Annotation,
    ArcoStep,
    annotate,
    step_messages,
    trajectory_steps,
    warmup_rows,
)
from components.methods.arco.decomposition import (
    LOSSES,
    class_balanced_weights,
    criteria_diversity,
    oracle_step_quality,
    position_bucket_advantages,
    step_advantages,
    step_buckets,
    step_diagnostics,
    terminal_reward,
)
from components.methods.arco.model_setup import check_setup, load_backbone, setup_overrides, sparse_steps
from components.methods.arco.params import ArcoParams
from components.methods.arco.rubric_model import ADAPTER, CriteriaSample, RubricModel
from components.params_section import ParamsError
from components.rewards.outcome import OutcomeReward, outcome_reward
from components.run_spec import RunSpec, run_spec
from components.schemas import Criterion, Rubric
from components.training.engines.registry import role_engine
from components.training.grpo.advantages import group_advantages
from components.training.grpo.episodes import Episode, RewardOutput, StepContext
from components.training.model import LoRASettings
from components.variants import VARIANTS, VariantContext, VariantParts

__all__ = ["ArcoReward", "ArcoState", "ScoredEpisode", "build_mu"]

MU_FILE, MU_OPTIMIZER_FILE = "mu.safetensors", "mu_optimizer.pt"


def step_rubric(episode: Episode, step: int, criteria: list[str]) -> Rubric:
    """The K criteria mu wrote for one step of one episode, in the shared rubric type (equal weights: the score
    head, not a weight, says how much each one counts)."""
    k = max(len(criteria), 1)
    return Rubric(id=f"{getattr(episode.prompt, 'id', '')}:g{episode.group}:s{step}",
                  criteria=[Criterion(text=c, weight=1.0 / k, kind="step", stage=step) for c in criteria],
                  source="arco mu (generation head)")


@dataclass
class ScoredEpisode:
    """What mu made of one episode (``episode.info["arco"]``): its steps, the criteria written for each, the
    step rewards (None: no readable criterion) and the terminal reward they should sum to."""

    steps: list[ArcoStep]
    samples: list[CriteriaSample]
    rewards: list[float | None]
    outcome: float


class ArcoState:
    """mu, its warm-up data and its schedule; the run's method state (checkpointed, updated in on_step_end).

    On N data-parallel ranks each rank's mu writes and scores its own share of the episodes (the scores travel in
    the episodes, which the trainer gathers), and mu trains on rank 0 alone, in ``on_step_end`` over the whole
    step's episodes (the teacher called once per episode); the trainer then sends rank 0's state and files (mu's
    weights and optimizer) to the other ranks, so every rank's mu is rank 0's at the next draw."""

    def __init__(self, settings: ArcoParams, mu_factory: Callable[[], RubricModel], teacher: Any = None, *,
                 loss: str = "decomposition", frozen: bool = False, sparse_steps: int = 0,
                 normalize_std: bool = True, eps: float = 1e-6, seed: int = 0):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
        if sparse_steps < settings.warmup_steps:
            raise ValueError(f"arco.sparse_epochs gives {sparse_steps} sparse steps, fewer than arco.warmup_steps="
                             f"{settings.warmup_steps}: the policy would get mu's rewards before mu is warmed up")
        if settings.warmup_steps and teacher is None:
            raise ValueError("arco.warmup_steps > 0 needs a teacher model")
        self.settings, self.teacher, self.loss, self.frozen = settings, teacher, loss, frozen
        self.sparse_steps, self.normalize_std, self.eps, self.seed = sparse_steps, normalize_std, eps, seed
        self._factory = mu_factory
        self._mu: RubricModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.warm = settings.warmup_steps == 0
        self.updates = 0
        self.annotations: list[Annotation] = []
        self.last_rubrics: list[Rubric] = []

    # -- mu and the schedule --------------------------------------------------------------------------------
    @property
    def mu(self) -> RubricModel:
        if self._mu is None:
            with torch.random.fork_rng(devices=[]):  # LoRA init draws from the global RNG; keep rollouts unchanged
                torch.manual_seed(self.seed)
                self._mu = self._factory()
            s = self.settings
            self.optimizer = torch.optim.AdamW(
                [{"params": self._mu.lora_parameters(), "lr": s.lr},
                 {"params": list(self._mu.head.parameters()), "lr": s.head_lr or s.lr}], weight_decay=s.weight_decay)
        return self._mu

    def dense(self, step: int) -> bool:
        """Whether the policy learns from mu's step rewards at trainer step ``step``."""
        return step > self.sparse_steps

    def updates_mu(self, step: int) -> bool:
        """Whether mu is updated after the policy at trainer step ``step``."""
        w = self.settings.warmup_steps
        return not self.frozen and step > w and (step - w) % self.settings.update_every == 0

    # -- reward side ----------------------------------------------------------------------------------------
    def score_episodes(self, episodes: list[Episode]) -> dict[str, float]:
        """mu writes and scores criteria for every step; stores a :class:`ScoredEpisode` in each episode's info."""
        s = self.settings
        views = [trajectory_steps(e.info["trajectory"]) for e in episodes]
        conversations, owners = [], []
        for i, (e, steps) in enumerate(zip(episodes, views)):
            for t in range(len(steps)):
                conversations.append(step_messages(e.prompt.question, steps, t, s.k, s.observation_chars))
                owners.append(i)
        started = time.perf_counter()
        samples = self.mu.write(conversations, temperature=s.criteria_temperature, max_tokens=s.criteria_max_tokens)
        written = time.perf_counter()
        rewards = self.mu.score(samples, micro_batch=s.micro_batch * 2)
        seconds = {"time/write": written - started, "time/score": time.perf_counter() - written}
        scored = []
        for i, (e, steps) in enumerate(zip(episodes, views)):
            mine = [j for j, o in enumerate(owners) if o == i]
            info = ScoredEpisode(steps, [samples[j] for j in mine], [rewards[j] for j in mine],
                                 terminal_reward(e.info["trajectory"], e.prompt, s.terminal_metric))
            e.info["arco"] = info
            scored.append(info)
        metrics = step_diagnostics([x.rewards for x in scored], [x.outcome for x in scored],
                                   [oracle_step_quality(e.prompt, x.steps) for e, x in zip(episodes, scored)])
        metrics.update(criteria_diversity([smp.criteria for smp in samples]))
        metrics["steps"] = float(len(samples))
        metrics["unscored_steps"] = float(sum(r is None for r in rewards))
        metrics.update(seconds)
        return {f"arco/{k}": v for k, v in metrics.items()}

    def advantages(self, episodes: list[Episode], scores: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """The trainer's ``advantage_fn``: the group-centred outcome in the sparse phase (over the group std when
        ``grpo.std_normalize``), dense step advantages after (``arco.dense_baseline``, ``dense_scale``,
        ``dense_std``)."""
        s = self.settings
        groups = [e.group for e in episodes]
        if not self.dense(ctx.step):
            return group_advantages(scores, groups, normalize_std=self.normalize_std, eps=self.eps)
        steps = [e.info["arco"].steps for e in episodes]
        lengths = [len(x) for x in steps]
        if s.dense_baseline == "position_bucket":
            return position_bucket_advantages(scores, lengths, [step_buckets(x) for x in steps], gamma=s.gamma,
                                              scale=s.dense_scale, normalize_std=s.dense_std, eps=self.eps)
        return step_advantages(scores, lengths, groups, gamma=s.gamma, normalize_std=s.dense_std, eps=self.eps,
                               scale=s.dense_scale)

    def fit_weights(self, outcomes: list[float]) -> torch.Tensor | None:
        """Per-trajectory weights of mu's fit loss over one update's (or the warm-up's) trajectories."""
        return class_balanced_weights(outcomes) if self.settings.decomposition_weighting == "class_balanced" else None

    # -- mu's training --------------------------------------------------------------------------------------
    def _loss_pass(self, batch: list[tuple[list[CriteriaSample], float]], denominator: float, *, nll: bool,
                   kl_tokens: int, weights: torch.Tensor | None = None) -> dict[str, float]:
        """Forward and backward one micro-batch of trajectories (``weights``: theirs in the fit loss); returns its
        loss parts. The KL term (when ``kl_tokens``) is the mean over the update's ``kl_tokens`` criteria tokens
        (``kl_reduction=token``) or each step's token mean summed over its trajectory, over ``denominator``
        trajectories (``step``)."""
        mu = self.mu
        flat = [smp for samples, _ in batch for smp in samples]
        out = mu.forward(flat)
        split, start = [], 0
        for samples, _ in batch:
            split.append(out.step_rewards[start : start + len(samples)])
            start += len(samples)
        outcomes = torch.tensor([o for _, o in batch], dtype=torch.float32)
        fit = LOSSES[self.loss](split, outcomes, denominator, weights)
        loss, parts = fit, {"fit": float(fit.detach())}
        if nll:
            ce = -(out.logp * out.mask).sum() / out.mask.sum()
            loss = loss + ce * len(batch) / denominator
            parts["nll"] = float(ce.detach()) * len(batch) / denominator
        if kl_tokens and self.settings.kl_coef > 0:
            sums, counts = mu.kl_per_sample(out)
            if self.settings.kl_reduction == "token":
                kl = sums.sum() / kl_tokens
            else:
                kl = (sums / counts.clamp(min=1)).sum() / denominator
            loss = loss + self.settings.kl_coef * kl
            parts["kl"] = float(kl.detach())
        loss.backward()
        return parts

    def _step_optimizer(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.mu.parameters(), self.settings.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def warm_up(self) -> dict[str, float]:
        """SFT of the generation head on the teacher's criteria plus the fit loss on the same trajectories;
        then the KL reference is taken."""
        s, mu = self.settings, self.mu
        trajectories = []
        for a in self.annotations:
            rows = warmup_rows(a.question, trajectory_steps(a.trajectory), a.criteria, s.k, s.observation_chars)
            trajectories.append(([mu.target_sample(r) for r in rows],
                                 terminal_reward(a.trajectory, a.question, s.terminal_metric)))
        weights = self.fit_weights([o for _, o in trajectories])
        sums: dict[str, float] = {}
        steps = 0
        mu.model.train()
        with mu.adapter(ADAPTER):
            for epoch in range(s.warmup_epochs):
                order = list(range(len(trajectories)))
                random.Random(f"{self.seed}/arco-warmup/{epoch}").shuffle(order)
                for start in range(0, len(order), s.micro_batch):
                    picked = order[start : start + s.micro_batch]
                    chunk = [trajectories[i] for i in picked]
                    w = None if weights is None else weights[picked]
                    for k, v in self._loss_pass(chunk, len(chunk), nll=True, kl_tokens=0, weights=w).items():
                        sums[k] = sums.get(k, 0.0) + v
                    sums["grad_norm"] = sums.get("grad_norm", 0.0) + self._step_optimizer()
                    steps += 1
        mu.snapshot_reference()
        mu.publish(self.updates)  # what writes criteria from now on
        self.warm, self.annotations = True, []
        metrics = {f"mu/warmup_{k}": v / steps for k, v in sums.items()} if steps else {}
        return {**metrics, "mu/warmup_trajectories": float(len(trajectories)), "mu/warmup_optimizer_steps": float(steps)}

    def update(self, episodes: list[Episode]) -> dict[str, float]:
        """One co-evolution update of mu on the step's trajectories (the criteria it wrote for them in the reward)."""
        s = self.settings
        scored = [e.info["arco"] for e in episodes if "arco" in e.info]
        usable = [(x.samples, x.outcome) for x in scored if x.samples and all(r is not None for r in x.rewards)]
        weights = self.fit_weights([o for _, o in usable])
        metrics = {"mu/update_trajectories": float(len(usable)), "mu/update_skipped": float(len(scored) - len(usable))}
        if not usable:
            return metrics
        tokens = sum(len(smp.criteria_ids) for samples, _ in usable for smp in samples)
        sums: dict[str, float] = {}
        self.mu.model.train()
        with self.mu.adapter(ADAPTER):
            for _ in range(s.update_epochs):
                for start in range(0, len(usable), s.micro_batch):
                    parts = self._loss_pass(usable[start : start + s.micro_batch], len(usable), nll=False,
                                            kl_tokens=tokens,
                                            weights=None if weights is None else weights[start : start + s.micro_batch])
                    for k, v in parts.items():
                        sums[k] = sums.get(k, 0.0) + v
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + self._step_optimizer()
        self.updates += 1
        self.mu.publish(self.updates)
        metrics.update({f"mu/{k}": v / s.update_epochs for k, v in sums.items()})
        return metrics

    async def _annotate(self, episodes: list[Episode]) -> dict[str, float]:
        import asyncio

        s = self.settings
        views = [trajectory_steps(e.info["trajectory"]) for e in episodes]
        results = await asyncio.gather(*(annotate(self.teacher, e.prompt, steps, s.k, max_tokens=s.teacher_max_tokens,
                                                  observation_chars=s.observation_chars)
                                         for e, steps in zip(episodes, views)))
        failures = 0
        for e, (criteria, _why) in zip(episodes, results):
            if criteria is None:
                failures += 1
            else:
                self.annotations.append(Annotation(e.prompt, e.info["trajectory"], criteria))
        return {"teacher/calls": float(len(episodes)), "teacher/failures": float(failures),
                "teacher/annotated": float(len(self.annotations))}

    async def on_step_end(self, trainer: Any, ctx: StepContext, episodes: list[Episode],
                          scores: torch.Tensor) -> dict[str, float]:
        s = self.settings
        metrics = {"policy_dense": float(self.dense(ctx.step)), "mu/updated": 0.0}
        started = time.perf_counter()
        if not self.warm and ctx.step <= s.warmup_steps:
            metrics.update(await self._annotate(episodes))
            metrics["time/teacher_annotate"] = time.perf_counter() - started
            if ctx.step == s.warmup_steps:
                started = time.perf_counter()
                metrics.update(self.warm_up())
                metrics["time/mu_warmup"] = time.perf_counter() - started
        elif self.warm and self.updates_mu(ctx.step):
            metrics.update(self.update(episodes))
            metrics["mu/updated"] = 1.0
            metrics["time/mu_update"] = time.perf_counter() - started
        metrics["mu/updates"] = float(self.updates)
        metrics["mu/warm"] = float(self.warm)
        self.last_rubrics = [step_rubric(e, k, smp.criteria) for e in episodes
                             if isinstance(e.info.get("arco"), ScoredEpisode) for k, smp in enumerate(e.info["arco"].samples)]
        return metrics

    def rubrics(self) -> list[Rubric]:
        """The criteria mu wrote at the last step, one rubric per (episode, step), in the shared rubric type."""
        return list(self.last_rubrics)

    # -- data-parallel ranks --------------------------------------------------------------------------------
    def rank_share(self) -> None:
        """Nothing of the draw stays in the state: mu's criteria and scores are in the episodes' info."""

    def merge_ranks(self, parts: list[None]) -> None:
        pass

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # the last step's criteria too: a run resumed after its last checkpoint rewrites that step's rubrics/ log
        # from them
        return {"warm": self.warm, "updates": self.updates, "mu_built": self._mu is not None,
                "annotations": [a.to_json() for a in self.annotations],
                "last_rubrics": [r.model_dump(mode="json") for r in self.last_rubrics]}

    def write_files(self, folder: Path) -> None:
        if self._mu is None:
            return
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in self._mu.state_tensors().items()}, str(Path(folder) / MU_FILE))
        torch.save(self.optimizer.state_dict(), Path(folder) / MU_OPTIMIZER_FILE)

    def load_state_dict(self, state: dict[str, Any] | None, files_dir: Path | None) -> None:
        state = state or {}
        self.warm = bool(state.get("warm", self.settings.warmup_steps == 0))
        self.updates = int(state.get("updates", 0))
        self.annotations = [Annotation.from_json(a) for a in state.get("annotations", [])]
        self.last_rubrics = [Rubric.model_validate(r) for r in state.get("last_rubrics", [])]
        if not state.get("mu_built"):
            return
        path = None if files_dir is None else Path(files_dir) / MU_FILE
        if path is None or not path.exists():
            raise FileNotFoundError(f"the checkpoint's method state says mu was built but {path} is missing")
        from safetensors.torch import load_file

        self.mu.load_state_tensors(load_file(str(path)))
        self.optimizer.load_state_dict(torch.load(Path(files_dir) / MU_OPTIMIZER_FILE, map_location="cpu", weights_only=True))
        self.mu.publish(self.updates)

    def close(self) -> None:
        """Stop mu's engine when it runs outside this process (a llama.cpp server)."""
        if self._mu is not None:
            self._mu.close()


class ArcoReward:
    """The variant's reward: the outcome reward (F1, -1 if format-invalid) in the sparse phase, mu's step rewards
    (one value per step, None beyond an episode's last step) after it; mu scores every step once warm."""

    def __init__(self, state: ArcoState, outcome: OutcomeReward | None = None):
        self.state, self.outcome = state, outcome or OutcomeReward()

    def __call__(self, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        out = self.outcome(episodes, ctx)
        metrics = dict(out.metrics)
        metrics["em_yes_no_first3"] = float(np.mean([exact_match_yes_no_first3(e.info["trajectory"].final_answer,
                                                                                 e.prompt.answers) for e in episodes]))
        if self.state.warm:
            metrics.update(self.state.score_episodes(episodes))
        if not self.state.dense(ctx.step):
            return RewardOutput(list(out.scores), metrics)
        width = max(max((s.segment_id + 1 for e in episodes for row in e.rows for s in row if s.trainable), default=1),
                    max(len(e.info["arco"].steps) for e in episodes))
        scores = [list(e.info["arco"].rewards) + [None] * (width - len(e.info["arco"].rewards)) for e in episodes]
        return RewardOutput(scores, metrics)


# ------------------------------------------------------------------------------------------ building


def build_mu(spec: RunSpec, settings: ArcoParams, *, int8_base: bool | None = None,
             fused_lora: bool | None = None) -> RubricModel:
    """mu as the variants build it: ``arco.model_role``'s weights, the run's LoRA settings, mu's head and memory
    options, under the run's seed; the speed options default to the run's ``grpo.int8_base`` / ``grpo.fused_lora``
    (``perf/bench_arco_mu.py`` sets them per mode)."""
    s, lora = settings, spec.lora
    lora_settings = LoRASettings(r=lora.r or LoRASettings().r, alpha=lora.alpha, dropout=lora.dropout)
    model, tokenizer = load_backbone(spec, s.model_role)
    # None: transformers' generate on mu itself
    engine = role_engine(spec, s.engine, s.model_role, tokenizer, parallel=s.write_batch, logprobs=False)
    return RubricModel(model, tokenizer, lora=lora_settings, head_width=s.head_width, k=s.k, seed=spec.seed,
                       engine=engine, score_head=s.score_head, score_readout=s.score_readout,
                       kl_estimator=s.kl_estimator, write_batch=s.write_batch,
                       gradient_checkpointing=s.gradient_checkpointing, micro_batch_tokens=s.micro_batch_tokens,
                       checkpoint_min_tokens=s.checkpoint_min_tokens, prefix_packing=s.prefix_packing,
                       int8_base=spec.grpo.int8_base if int8_base is None else int8_base,
                       fused_lora=spec.grpo.fused_lora if fused_lora is None else fused_lora)


def _build(ctx: VariantContext, *, loss: str, frozen: bool) -> VariantParts:
    params = ctx.params
    s, spec = params.arco, run_spec(params)
    if params.profile == "paper" and (diff := check_setup(s.setup, params.retrieval, params.agent, params.data)):
        raise ParamsError(f"arco.setup: the paper profile runs ARCO on its released setup; this run has {', '.join(diff)}. "
                          f"Add: {' '.join('--set ' + o for o in setup_overrides(s.setup))}")
    teacher = ctx.roles(s.teacher_role) if s.warmup_steps else None
    questions = len(range(params.data.n_train)[params.train_policy.question_slice()])
    state = ArcoState(s, lambda: build_mu(spec, s), teacher, loss=loss, frozen=frozen,
                      sparse_steps=sparse_steps(s, questions, params.grpo.prompts_per_step),
                      normalize_std=params.grpo.std_normalize, eps=params.grpo.adv_eps, seed=params.seed)
    return VariantParts(reward_fn=ArcoReward(state, outcome_reward(ctx.params.grpo)), advantage_fn=state.advantages, method=state)


@VARIANTS.register("arco")
def build_arco(ctx: VariantContext) -> VariantParts:
    return _build(ctx, loss="decomposition", frozen=False)


@VARIANTS.register("arco_frozen")
def build_arco_frozen(ctx: VariantContext) -> VariantParts:
    return _build(ctx, loss="decomposition", frozen=True)


@VARIANTS.register("arco_no_decomp")
def build_arco_no_decomp(ctx: VariantContext) -> VariantParts:
    return _build(ctx, loss="per_step_outcome", frozen=False)
