"""The one GRPO loop every method trains through (Co-ReAct's rubric generator, ARBOR, SS-GRPO, ARCO): a step
draws prompts, samples a group of episodes per prompt, scores them with the method's reward, places group-relative
advantages on each episode's tokens by segment, runs the clipped-surrogate update and the method's hook, and
checkpoints (:meth:`GRPOTrainer.step` lists the order). The configuration is ``params.grpo``
(:class:`components.training.params.GRPOParams`), one set of names for the YAML file and the code::

    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tok), reward_fn, prompts, params.grpo,
                          seed=params.seed, checkpoint_dir="outputs/ckpt", on_metrics=log)
    trainer.resume()            # continues from outputs/ckpt/latest if there is one
    trainer.train(params.grpo.steps)
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from components.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.training.distributed import Ranks, current_ranks
from components.training.engines.rollout import (
    RolloutBatch,
    RolloutEngine,
    RolloutSegment,
    SamplingParams,
    assemble,
    token_budget_groups,
)
from components.training.grpo.advantages import group_advantages, place_episode_advantages
from components.training.grpo.episodes import (
    Episode,
    MethodState,
    RewardFn,
    RewardOutput,
    StepContext,
    call_reward,
    run_method_hook,
    score_matrix,
)
from components.training.losses import policy_loss
from components.training.model import Policy, kept_if_short
from components.training.params import DeepSpeedParams, GRPOParams
from components.training.prompt_order import PromptSampler
from components.training.speed import process_memory as memory
from components.training.speed.prefix_pack import PrefixPack, pack_rows, packed_logprobs, takes_packs
from components.training.stepper import TorchStepper, make_stepper

__all__ = ["GRPOTrainer", "LossInputs", "reads_engine_logprobs", "rollout_sampling", "single_turn_rollout", "wall_clock"]

RolloutFn = Callable[[RolloutEngine, list[Any], int, SamplingParams], list[Episode]]
AdvantageFn = Callable[[list[Episode], torch.Tensor, StepContext], torch.Tensor]


@dataclass
class LossInputs:
    """What a method's ``loss_fn`` sees for one micro-batch: its rows (``rows``: indices into the step's
    batch; ``row_episode[rows]`` gives their episodes), the policy's per-token log-probs (with grad; over the
    micro-batch's loss-mask positions only, zero elsewhere), the last hidden states ``[b, T, H]`` at every
    position (with grad), the advantages and loss mask, the mini-batch token and
    sequence counts the main loss is divided by, and the step context."""

    batch: RolloutBatch
    rows: torch.Tensor
    row_episode: torch.Tensor
    logp: torch.Tensor
    hidden: torch.Tensor
    advantages: torch.Tensor
    num_tokens: float
    num_seqs: float
    ctx: StepContext | None


LossFn = Callable[[LossInputs], "tuple[torch.Tensor, dict[str, float]]"]


def reads_engine_logprobs(config: GRPOParams) -> bool:
    """Whether the update reads the rollout engine's log-probs (``old_logprobs: engine``, TIS); otherwise the
    trainer scores the tokens itself and the engine need not (TRL's transformers path never does)."""
    return config.old_logprobs == "engine" or config.tis_cap is not None


def rollout_sampling(config: GRPOParams, stop_token_ids: Sequence[int] = ()) -> SamplingParams:
    """The engine sampling of a GRPO run, from its configuration."""
    return SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                          top_p=config.top_p, top_k=config.top_k, stop_token_ids=tuple(stop_token_ids),
                          logprobs=reads_engine_logprobs(config))


def _prompt_input(item: Any) -> Any:
    return item["prompt"] if isinstance(item, Mapping) else item


def single_turn_rollout(
    engine: RolloutEngine, prompts: list[Any], group_size: int, sampling: SamplingParams
) -> list[Episode]:
    """``group_size`` continuations of each prompt; items are text, token ids, or mappings with "prompt"."""
    flat = [p for p in prompts for _ in range(group_size)]
    gens = engine.generate([_prompt_input(p) for p in flat], sampling)
    return [
        Episode(
            prompt=p,
            group=i // group_size,
            rows=[[RolloutSegment(g.prompt_ids, False), RolloutSegment(g.token_ids, True, g.logprobs)]],
            text=g.text,
            info={"finish_reason": g.finish_reason},
        )
        for i, (p, g) in enumerate(zip(flat, gens, strict=True))
    ]


def wall_clock(metrics: dict[str, float]) -> dict[str, float]:
    """Take the wall-clock figures a reward or method reported (a ``time`` part in the key: ``reward/arco/time/write``)
    out of ``metrics`` and return them as the trainer's own timings are named (``time/reward/arco/write``): like
    those, they go to ``metrics.csv`` but not into the history a checkpoint holds, so a resumed run's history still
    equals the uninterrupted one's."""
    keys = [k for k in metrics if "/time/" in k]
    return {"time/" + k.replace("/time/", "/", 1): metrics.pop(k) for k in keys}


_SUMMED = ("calls", "cost", "count", "errors", "failures", "retries", "steps", "tokens")


