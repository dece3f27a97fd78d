"""A small GRPO loop that every method trains through (Co-ReAct's rubric generator, ARBOR, SS-GRPO, ARCO).

One :meth:`GRPOTrainer.step`:

1. take the next ``prompts_per_step`` prompts (seeded shuffle, position saved in checkpoints);
2. sample ``group_size`` rollouts per prompt with ``rollout_fn`` (single turn by default;
   :func:`components.training.agent_rollout.make_agent_rollout` runs the ReAct agent loop instead and
   returns segments with tool observations marked non-trainable);
3. score them with ``reward_fn``; a ``None`` score drops that sample from its group (never scored 0);
4. turn rewards into per-token advantages (group-normalised scalar by default; ``advantage_fn`` lets
   SS-GRPO / ARCO place per-stage or per-step values);
5. :meth:`GRPOTrainer.update`: ``ppo_epochs`` passes of clipped surrogate + k3 KL, gradient clipping,
   AdamW, one scheduler step; then the engine picks up the new weights;
6. log metrics to ``on_metrics(step, metrics)`` and checkpoint every ``checkpoint_every`` steps.

Usage::

    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tok), reward_fn, prompts,
                          GRPOConfig(group_size=8, learning_rate=2e-6, kl_coef=5e-3),
                          checkpoint_dir="outputs/ckpt", on_metrics=log)
    trainer.resume()            # continues from outputs/ckpt/latest if there is one
    trainer.train(num_steps=100)

SS-GRPO / ARCO: let ``rollout_fn`` tag segments with ``segment_id`` (stage or step index), let ``reward_fn``
return a list of K values per sample, and pass::

    def advantage_fn(samples, rewards, batch):
        adv = group_advantages(torch.tensor(rewards), [s.group for s in samples])  # [n, K], per column
        return segment_advantages(adv, batch.segment_ids, batch.loss_mask)         # [n, T]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from components.training.advantages import broadcast_sequence_advantages, episode_group_advantages
from components.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.training.losses import LossAgg, policy_loss
from components.training.model import Policy
from components.training.prompts import PromptSampler
from components.training.rollout import RolloutBatch, RolloutEngine, RolloutSegment, SamplingParams, assemble

__all__ = ["GRPOConfig", "GRPOTrainer", "MethodState", "Sample", "single_turn_rollout"]


@dataclass
class GRPOConfig:
    """GRPO hyper-parameters. Defaults follow Co-ReAct appendix A where it gives a value
    (G=8, lr 2e-6, KL 5e-3, grad clip 1.0); ``clip_eps`` 0.2 is the usual PPO value."""

    group_size: int = 8  # rollouts per prompt (G)
    prompts_per_step: int = 1  # prompts (groups) per step; batch = prompts_per_step * group_size
    ppo_epochs: int = 1  # passes over each batch
    mini_batch_size: int | None = None  # sequences per optimizer step; None: whole batch
    micro_batch_size: int | None = None  # sequences per forward/backward (gradient accumulation)
    learning_rate: float = 2e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0  # linear warm-up, in trainer steps
    total_steps: int | None = None  # linear decay to 0 at this step; None: constant after warm-up
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # None: same as clip_eps
    kl_coef: float = 5e-3  # 0 skips the reference forward pass
    loss_agg: LossAgg = "token_mean"
    normalize_std: bool = True  # divide by the group std (False: Dr. GRPO)
    adv_eps: float = 1e-6
    max_grad_norm: float = 1.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0  # prompt order
    shuffle: bool = True
    checkpoint_every: int = 0  # steps; 0: only explicit save()
    keep_last: int | None = 2
    recompute_old_logprobs: bool = True  # False: use the engine's sampling log-probs

    def __post_init__(self) -> None:
        positive = ("group_size", "prompts_per_step", "ppo_epochs")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("mini_batch_size", "micro_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1 or None, got {value}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"GRPOConfig.clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.kl_coef < 0 or self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("GRPOConfig.kl_coef must be >= 0, learning_rate and max_grad_norm > 0")
        if self.loss_agg not in LossAgg.__args__:
            raise ValueError(f"GRPOConfig.loss_agg must be one of {LossAgg.__args__}, got {self.loss_agg!r}")
        if isinstance(self.sampling, Mapping):
            self.sampling = SamplingParams(**self.sampling)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Sample:
    """One rollout: the dataset item it answers, its group (prompt index within the step), its token
    segments, decoded response text if known, and free-form ``info`` for the reward (final answer, tool
    calls, ...)."""

    prompt: Any
    group: int
    segments: list[RolloutSegment]
    text: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def response_ids(self) -> list[int]:
        return [t for s in self.segments if s.trainable for t in s.token_ids]


RewardFn = Callable[[list[Sample]], Sequence[Any]]
RolloutFn = Callable[[RolloutEngine, list[Any], int, SamplingParams], list[Sample]]
AdvantageFn = Callable[[list[Sample], list[Any], RolloutBatch], torch.Tensor]


class MethodState(Protocol):
    """Method-specific state stored inside each checkpoint (rubric memory, judge buffers, banks).
    ``write_files(folder)`` is optional, for state that is not JSON."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any] | None, files_dir: Path | None) -> None: ...


