"""Token-level policy-gradient losses: clipped surrogate, k3 KL, and loss aggregation.

All tensors are ``[B, T]`` and aligned with ``input_ids``: ``logp[b, t]`` is the log-probability of token
``input_ids[b, t]`` given the tokens before it (see :func:`token_logprobs`). ``loss_mask[b, t]`` is 1 only
for tokens the policy generated and should learn from; prompt tokens, tool observations and padding are 0.
Masked positions never influence the loss or receive gradient, whatever values they hold (even inf/NaN).

The objective is Co-ReAct Eq. 4 / RubricEM Eq. 1 with per-token advantages::

    loss = -agg(min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)) + kl_coef * agg(k3)
    ratio = exp(logp - old_logp),  k3 = exp(ref - logp) - (ref - logp) - 1

Usage::

    loss, metrics = policy_loss(logp, old_logp, advantages, loss_mask, ref_logp, kl_coef=5e-3)
    loss.backward()
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch

__all__ = [
    "LossAgg",
    "LossMetrics",
    "aggregate",
    "clipped_surrogate",
    "kl_k3",
    "policy_loss",
    "token_logprobs",
]

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]


@dataclass(frozen=True)
class LossMetrics:
    """Scalars describing one loss evaluation.

    ``loss``/``pg_loss`` are the aggregated values (as returned); ``kl``, the ratio statistics,
    ``clip_fraction`` and ``advantage_mean`` are plain means over the unmasked tokens.
    """

    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    advantage_mean: float
    num_tokens: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each token given its prefix, ``[B, T]``; position 0 (no prefix) is 0.

    ``logits`` is the model output ``[B, T, V]`` for ``input_ids`` ``[B, T]``. ``temperature`` divides the
    logits, so training sees the same distribution that sampling used.
    """
    scaled = logits[:, :-1]
    scaled = scaled.to(torch.promote_types(scaled.dtype, torch.float32))
    if temperature != 1.0:
        scaled = scaled / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(scaled, -1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (always >= 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``.

    Returns ``(loss, ratio, clipped)`` where ``clipped`` marks tokens whose gradient the clip removed.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped_obj = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped_obj), ratio, clipped_obj < unclipped


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: LossAgg = "token_mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values ``[B, T]`` over unmasked tokens.

    - ``token_mean``: sum over all unmasked tokens / their count (long answers weigh more; DAPO).
    - ``seq_mean_token_mean``: mean over each sequence's tokens, then mean over sequences (GRPO paper).
    - ``seq_mean_token_sum``: sum over each sequence's tokens, then mean over sequences (RubricEM Eq. 1).

    ``num_tokens`` / ``num_seqs`` override the denominators so that micro-batches of one mini-batch,
    each divided by the mini-batch totals, add up to the mini-batch loss (gradient accumulation).
    Sequences without unmasked tokens do not count as sequences.
    """
    mask = loss_mask.to(values.dtype)
    masked = torch.where(loss_mask.bool(), values, torch.zeros_like(values))
    if mode == "token_mean":
        denom = mask.sum() if num_tokens is None else torch.tensor(float(num_tokens))
        return masked.sum() / denom.clamp(min=1.0)
    per_seq_tokens = mask.sum(dim=-1)
    seqs = (per_seq_tokens > 0).sum() if num_seqs is None else torch.tensor(float(num_seqs))
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=-1) / per_seq_tokens.clamp(min=1.0)
    elif mode == "seq_mean_token_sum":
        per_seq = masked.sum(dim=-1)
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; use one of {LossAgg.__args__}")
    return per_seq.sum() / seqs.clamp(min=1.0)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    agg: LossAgg = "token_mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Clipped surrogate plus ``kl_coef`` times the k3 KL to the reference, aggregated by ``agg``.

    ``advantages`` is per token ``[B, T]`` (see :mod:`components.training.advantages`). ``clip_eps_high``
    defaults to ``clip_eps`` (set it higher for DAPO's clip-higher). ``ref_logp`` may be None only when
    ``kl_coef`` is 0.
    """
    if not (logp.shape == old_logp.shape == advantages.shape == loss_mask.shape):
        raise ValueError(
            f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
            f"advantages {tuple(advantages.shape)}, loss_mask {tuple(loss_mask.shape)}"
        )
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef is non-zero but no reference log-probs were given")
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Zero the inputs at masked positions before any arithmetic: torch.where alone would still let an
    # inf/NaN there poison the backward pass (0 * inf = NaN).
    logp_m = torch.where(mask, logp, zero)
    old_m = torch.where(mask, old_logp.detach(), zero)
    adv_m = torch.where(mask, advantages.detach().to(logp.dtype), zero)

    high = clip_eps if clip_eps_high is None else clip_eps_high
    pg_tok, ratio, clipped = clipped_surrogate(logp_m, old_m, adv_m, clip_eps, high)
    pg = aggregate(pg_tok, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs)

    if ref_logp is not None:
        ref_m = torch.where(mask, ref_logp.detach(), zero)
        kl = aggregate(kl_k3(logp_m, ref_m), mask, agg, num_tokens=num_tokens, num_seqs=num_seqs)
    else:
        kl = zero
    loss = pg + kl_coef * kl if kl_coef != 0.0 else pg

    with torch.no_grad():
        n = int(mask.sum())
        sel_ratio = ratio[mask]
        kl_tok = kl_k3(logp_m, ref_m)[mask].mean() if ref_logp is not None and n else zero
        metrics = LossMetrics(
            loss=float(loss),
            pg_loss=float(pg),
            kl=float(kl_tok),
            clip_fraction=float(clipped[mask].float().mean()) if n else 0.0,
            ratio_mean=float(sel_ratio.mean()) if n else 1.0,
            ratio_min=float(sel_ratio.min()) if n else 1.0,
            ratio_max=float(sel_ratio.max()) if n else 1.0,
            advantage_mean=float(adv_m[mask].mean()) if n else 0.0,
            num_tokens=n,
        )
    return loss, metrics