def _combined_reward_metrics(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The ranks' reward metrics as one reward over the whole draw would report them: counts (a last name part
    with calls, cost, count, errors, failures, retries, steps or tokens in it: ARCO's scored steps) summed, any other figure (a rate, a mean)
    averaged over the ranks weighted by their episodes."""
    keys = dict.fromkeys(k for _, m in parts for k in m)
    out = {}
    for k in keys:
        if any(word in k.rsplit("/", 1)[-1] for word in _SUMMED):
            out[k] = sum(float(m.get(k, 0.0)) for _, m in parts)
        else:
            have = [(n, float(m[k])) for n, m in parts if k in m]
            weight = sum(n for n, _ in have)
            out[k] = sum(n * v for n, v in have) / weight if weight else sum(v for _, v in have) / len(have)
    return out


def _varied_groups(episodes: list[Episode], raw_scores: list[Any]) -> set[int]:
    """The groups in which some score column holds two different values among the scored episodes: the
    groups whose group-normalised advantages are not all 0 (DAPO's "0 < accuracy < 1", for any reward)."""
    scores = score_matrix(raw_scores)
    by_group: dict[int, list[int]] = {}
    for i, e in enumerate(episodes):
        by_group.setdefault(e.group, []).append(i)
    varied = set()
    for group, rows in by_group.items():
        for column in scores[rows].T:
            values = column[~torch.isnan(column)]
            if len(values) > 1 and bool(values.max() > values.min()):
                varied.add(group)
                break
    return varied


class GRPOTrainer:
    """Owns the optimizer, scheduler, prompt position and metrics history of one GRPO run.

    ``extra_modules`` (name -> module) are trained beside the policy (their parameters join the optimizer)
    and saved in checkpoints: ARCO's score head. ``loss_fn`` adds a method's term to every micro-batch's
    loss (see :class:`LossInputs`). ``sampling`` overrides the engine sampling derived from ``config``.

    On N data-parallel ranks (:class:`components.training.distributed.Ranks`) every rank draws the same prompts and
    rolls out and scores its contiguous share of whole groups; episodes and scores are gathered, so advantages,
    dynamic sampling and metrics cover the whole step on every rank, and each rank trains its own episodes' rows
    (the loss over the whole step's token counts, gradients summed; ``mini_batch_size`` rows over all ranks; under
    ZeRO a rank short of micro-batches adds empty forward and backward passes; under ZeRO-3 the passes without
    gradient, rollouts included, run on the whole weights, gathered once: :meth:`whole_weights`). Rank 0 alone
    calls ``on_metrics``; every rank writes its own optimizer and RNG files. A method merges what the ranks' rewards
    left in it after each draw (``rank_share``/``merge_ranks``: ARBOR, RAR, ARCO) and its hooks run on rank 0, their
    state and files (ARCO's mu) sent to the others; a method with hooks or state that does not (RubricEM) is refused
    on N ranks.
    """

    def __init__(
        self,
        policy: Policy,
        engine: RolloutEngine,
        reward_fn: RewardFn,
        prompts: Sequence[Any],
        config: GRPOParams,
        *,
        rollout_fn: RolloutFn = single_turn_rollout,
        advantage_fn: AdvantageFn | None = None,
        loss_fn: LossFn | None = None,
        extra_modules: Mapping[str, nn.Module] | None = None,
        on_metrics: Callable[[int, dict[str, float]], None] | None = None,
        checkpoint_dir: str | Path | None = None,
        method: MethodState | None = None,
        pad_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        max_length: int | None = None,
        zero: DeepSpeedParams | None = None,
        ranks: Ranks | None = None,
    ):
        if not isinstance(config, GRPOParams):
            raise TypeError(f"config must be components.training.params.GRPOParams (params.grpo), got {type(config).__name__}")
        self.policy, self.engine, self.reward_fn = policy, engine, reward_fn
        self.prompts, self.config = list(prompts), config
        self.rollout_fn, self.advantage_fn, self.loss_fn = rollout_fn, advantage_fn, loss_fn
        self.on_metrics = on_metrics
        self.extra_modules = dict(extra_modules or {})
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.method = method
        # the engine scores its tokens only when the update reads those scores
        self.sampling = replace(sampling or rollout_sampling(config), logprobs=reads_engine_logprobs(config))
        self.max_length = max_length
        self.pad_token_id = pad_token_id if pad_token_id is not None else getattr(engine, "pad_token_id", 0)
        self.sampler = PromptSampler(len(self.prompts), seed, config.shuffle)
        params = policy.trainable_parameters() + [
            p for m in self.extra_modules.values() for p in m.parameters() if p.requires_grad
        ]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.ranks = ranks if ranks is not None else current_ranks()
        if self.ranks.parallel and not hasattr(method, "merge_ranks"):
            hooks = [h for h in ("on_step_end", "on_train_end", "attach", "state_dict") if hasattr(method, h)]
            if hooks:
                why = getattr(method, "not_data_parallel", None)
                raise ValueError(f"{type(method).__name__} has step hooks or state ({', '.join(hooks)}), which are "
                                 f"not data-parallel{f' ({why})' if why else ''}: train it in one process, "
                                 f"not {self.ranks.world_size} ranks")
        # DeepSpeed's stepper replaces the optimizer with its ZeRO optimizer (over the same parameter groups the
        # scheduler holds), so checkpoints save its state
        self.stepper = make_stepper(policy.model, self.optimizer, zero, max_grad_norm=config.max_grad_norm,
                                    ranks=self.ranks)
        self.optimizer = self.stepper.optimizer
        self.step_count = 0
        self.history: list[dict[str, float]] = []
        self._own_groups: set[int] = set()  # the groups of this step this rank rolled out (all of them in one process)
        attach = getattr(method, "attach", None)
        if attach is not None:  # e.g. ARCO's rubric model adds its adapter to the policy's own base model
            attach(self)

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.total_steps is None:
            return 1.0
        return max(0.0, (c.total_steps - step) / max(1, c.total_steps - c.warmup_steps))

    @property
    def _temperature(self) -> float:
        t = self.sampling.temperature
        return t if t > 0 else 1.0

    def _default_advantages(self, episodes: list[Episode], scores: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return group_advantages(scores, [e.group for e in episodes], normalize_std=self.config.std_normalize,
                                eps=self.config.adv_eps, unbiased_std=self.config.adv_std == "sample")

    def _chunks(self, index: torch.Tensor, size: int | None) -> list[torch.Tensor]:
        return list(index.split(size or len(index)))

    def _micro_batches(self, index: torch.Tensor, batch: RolloutBatch) -> list[torch.Tensor]:
        """Micro-batches of rows ``index``: ``micro_batch_size`` rows in order, or, with
        ``micro_batch_tokens``, rows sorted by length and packed while rows x longest row stays within the
        budget (one row may exceed it alone), so short rows are not padded to the longest of the batch; with
        ``prefix_packing`` too, shared-prefix packs of at most that many tokens
        (:mod:`components.training.speed.prefix_pack`): a group's rows share their prompt, and a scratchpad
        episode's turn rows each repeat the turns before it."""
        budget = self.config.micro_batch_tokens
        if budget is None:
            return self._chunks(index, self.config.micro_batch_size)
        if self.config.prefix_packing and self._takes_packs:
            return [torch.tensor(p.rows, dtype=torch.long) for p in pack_rows(batch, index.tolist(), budget)]
        lengths = batch.attention_mask[index].sum(dim=1).tolist()
        return [index[torch.tensor(g, dtype=torch.long)] for g in token_budget_groups(lengths, budget)]

    def _pack(self, sub: RolloutBatch) -> PrefixPack | None:
        """A micro-batch of several rows as one shared-prefix pack (``prefix_packing``); None: a padded pass."""
        c = self.config
        if not (c.prefix_packing and c.micro_batch_tokens is not None and len(sub) > 1 and self._takes_packs):
            return None
        (pack,) = pack_rows(sub, range(len(sub)), None)
        return pack

    @property
    def _takes_packs(self) -> bool:
        return takes_packs(self.policy.model)

    @staticmethod
    def _pass_tokens(sub: RolloutBatch, pack: PrefixPack | None) -> int:
        """Tokens through the model in ``sub``'s forward pass: its pack's, or ``sub`` padded."""
        return sub.input_ids.numel() if pack is None else len(pack)

    @property
    def _lockstep(self) -> bool:
        """Whether every rank must run as many backward passes (DeepSpeed's stepper: ZeRO-2 reduces gradients in
        each one); the plain stepper sums gradients once per optimizer step."""
        return not isinstance(self.stepper, TorchStepper)

    def _null_loss(self) -> torch.Tensor:
        """0 times the policy's log-prob of a padding token after another: a loss whose backward gives every weight
        a zero gradient, through the modules a micro-batch's pass calls, in its order (ZeRO-3 gathers each
        module's parameters in the backward as in the forward: the ranks' gathers must pair up)."""
        ids = torch.full((1, 2), self.pad_token_id, dtype=torch.long, device=self.policy.device)
        logp, _ = self.policy.forward_logprobs(ids, torch.ones_like(ids), temperature=self._temperature,
                                               positions=torch.ones_like(ids, dtype=torch.bool))
        return logp.sum() * 0.0

    def whole_weights(self, needed: bool = True) -> AbstractContextManager[None]:
        """Under ZeRO-3 on N ranks, a span of policy passes without gradient (rollouts, old and reference
        log-probs, a dev evaluation) on the whole weights, gathered once (the stepper's ``full_weights``), so each
        rank runs its own number of them; every rank enters it together, ``needed`` saying whether this one has
        such passes (nothing is gathered when no rank has). Elsewhere nothing: ZeRO-3 in one process keeps
        gathering layer by layer, as its memory (``offload_params``) asks."""
        if self.stepper.forward_in_lockstep and self.ranks.max(needed):
            return self.stepper.full_weights()
        return nullcontext()

    def _trainable_parameters(self) -> list[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def on_policy(self, batch_rows: int) -> bool:
        """Whether one update of ``batch_rows`` rows is exactly on-policy: one epoch, one mini-batch, so
        the weights that score the tokens are the weights that sampled them and the ratio is 1."""
        c = self.config
        size = self._mini_size
        return c.ppo_epochs == 1 and (size is None or size >= batch_rows)

    @property
    def _mini_size(self) -> int | None:
        """Rows of one mini-batch on this rank: ``mini_batch_size`` over the ranks."""
        size = self.config.mini_batch_size
        return size if size is None or not self.ranks.parallel else max(1, -(-size // self.ranks.world_size))

    def _forward(self, sub: RolloutBatch, pack: PrefixPack | None, hidden: bool, reference: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs at the micro-batch's loss-mask positions only (zeros elsewhere) ``[b, w]``, and the last
        hidden states ``[b, w, H]`` when a loss hook needs them, from one forward pass: over ``pack`` (the
        micro-batch's shared-prefix pack, :meth:`_pack`), or padded when it is None."""
        if pack is None:
            return self.policy.forward_logprobs(
                sub.input_ids.to(self.policy.device), sub.attention_mask.to(self.policy.device),
                temperature=self._temperature, reference=reference, positions=sub.loss_mask,
                output_hidden_states=hidden)
        logp, states = packed_logprobs(self.policy, sub, pack, temperature=self._temperature, reference=reference,
                                       hidden=hidden)
        order = torch.argsort(torch.tensor(pack.rows))
        if states is None:
            return logp[order], None
        width = sub.input_ids.shape[1]
        rows = [torch.nn.functional.pad(states[torch.from_numpy(i).to(states.device)], (0, 0, 0, width - len(i)))
                for i in pack.index]
        return logp[order], torch.stack(rows)[order]

    @torch.no_grad()
    def _logprobs(self, batch: RolloutBatch, reference: bool) -> torch.Tensor:
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        was_training = self.policy.model.training
        self.policy.model.eval()
        for idx in self._micro_batches(torch.arange(len(batch)), batch):
            sub = batch.select(idx)
            lp, _ = self._forward(sub, self._pack(sub), hidden=False, reference=reference)
            out[idx, : lp.shape[1]] = lp.float().cpu()
        self.policy.model.train(was_training)
        return out

    def update(
        self,
        batch: RolloutBatch | None,
        advantages: torch.Tensor | None,
        *,
        loss_fn: LossFn | None = None,
        row_episode: Sequence[int] | torch.Tensor | None = None,
        ctx: StepContext | None = None,
    ) -> dict[str, float]:
        """Run ``ppo_epochs`` clipped-surrogate passes over ``batch`` with per-token ``advantages`` [B, T].

        The scheduler is not stepped here: :meth:`step` steps it once per trainer step, so a method that
        updates twice in a step (two heads or roles on one backbone) does not advance the schedule twice.
        ``loss_fn`` defaults to the trainer's. Callers with their own batches (ARCO's rubric model, the
        rubric generator) may call this directly. On N ranks each rank passes its own rows (``batch`` None: a
        rank with none, which still joins the others' optimizer steps) and the metrics are the whole update's.
        """
        c = self.config
        loss_fn = loss_fn if loss_fn is not None else self.loss_fn
        if batch is None:
            if not self.ranks.parallel:
                raise ValueError("update() needs a batch (None only for a rank with no rows of its own)")
            with self.whole_weights(needed=False):  # the others' passes without gradient
                pass
            return self._update_rows(None, None, loss_fn, torch.zeros(0, dtype=torch.long), ctx, None, None, None)
        if advantages.shape != batch.input_ids.shape:
            raise ValueError(f"advantages {tuple(advantages.shape)} != batch {tuple(batch.input_ids.shape)}")
        row_episode = torch.as_tensor(range(len(batch)) if row_episode is None else row_episode, dtype=torch.long)
        if c.old_logprobs == "engine" and batch.old_logprobs is None:
            raise ValueError("old_logprobs: engine, but the rollout engine gave no log-probs")
        # exactly on-policy (auto): the current log-probs, detached, are the old ones
        recompute = c.old_logprobs == "recompute" or (c.old_logprobs == "auto" and not self.on_policy(len(batch)))
        # full fine-tuning's reference is a copy of its own, outside ZeRO; LoRA's is the policy with its adapter off
        with self.whole_weights(needed=recompute or (c.kl_coef > 0 and self.policy.is_lora)):
            if recompute:
                old = self._logprobs(batch, reference=False)
            else:
                old = batch.old_logprobs if c.old_logprobs == "engine" else None
            ref = self._logprobs(batch, reference=True) if c.kl_coef > 0 else None
        # truncated importance sampling (ARBOR B.2): the engine's log-probs against the trainer's old ones; a
        # batch the engine did not score in full trains without the weights, and says so (tis_skipped)
        rollout = batch.old_logprobs if c.tis_cap is not None else None
        return self._update_rows(batch, advantages, loss_fn, row_episode, ctx, old, ref, rollout)

    def _update_rows(self, batch: RolloutBatch | None, advantages: torch.Tensor | None, loss_fn: LossFn | None,
                     row_episode: torch.Tensor, ctx: StepContext | None, old: torch.Tensor | None,
                     ref: torch.Tensor | None, rollout: torch.Tensor | None) -> dict[str, float]:
        """The optimizer steps of :meth:`update` (``batch`` None: this rank adds nothing to the others')."""
        c = self.config
        params = self._trainable_parameters()
        device = self.policy.device
        self.policy.model.train()
        sums: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0}
        weighted = {"kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0}
        if rollout is not None:
            weighted.update(tis_weight_mean=0.0, tis_capped_fraction=0.0)
        if c.dual_clip_c is not None:
            weighted.update(dual_clip_fraction=0.0)
        extra_sums: dict[str, float] = {}
        ratio_min, ratio_max, tokens, grad_norms = float("inf"), float("-inf"), 0, []
        pass_tokens = 0  # through the model in the forward passes with gradient, padding included
        minis = [] if batch is None else self._chunks(torch.arange(len(batch)), self._mini_size)
        if self.ranks.parallel:  # every rank takes as many optimizer steps (a short share adds nothing to the last)
            minis += [torch.zeros(0, dtype=torch.long)] * (self.ranks.max(len(minis)) - len(minis))
        for _ in range(c.ppo_epochs):
            for mini in minis:
                if len(mini):
                    mask = batch.loss_mask[mini]
                    num_tokens = float(mask.sum())
                    num_seqs = float((mask.sum(dim=1) > 0).sum())
                else:
                    num_tokens = num_seqs = 0.0
                if self.ranks.parallel:  # the loss is divided by the whole mini-batch's counts, over all ranks
                    num_tokens, num_seqs = self.ranks.sum([num_tokens, num_seqs])
                self.stepper.zero_grad()
                micros = self._micro_batches(mini, batch) if len(mini) else []
                if self.ranks.parallel and self._lockstep:  # ZeRO reduces in every backward: as many on each rank
                    micros += [None] * (self.ranks.max(len(micros)) - len(micros))
                for k, micro in enumerate(micros):
                    if micro is None:  # a backward of nothing: zero gradients, ZeRO's reductions in step
                        self.stepper.backward(self._null_loss(), boundary=k == len(micros) - 1)
                        continue
                    sub = batch.select(micro)
                    w = sub.input_ids.shape[1]
                    pack = self._pack(sub)
                    through = self._pass_tokens(sub, pack)
                    pass_tokens += through
                    with kept_if_short(self.policy.model, through, c.checkpoint_min_tokens):
                        logp, hidden = self._forward(sub, pack, hidden=loss_fn is not None)
                    old_sub = logp.detach() if old is None else old[micro, :w].to(device)
                    loss, m = policy_loss(
                        logp,
                        old_sub,
                        advantages[micro, :w].to(device),
                        sub.loss_mask.to(device),
                        None if ref is None else ref[micro, :w].to(device),
                        clip_eps=c.clip_eps,
                        clip_eps_high=c.clip_eps_high,
                        kl_coef=c.kl_coef,
                        agg=c.loss_agg,
                        num_tokens=num_tokens,
                        num_seqs=num_seqs,
                        rollout_logp=None if rollout is None else rollout[micro, :w].to(device),
                        tis_cap=None if rollout is None else c.tis_cap,
                        dual_clip_c=c.dual_clip_c,
                        kl_clamp=c.kl_clamp,
                    )
                    if loss_fn is not None:
                        extra, extra_metrics = loss_fn(LossInputs(
                            batch=sub, rows=micro, row_episode=row_episode, logp=logp, hidden=hidden,
                            advantages=advantages[micro, :w], num_tokens=num_tokens, num_seqs=num_seqs, ctx=ctx))
                        loss = loss + extra
                        for k, v in extra_metrics.items():
                            extra_sums[k] = extra_sums.get(k, 0.0) + float(v)
                    self.stepper.backward(loss, boundary=k == len(micros) - 1)
                    sums["loss"] += float(loss.detach())
                    sums["pg_loss"] += m.pg_loss
                    for k in weighted:
                        weighted[k] += getattr(m, k) * m.num_tokens
                    if m.num_tokens:
                        ratio_min, ratio_max = min(ratio_min, m.ratio_min), max(ratio_max, m.ratio_max)
                    tokens += m.num_tokens
                grad_norms.append(self.stepper.step(params, c.max_grad_norm))
        n_updates = len(grad_norms)
        old_pass = float(batch is not None and old is not None and c.old_logprobs != "engine")
        if self.ranks.parallel:  # the ranks' shares of each sum, and the extremes, as one process counts them
            parts = self.ranks.gather((sums, weighted, extra_sums, tokens, pass_tokens, ratio_min, ratio_max, old_pass))
            old_pass = max(p[7] for p in parts)
            sums = {k: sum(p[0][k] for p in parts) for k in sums}
            weighted = {k: sum(p[1][k] for p in parts) for k in weighted}
            extra_sums = {k: sum(p[2].get(k, 0.0) for p in parts) for k in dict.fromkeys(k for p in parts for k in p[2])}
            tokens, pass_tokens = sum(p[3] for p in parts), sum(p[4] for p in parts)
            ratio_min, ratio_max = min(p[5] for p in parts), max(p[6] for p in parts)
        metrics = {k: v / n_updates for k, v in sums.items()}
        metrics.update({k: v / max(tokens, 1) for k, v in weighted.items()})
        metrics.update({f"loss_fn/{k}": v / n_updates for k, v in extra_sums.items()})
        metrics.update(
            ratio_min=ratio_min if tokens else 1.0,
            ratio_max=ratio_max if tokens else 1.0,
            grad_norm=sum(grad_norms) / n_updates,
            grad_norm_max=max(grad_norms),
            lr=self.optimizer.param_groups[0]["lr"],
            optimizer_steps=float(n_updates),
            tokens=float(tokens / c.ppo_epochs),
            pass_tokens=float(pass_tokens / c.ppo_epochs),
            old_logprob_pass=old_pass,
        )
        if c.tis_cap is not None:
            metrics["tis_skipped"] = float(rollout is None)
        return metrics

    def _draw(self, ctx: StepContext, n_prompts: int, first_group: int,
              timing: dict[str, float]) -> tuple[list[Episode], RewardOutput]:
        """Roll out and score the next ``n_prompts`` prompts, their groups numbered from ``first_group``
        (each draw of a step gets its own numbers); the time each part took is added to ``timing``."""
        t0 = time.perf_counter()
        order = self.sampler.next(n_prompts)
        lo, hi = self.ranks.bounds(len(order))  # this rank's prompts (all of them in one process)
        prompts = [self.prompts[i] for i in order[lo:hi]]
        with self.whole_weights(needed=bool(prompts)):
            episodes = self.rollout_fn(self.engine, prompts, self.config.group_size, self.sampling) if prompts else []
        for e in episodes:
            e.group += first_group + lo
        self._own_groups.update(range(first_group + lo, first_group + hi))
        ctx.groups = [e.group for e in episodes]
        t1 = time.perf_counter()
        reward = call_reward(self.reward_fn, episodes, ctx) if episodes else RewardOutput(scores=[])
        memory.release()  # a reward that runs a model (ARCO's mu, a local judge) leaves its activations freed, not returned
        if self.ranks.parallel:  # the whole draw, in rank order (the order one process has), on every rank
            parts = self.ranks.gather((episodes, list(reward.scores), reward.metrics))
            episodes = [e for part in parts for e in part[0]]
            reward = RewardOutput(scores=[x for part in parts for x in part[1]],
                                  metrics=_combined_reward_metrics([(len(p[0]), p[2]) for p in parts]))
            ctx.groups = [e.group for e in episodes]
            if hasattr(self.method, "merge_ranks"):  # what each rank's reward left in the method: the whole draw's
                self.method.merge_ranks(self.ranks.gather(self.method.rank_share()))
        timing["rollout"] += t1 - t0
        timing["reward"] += time.perf_counter() - t1
        return episodes, reward

    def _refill(self, ctx: StepContext, episodes: list[Episode], raw_scores: list[Any],
                timing: dict[str, float]) -> tuple[list[Episode], list[Any], set[int], dict[str, float]]:
        """DAPO's dynamic sampling (Yu et al. 2025, Sec. 3.2 and Algorithm 1): while fewer than
        ``prompts_per_step`` groups have scores that differ (an all-correct or all-wrong group has advantage 0
        everywhere, so it only dilutes the gradient), draw as many more prompts as groups are missing, for at
        most ``dynamic_sampling_max_rounds`` rounds. Returns every episode drawn and its score (the method hook
        sees them all), the groups with signal (the ones the update keeps) and the refill's metrics.
        A round draws only the missing number of prompts, so the step never holds more than
        ``prompts_per_step`` groups with signal, and the cap bounds its extra rollouts."""
        c = self.config
        episodes, raw_scores = list(episodes), list(raw_scores)
        signal, drawn, rounds, reward_sums = _varied_groups(episodes, raw_scores), c.prompts_per_step, 0, {}
        while len(signal) < c.prompts_per_step and rounds < c.dynamic_sampling_max_rounds:
            rounds += 1
            missing = c.prompts_per_step - len(signal)
            more, reward = self._draw(ctx, missing, drawn, timing)
            drawn += missing
            episodes.extend(more)
            raw_scores.extend(reward.scores)
            signal |= _varied_groups(more, list(reward.scores))
            for k, v in reward.metrics.items():
                reward_sums[k] = reward_sums.get(k, 0.0) + float(v)
        metrics = {
            "dynamic_sampling/refill_rounds": float(rounds),
            "dynamic_sampling/prompts": float(drawn),
            "dynamic_sampling/groups": float(len(signal)),
            "dynamic_sampling/filtered_groups": float(drawn - len(signal)),
        }
        # the refill rounds' own reward metrics (judge calls, costs), summed; reward/* holds the first draw's
        metrics.update({f"dynamic_sampling/reward/{k}": v for k, v in reward_sums.items()})
        return episodes, raw_scores, signal, metrics

    def step(self) -> dict[str, float]:
        """One GRPO step; returns and logs its metrics:

        1. the next ``prompts_per_step`` prompts (seeded shuffle, position saved in checkpoints);
        2. ``group_size`` episodes per prompt from ``rollout_fn`` (single turn by default;
           :func:`components.training.grpo.agent_rollout.make_agent_rollout` runs an agent loop);
        3. ``reward_fn(episodes, ctx)`` (sync or async; :mod:`components.training.grpo.episodes`): per episode
           a scalar or one value per stage/step, any missing (masked; an episode with nothing scored is
           dropped and counted); with ``dynamic_sampling_max_rounds`` (DAPO) groups whose scores do not differ
           are left out and steps 1-3 repeat for the missing prompts (``dynamic_sampling/*``);
        4. advantages ``[n, K]`` (group-normalised per column; ``advantage_fn`` lets a method shape them), placed
           on each episode's rows by segment (SS-GRPO's stages, ARCO's steps: tag ``segment_id`` in the rollout);
        5. :meth:`update` (clipped surrogate + k3 KL + a method's ``loss_fn``; with ``tis_cap`` ARBOR B.2's
           token-level TIS), then the scheduler steps once and the engine picks up the new weights;
        6. the method's ``on_step_end``, metrics to ``on_metrics`` (wall-clock ``time/*`` figures there only,
           never in the checkpointed history), and a checkpoint every ``checkpoint_every`` steps.
        """
        c = self.config
        ctx = StepContext(step=self.step_count + 1, groups=[], method=self.method)
        timing = {"rollout": 0.0, "reward": 0.0}
        self._own_groups = set()
        episodes, reward = self._draw(ctx, c.prompts_per_step, 0, timing)
        raw_scores, signal, refill = list(reward.scores), None, {}
        if c.dynamic_sampling_max_rounds:  # DAPO's dynamic sampling: refill the groups that carry no signal
            episodes, raw_scores, signal, refill = self._refill(ctx, episodes, raw_scores, timing)
        ctx.groups = [e.group for e in episodes]
        scores = score_matrix(raw_scores)
        scored = [i for i in range(len(episodes)) if not bool(torch.isnan(scores[i]).all())]
        kept = scored if signal is None else [i for i in scored if episodes[i].group in signal]
        t2 = time.perf_counter()
        metrics: dict[str, float] = {
            "step": float(ctx.step),
            "episodes": float(len(episodes)),
            "episodes/unscored": float(len(episodes) - len(scored)),
            "reward/none_fraction": 1.0 - len(scored) / max(len(episodes), 1),
        }
        metrics.update({f"reward/{k}": float(v) for k, v in reward.metrics.items()})
        metrics.update(refill)
        ctx.metrics = metrics
        updated = False
        if kept:
            episodes_k, scores_k = [episodes[i] for i in kept], scores[kept]
            adv = (self.advantage_fn or self._default_advantages)(episodes_k, scores_k, ctx)
            if adv.ndim == 1:
                adv = adv[:, None]
            if adv.shape != scores_k.shape:
                raise ValueError(f"advantage_fn returned {tuple(adv.shape)} for scores {tuple(scores_k.shape)}")
            rows, row_episode = [], []
            # an episode is silent when every advantage is 0 or masked (NaN: a missing stage score trains nothing)
            silent = [bool(((adv[j] == 0) | adv[j].isnan()).all()) for j in range(len(episodes_k))]
            metrics["episodes/zero_advantage"] = float(sum(silent))
            for j, e in enumerate(episodes_k):
                if (c.skip_zero_advantage and silent[j]) or e.group not in self._own_groups:
                    continue
                for row in e.rows:
                    if any(s.trainable and s.token_ids for s in row):
                        rows.append(row)
                        row_episode.append(j)
            per_episode = torch.nanmean(scores_k, dim=1)
            metrics.update({
                "reward/mean": float(per_episode.mean()),
                "reward/std": float(per_episode.std(unbiased=False)) if len(kept) > 1 else 0.0,
                "reward/missing_values": float(torch.isnan(scores_k).sum()),
                "response_length": float(np.mean([len(e.response_ids) for e in episodes_k])),
            })
            batch = token_adv = None
            if rows:
                batch = assemble(rows, pad_token_id=self.pad_token_id, max_length=self.max_length)
                token_adv, batch.loss_mask = place_episode_advantages(
                    adv, row_episode, batch.segment_ids, batch.loss_mask)
                if not bool(batch.loss_mask.any()):
                    batch = None
            # on N ranks, one whose share has nothing to train still takes part in the others' update
            if self.ranks.max(batch is not None):
                metrics.update(self.update(batch, token_adv, row_episode=row_episode, ctx=ctx))
                if self.ranks.parallel:
                    abs_sum, n_tokens = self.ranks.sum([0.0, 0.0] if batch is None else
                                                       [token_adv.abs().sum(), batch.loss_mask.sum()])
                    metrics["advantage/abs_mean"] = abs_sum / n_tokens
                else:
                    metrics["advantage/abs_mean"] = float(token_adv.abs().sum() / batch.loss_mask.sum())
                updated = True
        with warnings.catch_warnings():
            # the schedule counts trainer steps, so a step without an update (every group flat) advances it too
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        if updated:
            self.engine.update_weights(self.policy, ctx.step)
        memory.release()
        t3 = time.perf_counter()
        metrics.update(self._method_hook("on_step_end", ctx, episodes, scores))
        memory.release()
        self.step_count += 1
        method_timings = wall_clock(metrics)
        self.history.append(dict(metrics))
        timings = {"time/rollout": timing["rollout"], "time/reward": timing["reward"], "time/update": t3 - t2,
                   "time/method": time.perf_counter() - t3, **method_timings,
                   "memory/rss_gb": memory.rss_gb() or float("nan"), "memory/peak_rss_gb": memory.peak_rss_gb()}
        timings["time/checkpoint"] = 0.0
        if self.checkpoint_dir is not None and c.checkpoint_every and self.step_count % c.checkpoint_every == 0:
            t4 = time.perf_counter()
            self.save()
            timings["time/checkpoint"] = time.perf_counter() - t4
        if self.on_metrics is not None and self.ranks.main:  # after the save: a resumed run rebuilds it from the history
            self.on_metrics(self.step_count, {**metrics, **timings})
        return metrics

    def train(self, num_steps: int, *, progress: str | None = None, evaluate_every: int = 0,
              evaluate: Callable[[int], dict[str, float]] | None = None) -> list[dict[str, float]]:
        """Run steps until ``step_count`` reaches ``num_steps`` (so a resumed run stops at the same step).
        ``progress`` names a progress bar (steps done, mean reward, time left) on stderr; None shows none.
        ``evaluate(step)``, every ``evaluate_every`` steps before the last (as TRL's ``eval_steps``; every rank
        calls it), returns metrics that join that step's (history and ``on_metrics``): a learning curve."""
        with tqdm(total=num_steps, initial=self.step_count, desc=progress, unit="step",
                  disable=progress is None) as bar:
            while self.step_count < num_steps:
                metrics = self.step()
                bar.update(1)
                if "reward/mean" in metrics:
                    bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
                if evaluate is not None and evaluate_every and self.step_count % evaluate_every == 0 \
                        and self.step_count < num_steps:
                    found = evaluate(self.step_count)
                    self.history[-1].update(found)
                    if self.on_metrics is not None and self.ranks.main:
                        self.on_metrics(self.step_count, found)
        self.finish()
        return self.history

    def finish(self) -> dict[str, float]:
        """The method's ``on_train_end``: work it deferred past the last step lands now. Its metrics join the
        last step's (history and ``on_metrics``) under ``end/`` (the same work of the step before, landed during
        the last step, keeps its own keys), and the checkpoint of that step is rewritten so it holds
        the finished state. A hook with nothing left to do returns nothing and nothing is written, so calling
        this again (a resumed, finished run) changes nothing. A run extended after it finished has applied
        that work at the end of the shorter run, one step earlier than an uninterrupted run would."""
        ctx = StepContext(step=self.step_count, groups=[], method=self.method)
        metrics = {f"end/{k}": v for k, v in self._method_hook("on_train_end", ctx).items()}
        memory.release()
        if not metrics:
            return {}
        if self.history:
            self.history[-1].update(metrics)
        if self.on_metrics is not None and self.ranks.main:
            self.on_metrics(self.step_count, metrics)
        if self.checkpoint_dir is not None and self.config.checkpoint_every:
            self.save()
        return metrics

    def _method_hook(self, name: str, *args: Any) -> dict[str, float]:
        """The method's hook ``name``; on N ranks rank 0 alone runs it (on the whole step: episodes and scores are
        every rank's, and so is what the reward left in the method) and the others take its metrics and state: its
        ``state_dict`` and the files its ``write_files`` writes (ARCO's mu and mu's optimizer), as a checkpoint
        would hand them to ``load_state_dict``."""
        if not self.ranks.parallel or not hasattr(self.method, name):
            return run_method_hook(self.method, name, self, *args)
        out = files = None
        if self.ranks.main:
            out = run_method_hook(self.method, name, self, *args)
            if hasattr(self.method, "write_files"):
                with tempfile.TemporaryDirectory() as tmp:
                    self.method.write_files(Path(tmp))
                    files = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}
        metrics, state, files = self.ranks.broadcast((out, self.method.state_dict(), files) if self.ranks.main else None)
        if not self.ranks.main:
            with tempfile.TemporaryDirectory() as tmp:
                for relative, data in (files or {}).items():
                    (Path(tmp) / relative).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / relative).write_bytes(data)
                self.method.load_state_dict(state, Path(tmp) if files else None)
        return metrics

    def save(self, root: str | Path | None = None) -> Path:
        root = Path(root) if root is not None else self.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint directory: pass one to save() or to GRPOTrainer(checkpoint_dir=)")
        return save_checkpoint(
            root,
            self.step_count,
            model=self.policy.model,
            optimizer=self.stepper.checkpointable,
            scheduler=self.scheduler,
            trainer_state={
                "data": self.sampler.state_dict(),
                "history": self.history,
                "config": self.config.model_dump(mode="json"),
            },
            method_state=self.method.state_dict() if self.method is not None else None,
            method_files=getattr(self.method, "write_files", None),
            extra_modules=self.extra_modules,
            keep_last=self.config.keep_last,
            ranks=self.ranks,
        )

    def resume_or_branch(self, branch: str | Path | None) -> str:
        """Resume this run's own latest checkpoint; when it has none, start from ``branch`` (a checkpoint of
        another run: an ablation sharing that run's first steps). Returns "own", "branch" or "fresh"."""
        if self.resume():
            return "own"
        if branch is None:
            return "fresh"
        if not (Path(branch) / "manifest.json").exists():
            raise FileNotFoundError(f"branch checkpoint {branch}: no manifest.json (not a complete checkpoint)")
        self.resume(branch)
        return "branch"

    def resume(self, path: str | Path | None = None) -> bool:
        """Restore everything from ``path`` (a checkpoint or a root; default: ``checkpoint_dir``).
        Returns False, changing nothing, when the root holds no checkpoint yet."""
        path = Path(path) if path is not None else self.checkpoint_dir
        if path is None or (not (path / "manifest.json").exists() and latest_checkpoint(path) is None):
            return False
        ckpt = load_checkpoint(
            path, model=self.policy.model, optimizer=self.stepper.checkpointable, scheduler=self.scheduler,
            extra_modules=self.extra_modules, optimizer_globals=self.stepper.checkpoint_globals, ranks=self.ranks,
        )
        self.step_count = ckpt.step
        self.history = list(ckpt.trainer_state["history"])
        self.sampler.load_state_dict(ckpt.trainer_state["data"])
        if self.method is not None:
            self.method.load_state_dict(ckpt.method_state, ckpt.method_dir)
        self.engine.update_weights(self.policy, self.step_count)
        return True
