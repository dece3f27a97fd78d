"""Token-level policy-gradient losses: the clipped surrogate with per-token advantages (Co-ReAct Eq. 4 / RubricEM
Eq. 1), the k3 KL, ARBOR B.2's token-level TIS and verl's dual clip and KL clamp as options
(:func:`policy_loss`), and log-probabilities from a selective log-softmax that never materialises an fp32
``[B, T, V]`` tensor (:func:`token_logprobs`, :func:`masked_logprobs`). All tensors are ``[B, T]``, aligned with
``input_ids``; ``loss_mask`` is 1 only for tokens the policy generated, and masked positions never influence the
loss or receive gradient, whatever values they hold (even inf/NaN).

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
    "masked_logprobs",
    "policy_loss",
    "selective_log_softmax",
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
    tis_weight_mean: float = 1.0  # truncated importance weights (1 and 0 when TIS is off)
    tis_capped_fraction: float = 0.0
    dual_clip_fraction: float = 0.0  # tokens whose loss the dual clip capped (verl's pg_clipfrac_lower)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


# fp32 scratch per chunk of the selective log-softmax (rows x vocab x 4 bytes): ~100 rows of Qwen's vocab.
_CHUNK_BYTES = 64 << 20


class _SelectiveLogSoftmax(torch.autograd.Function):
    """``log_softmax(logits / temperature)[target]`` for logits ``[B, S, V]``, in chunks of rows.

    Forward keeps only the per-row log-sum-exp; backward recomputes the softmax of each chunk, so the
    peak extra memory is one fp32 chunk rather than several fp32 copies of the whole block. Chunks are
    taken per batch row, so a strided view (``logits[:, :-1]``) is never copied.
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_rows):
        acc = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(targets.shape, dtype=acc, device=logits.device)
        picked = torch.empty_like(lse)
        for b, lo in _chunks(targets.shape, chunk_rows):
            x = logits[b, lo : lo + chunk_rows].to(acc)
            if temperature != 1.0:
                x = x / temperature
            lse[b, lo : lo + chunk_rows] = torch.logsumexp(x, dim=-1)
            picked[b, lo : lo + chunk_rows] = x.gather(-1, targets[b, lo : lo + chunk_rows, None])[:, 0]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return picked - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        logits, targets, lse = ctx.saved_tensors
        temperature, chunk_rows = ctx.temperature, ctx.chunk_rows
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_out = grad_out.to(lse.dtype) / temperature
        for b, lo in _chunks(targets.shape, chunk_rows):
            rows = slice(lo, lo + chunk_rows)
            g_row = grad_out[b, rows, None]
            # d/dx [x_t / T - logsumexp(x / T)] = (onehot(t) - softmax(x / T)) / T
            x = logits[b, rows].to(lse.dtype)
            if temperature != 1.0:
                x = x / temperature
            g = torch.exp(x - lse[b, rows, None]).mul_(-g_row)
            g.scatter_add_(-1, targets[b, rows, None], g_row)
            grad[b, rows] = g
        return grad, None, None, None


def _chunks(shape: torch.Size, chunk_rows: int) -> list[tuple[int, int]]:
    return [(b, lo) for b in range(shape[0]) for lo in range(0, shape[1], chunk_rows)]