def _prompt_input(item: Any) -> Any:
    return item["prompt"] if isinstance(item, Mapping) else item


def single_turn_rollout(
    engine: RolloutEngine, prompts: list[Any], group_size: int, sampling: SamplingParams
) -> list[Sample]:
    """``group_size`` continuations of each prompt; items are text, token ids, or mappings with "prompt"."""
    flat = [p for p in prompts for _ in range(group_size)]
    gens = engine.generate([_prompt_input(p) for p in flat], sampling)
    return [
        Sample(
            prompt=p,
            group=i // group_size,
            segments=[RolloutSegment(g.prompt_ids, False), RolloutSegment(g.token_ids, True, g.logprobs)],
            text=g.text,
            info={"finish_reason": g.finish_reason},
        )
        for i, (p, g) in enumerate(zip(flat, gens, strict=True))
    ]


class GRPOTrainer:
    """Owns the optimizer, scheduler, prompt position and metrics history of one GRPO run."""

    def __init__(
        self,
        policy: Policy,
        engine: RolloutEngine,
        reward_fn: RewardFn,
        prompts: Sequence[Any],
        config: GRPOConfig,
        *,
        rollout_fn: RolloutFn = single_turn_rollout,
        advantage_fn: AdvantageFn | None = None,
        on_metrics: Callable[[int, dict[str, float]], None] | None = None,
        checkpoint_dir: str | Path | None = None,
        method: MethodState | None = None,
        pad_token_id: int | None = None,
    ):
        self.policy, self.engine, self.reward_fn = policy, engine, reward_fn
        self.prompts, self.config = list(prompts), config
        self.rollout_fn, self.advantage_fn, self.on_metrics = rollout_fn, advantage_fn, on_metrics
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.method = method
        self.pad_token_id = pad_token_id if pad_token_id is not None else getattr(engine, "pad_token_id", 0)
        self.sampler = PromptSampler(len(self.prompts), config.seed, config.shuffle)
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=config.learning_rate,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step_count = 0
        self.history: list[dict[str, float]] = []

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.total_steps is None:
            return 1.0
        return max(0.0, (c.total_steps - step) / max(1, c.total_steps - c.warmup_steps))

    @property
    def _temperature(self) -> float:
        t = self.config.sampling.temperature
        return t if t > 0 else 1.0

    def _default_advantages(
        self, samples: list[Sample], rewards: list[Any], batch: RolloutBatch
    ) -> torch.Tensor:
        # Rows of one multi-turn episode (info["episode"]) share one advantage and count once per group.
        adv = episode_group_advantages(
            [float(r) for r in rewards],
            [s.group for s in samples],
            [s.info.get("episode", ("row", i)) for i, s in enumerate(samples)],
            normalize_std=self.config.normalize_std,
            eps=self.config.adv_eps,
        )
        return broadcast_sequence_advantages(adv, batch.loss_mask)

    def _chunks(self, index: torch.Tensor, size: int | None) -> list[torch.Tensor]:
        return list(index.split(size or len(index)))

    @torch.no_grad()
    def _logprobs(self, batch: RolloutBatch, reference: bool) -> torch.Tensor:
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        was_training = self.policy.model.training
        self.policy.model.eval()
        for idx in self._chunks(torch.arange(len(batch)), self.config.micro_batch_size):
            sub = batch.select(idx)
            lp = self.policy.token_logprobs(
                sub.input_ids.to(self.policy.device),
                sub.attention_mask.to(self.policy.device),
                temperature=self._temperature,
                reference=reference,
            )
            out[idx, : lp.shape[1]] = lp.float().cpu()
        self.policy.model.train(was_training)
        return out

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Run ``ppo_epochs`` clipped-surrogate passes over ``batch`` with per-token ``advantages`` [B, T].

        Callers with their own rollouts (SS-GRPO, ARCO, the rubric generator) may call this directly.
        """
        c = self.config
        if advantages.shape != batch.input_ids.shape:
            raise ValueError(f"advantages {tuple(advantages.shape)} != batch {tuple(batch.input_ids.shape)}")
        if c.recompute_old_logprobs or batch.old_logprobs is None:
            old = self._logprobs(batch, reference=False)
        else:
            old = batch.old_logprobs
        ref = self._logprobs(batch, reference=True) if c.kl_coef > 0 else None
        params = self.policy.trainable_parameters()
        device = self.policy.device
        self.policy.model.train()
        sums: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0}
        weighted = {"kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0}
        ratio_min, ratio_max, tokens, grad_norms = float("inf"), float("-inf"), 0, []
        for _ in range(c.ppo_epochs):
            for mini in self._chunks(torch.arange(len(batch)), c.mini_batch_size):
                mask = batch.loss_mask[mini]
                num_tokens = float(mask.sum())
                num_seqs = float((mask.sum(dim=1) > 0).sum())
                self.optimizer.zero_grad(set_to_none=True)
                for micro in self._chunks(mini, c.micro_batch_size):
                    sub = batch.select(micro)
                    w = sub.input_ids.shape[1]
                    logp = self.policy.token_logprobs(
                        sub.input_ids.to(device), sub.attention_mask.to(device), temperature=self._temperature
                    )
                    loss, m = policy_loss(
                        logp,
                        old[micro, :w].to(device),
                        advantages[micro, :w].to(device),
                        sub.loss_mask.to(device),
                        None if ref is None else ref[micro, :w].to(device),
                        clip_eps=c.clip_eps,
                        clip_eps_high=c.clip_eps_high,
                        kl_coef=c.kl_coef,
                        agg=c.loss_agg,
                        num_tokens=num_tokens,
                        num_seqs=num_seqs,
                    )
                    loss.backward()
                    sums["loss"] += m.loss
                    sums["pg_loss"] += m.pg_loss
                    for k in weighted:
                        weighted[k] += getattr(m, k) * m.num_tokens
                    if m.num_tokens:
                        ratio_min, ratio_max = min(ratio_min, m.ratio_min), max(ratio_max, m.ratio_max)
                    tokens += m.num_tokens
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)))
                self.optimizer.step()
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        n_updates = len(grad_norms)
        metrics = {k: v / n_updates for k, v in sums.items()}
        metrics.update({k: v / max(tokens, 1) for k, v in weighted.items()})
        metrics.update(
            ratio_min=ratio_min if tokens else 1.0,
            ratio_max=ratio_max if tokens else 1.0,
            grad_norm=sum(grad_norms) / n_updates,
            grad_norm_max=max(grad_norms),
            lr=lr,
            optimizer_steps=float(n_updates),
            tokens=float(tokens / c.ppo_epochs),
        )
        return metrics

    def step(self) -> dict[str, float]:
        """One GRPO step (rollout, reward, advantages, update); returns and logs its metrics."""
        c = self.config
        t0 = time.perf_counter()
        prompts = [self.prompts[i] for i in self.sampler.next(c.prompts_per_step)]
        samples = self.rollout_fn(self.engine, prompts, c.group_size, c.sampling)
        t1 = time.perf_counter()
        rewards = list(self.reward_fn(samples))
        if len(rewards) != len(samples):
            raise ValueError(f"reward_fn returned {len(rewards)} values for {len(samples)} samples")
        kept = [i for i, r in enumerate(rewards) if r is not None]
        t2 = time.perf_counter()
        metrics: dict[str, float] = {"step": float(self.step_count + 1)}
        if kept:
            samples_k, rewards_k = [samples[i] for i in kept], [rewards[i] for i in kept]
            batch = assemble([s.segments for s in samples_k], pad_token_id=self.pad_token_id)
            adv_fn = self.advantage_fn or self._default_advantages
            advantages = adv_fn(samples_k, rewards_k, batch)
            metrics.update(self.update(batch, advantages))
            self.engine.update_weights(self.policy, self.step_count + 1)
            scalar = [float(np.mean(r)) for r in rewards_k]
            metrics.update(
                {
                    "reward/mean": float(np.mean(scalar)),
                    "reward/std": float(np.std(scalar)),
                    "advantage/abs_mean": float(advantages.abs().sum() / batch.loss_mask.sum().clamp(min=1)),
                    "response_length": float(np.mean([len(s.response_ids) for s in samples_k])),
                }
            )
        else:
            self.scheduler.step()
        metrics["reward/none_fraction"] = 1.0 - len(kept) / max(len(samples), 1)
        self.step_count += 1
        self.history.append(dict(metrics))
        timings = {"time/rollout": t1 - t0, "time/reward": t2 - t1, "time/update": time.perf_counter() - t2}
        if self.on_metrics is not None:
            self.on_metrics(self.step_count, {**metrics, **timings})
        if (
            self.checkpoint_dir is not None
            and c.checkpoint_every
            and self.step_count % c.checkpoint_every == 0
        ):
            self.save()
        return metrics

    def train(self, num_steps: int) -> list[dict[str, float]]:
        """Run steps until ``step_count`` reaches ``num_steps`` (so a resumed run stops at the same step)."""
        while self.step_count < num_steps:
            self.step()
        return self.history

    def save(self, root: str | Path | None = None) -> Path:
        root = Path(root) if root is not None else self.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint directory: pass one to save() or to GRPOTrainer(checkpoint_dir=)")
        method_files = getattr(self.method, "write_files", None)
        return save_checkpoint(
            root,
            self.step_count,
            model=self.policy.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            trainer_state={
                "data": self.sampler.state_dict(),
                "history": self.history,
                "config": self.config.to_dict(),
            },
            method_state=self.method.state_dict() if self.method is not None else None,
            method_files=method_files,
            keep_last=self.config.keep_last,
        )

    def resume(self, path: str | Path | None = None) -> bool:
        """Restore everything from ``path`` (a checkpoint or a root; default: ``checkpoint_dir``).
        Returns False, changing nothing, when the root holds no checkpoint yet."""
        path = Path(path) if path is not None else self.checkpoint_dir
        if path is None or (not (path / "manifest.json").exists() and latest_checkpoint(path) is None):
            return False
        ckpt = load_checkpoint(
            path, model=self.policy.model, optimizer=self.optimizer, scheduler=self.scheduler
        )
        self.step_count = ckpt.step
        self.history = list(ckpt.trainer_state["history"])
        self.sampler.load_state_dict(ckpt.trainer_state["data"])
        if self.method is not None:
            self.method.load_state_dict(ckpt.method_state, ckpt.method_dir)
        self.engine.update_weights(self.policy, self.step_count)
        return True