def selective_log_softmax(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *, chunk_rows: int | None = None
) -> torch.Tensor:
    """``log_softmax(logits / temperature, -1)`` at ``targets``, without a full-vocabulary log-softmax.

    ``logits`` is ``[..., V]`` in any float dtype, ``targets`` the matching ``[...]`` ids. The result is
    fp32 (fp64 for fp64 logits), computed in fp32 whatever the input dtype, with gradient to ``logits``.
    ``chunk_rows`` rows are upcast at a time (default: about 64 MiB of fp32).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = logits.shape[-1]
    rows = chunk_rows or max(1, _CHUNK_BYTES // (4 * vocab))
    if logits.dim() == 3 and not _viewable_as_rows(logits):
        return _SelectiveLogSoftmax.apply(logits, targets.long(), float(temperature), rows)
    flat = logits.reshape(1, -1, vocab)  # a view unless logits is an odd strided slice
    out = _SelectiveLogSoftmax.apply(flat, targets.reshape(1, -1).long(), float(temperature), rows)
    return out.reshape(targets.shape)


def _viewable_as_rows(logits: torch.Tensor) -> bool:
    try:
        logits.view(-1, logits.shape[-1])
    except RuntimeError:
        return False
    return True


def masked_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probabilities ``[B, T]`` of ``input_ids`` at the ``True`` positions of ``mask`` ``[B, T]``, zero
    elsewhere (without gradient).

    ``logits`` ``[N, V]`` are the model outputs that predict those ``N`` tokens, in row-major order: for
    position ``t`` of row ``b``, the output at ``t - 1`` (``logits_to_keep`` with the mask shifted left by
    one gives exactly these; see :meth:`components.training.model.Policy.token_logprobs`). Position 0 has no
    prefix, so ``mask[:, 0]`` must be False.
    """
    mask = mask.bool()
    if mask.shape != input_ids.shape:
        raise ValueError(f"mask {tuple(mask.shape)} does not match input_ids {tuple(input_ids.shape)}")
    if bool(mask[:, 0].any()):
        raise ValueError("mask selects position 0, which has no prefix to predict it")
    if logits.dim() != 2 or logits.shape[0] != int(mask.sum()):
        raise ValueError(f"logits {tuple(logits.shape)} are not one row per masked position ({int(mask.sum())})")
    picked = selective_log_softmax(logits, input_ids[mask], temperature)
    return picked.new_zeros(input_ids.shape).masked_scatter(mask, picked)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each token given its prefix, ``[B, T]``; position 0 (no prefix) is 0.

    ``logits`` is the model output ``[B, T, V]`` for ``input_ids`` ``[B, T]``. ``temperature`` divides the
    logits, so training sees the same distribution that sampling used.
    """
    width = input_ids.shape[1]
    if width < 2:
        dtype = torch.promote_types(logits.dtype, torch.float32)
        return torch.zeros(input_ids.shape, dtype=dtype, device=logits.device)
    picked = selective_log_softmax(logits[:, :-1], input_ids[:, 1:], temperature)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (always >= 0).

    ``clamp`` caps each value at ``clamp`` (no gradient beyond it), as verl's ``low_var_kl`` does at 10.
    """
    delta = ref_logp - logp
    k3 = torch.exp(delta) - delta - 1.0
    return k3 if clamp is None else k3.clamp(max=float(clamp))


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``.

    With ``dual_clip_c`` c (> 1), a token with ``A < 0`` has its loss capped at ``-c * A`` (dual-clip PPO):
    a ratio far above 1 on a bad token no longer grows the loss without bound.
    Returns ``(loss, ratio, clipped)`` where ``clipped`` marks tokens whose gradient a clip removed.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped_obj = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss, clipped = -torch.minimum(unclipped, clipped_obj), clipped_obj < unclipped
    if dual_clip_c is not None:
        cap = -float(dual_clip_c) * advantages
        dual = (advantages < 0) & (loss > cap)
        loss, clipped = torch.where(dual, cap, loss), clipped | dual
    return loss, ratio, clipped


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
    rollout_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
    dual_clip_c: float | None = None,
    kl_clamp: float | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Clipped surrogate plus ``kl_coef`` times the k3 KL to the reference, aggregated by ``agg``.

    ``advantages`` is per token ``[B, T]`` (see :mod:`components.training.grpo.advantages`). ``clip_eps_high``
    defaults to ``clip_eps`` (set it higher for DAPO's clip-higher). ``ref_logp`` may be None only when
    ``kl_coef`` is 0. ``tis_cap`` (with ``rollout_logp``, the engine's sampling log-probs) weights each token's
    surrogate term by ``min(exp(old_logp - rollout_logp), tis_cap)``; None leaves the loss as it is.
    ``dual_clip_c`` (> 1) caps a negative-advantage token's surrogate loss at ``-dual_clip_c * A`` before the TIS
    weight; ``kl_clamp`` caps each token's k3 term (see :func:`clipped_surrogate`, :func:`kl_k3`). Both guards are
    verl's (``verl/trainer/ppo/core_algos.py``: ``clip_ratio_c``, after Ye et al. 2019; its ``low_var_kl`` clamp to
    [-10, 10]) and off by default. The TIS weight has no gradient and the KL term is not weighted::

        loss = -agg(w * min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)) + kl_coef * agg(k3)
        ratio = exp(logp - old_logp),  k3 = exp(ref - logp) - (ref - logp) - 1
        w = min(exp(old_logp - rollout_logp), tis_cap)   # 1 without tis_cap
    """
    if not (logp.shape == old_logp.shape == advantages.shape == loss_mask.shape):
        raise ValueError(
            f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
            f"advantages {tuple(advantages.shape)}, loss_mask {tuple(loss_mask.shape)}"
        )
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef is non-zero but no reference log-probs were given")
    if tis_cap is not None and (rollout_logp is None or rollout_logp.shape != logp.shape):
        raise ValueError("tis_cap needs the rollout engine's log-probs, shaped like logp "
                         f"(got {None if rollout_logp is None else tuple(rollout_logp.shape)})")
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (the cap -c * A lies beyond the clip's), got {dual_clip_c}")
    if kl_clamp is not None and kl_clamp <= 0:
        raise ValueError(f"kl_clamp must be > 0, got {kl_clamp}")
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Zero the inputs at masked positions before any arithmetic: torch.where alone would still let an
    # inf/NaN there poison the backward pass (0 * inf = NaN).
    logp_m = torch.where(mask, logp, zero)
    old_m = torch.where(mask, old_logp.detach(), zero)
    adv_m = torch.where(mask, advantages.detach().to(logp.dtype), zero)

    high = clip_eps if clip_eps_high is None else clip_eps_high
    pg_tok, ratio, clipped = clipped_surrogate(logp_m, old_m, adv_m, clip_eps, high, dual_clip_c)
    dual = (adv_m < 0) & (pg_tok == -float(dual_clip_c) * adv_m) if dual_clip_c is not None else None
    tis = None
    if tis_cap is not None:
        rollout_m = torch.where(mask, rollout_logp.detach().to(old_m.dtype), zero)
        tis = torch.exp(old_m - rollout_m).clamp(max=float(tis_cap))
        pg_tok = pg_tok * tis
    pg = aggregate(pg_tok, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs)

    if ref_logp is not None:
        ref_m = torch.where(mask, ref_logp.detach(), zero)
        kl = aggregate(kl_k3(logp_m, ref_m, kl_clamp), mask, agg, num_tokens=num_tokens, num_seqs=num_seqs)
    else:
        kl = zero
    loss = pg + kl_coef * kl if kl_coef != 0.0 else pg

    with torch.no_grad():
        n = int(mask.sum())
        sel_ratio = ratio[mask]
        kl_tok = kl_k3(logp_m, ref_m, kl_clamp)[mask].mean() if ref_logp is not None and n else zero
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
            tis_weight_mean=float(tis[mask].mean()) if tis is not None and n else 1.0,
            tis_capped_fraction=float((tis[mask] >= float(tis_cap)).float().mean()) if tis is not None and n else 0.0,
            dual_clip_fraction=float(dual[mask].float().mean()) if dual is not None and n else 0.0,
        )
    return loss, metrics
