"""Group-relative advantages and their placement on tokens.

GRPO replaces a learned critic with a baseline computed inside a group of samples that share a prompt:
``A_i = (r_i - mean_group(r)) / (std_group(r) + eps)`` (Co-ReAct Eq. 5; the std division can be turned
off, as in Dr. GRPO). RubricEM's SS-GRPO applies the same normalisation per stage, on a ``[n, K]`` matrix
of stage returns, and gives every token of stage ``k`` the advantage ``A_{i,k}``; ARCO does the same with
per-step rewards. The loss in :mod:`components.training.losses` therefore takes advantages per token,
shape ``[B, T]``, and this module builds them:

- :func:`group_advantages` normalises rewards within groups (1-D rewards or ``[n, K]`` stage returns);
  a missing value (NaN: a failed judge, an unscored stage) is left out of its group's mean and std and
  stays NaN;
- :func:`broadcast_sequence_advantages` spreads one scalar per sequence over its trainable tokens;
- :func:`segment_advantages` places one value per segment (stage, step, turn) on that segment's tokens;
- :func:`place_episode_advantages` puts per-episode values ``[n, K]`` on the token rows of the episodes
  (an episode may be several rows) and masks the tokens whose value is missing out of the loss.

Usage::

    adv = group_advantages(torch.tensor(rewards), group_ids)          # [B]
    token_adv = broadcast_sequence_advantages(adv, batch.loss_mask)    # [B, T]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "broadcast_sequence_advantages",
    "group_advantages",
    "place_episode_advantages",
    "segment_advantages",
]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[int] | torch.Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = False,
) -> torch.Tensor:
    """Subtract the group mean (and divide by the group std) along dim 0.

    ``rewards`` is ``[n]`` or ``[n, K]`` (K stages, normalised column by column, as SS-GRPO does).
    ``group_ids[i]`` names the group of row ``i``; rows of a group need not be contiguous.
    NaN marks a missing value: it takes no part in its column's mean and std and its advantage stays NaN
    (the trainer masks such tokens out of the loss; a missing score is never a 0).
    A group column with fewer than two values, or whose values are all equal, gets advantage 0: there is
    nothing to compare against. ``unbiased_std`` picks Bessel's correction (torch's default: verl's, TRL's and
    slime's choice, ``grpo.adv_std: sample``); the default population std is numpy's (RubricEM's
    open-instruct) and the papers' ``Std``. At group size G the sample std is ``sqrt(G / (G - 1))`` times the
    population std (x1.069 at G=8, x1.155 at G=4), and the advantages that much smaller.
    """
    rewards = torch.as_tensor(rewards)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    groups = torch.as_tensor(group_ids, dtype=torch.long, device=rewards.device)
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards must be [n] or [n, K], got shape {tuple(rewards.shape)}")
    if groups.shape != rewards.shape[:1]:
        raise ValueError(f"group_ids has {groups.shape[0]} entries for {rewards.shape[0]} rewards")
    out = torch.where(torch.isnan(rewards), rewards, torch.zeros_like(rewards))
    for g in torch.unique(groups):
        rows = groups == g
        r = rewards[rows]
        valid = ~torch.isnan(r)
        count = valid.sum(dim=0, keepdim=True)
        filled = torch.where(valid, r, torch.zeros_like(r))
        mean = filled.sum(dim=0, keepdim=True) / count.clamp(min=1)
        centred = torch.where(valid, r - mean, torch.zeros_like(r))
        if normalize_std:
            dof = (count - 1) if unbiased_std else count
            var = (centred**2).sum(dim=0, keepdim=True) / dof.clamp(min=1)
            std = var.sqrt()
            centred = centred / (torch.where(std > 0, std, torch.ones_like(std)) + eps)
        centred = torch.where(count >= 2, centred, torch.zeros_like(centred))
        out[rows] = torch.where(valid, centred, r)
    return out


def broadcast_sequence_advantages(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Give each sequence's scalar advantage ``[B]`` to all its trainable tokens: ``[B, T]``.

    Tokens where ``loss_mask`` is 0 (prompt, tool observations, padding) get 0.
    """
    if advantages.ndim != 1 or advantages.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} do not match loss_mask {tuple(loss_mask.shape)}"
        )
    return advantages[:, None] * loss_mask.to(advantages.dtype)


def segment_advantages(
    values: torch.Tensor, segment_ids: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Place per-segment values ``[B, K]`` on tokens: ``out[b, t] = values[b, segment_ids[b, t]]``.

    ``segment_ids`` is ``[B, T]`` with the stage/step index of each token and -1 for tokens that belong
    to no segment. Tokens with ``loss_mask`` 0 get 0 whatever their segment, so an observation inside a
    stage never carries an advantage.
    """
    if values.ndim != 2 or segment_ids.shape != loss_mask.shape or values.shape[0] != segment_ids.shape[0]:
        raise ValueError(
            f"shapes do not fit: values {tuple(values.shape)}, segment_ids {tuple(segment_ids.shape)}, "
            f"loss_mask {tuple(loss_mask.shape)}"
        )
    if int(segment_ids.max()) >= values.shape[1]:
        raise ValueError(f"segment id {int(segment_ids.max())} out of range for {values.shape[1]} segments")
    idx = segment_ids.clamp(min=0).long()
    out = torch.gather(values, 1, idx)
    return out * ((segment_ids >= 0) & loss_mask.bool()).to(values.dtype)


def place_episode_advantages(
    values: torch.Tensor, row_episode: Sequence[int] | torch.Tensor, segment_ids: torch.Tensor,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages ``[B, T]`` and the loss mask they leave, from per-episode values ``[n, K]``.

    Row ``b`` of the batch belongs to episode ``row_episode[b]``. With ``K == 1`` every trainable token of
    the row gets the episode's value; with ``K > 1`` a token gets the value of its segment
    (``segment_ids``: the stage or step the rollout tagged it with), and a trainable token outside
    ``[0, K)`` is an error (an untagged span would otherwise be silently trained or dropped). A NaN value
    (missing score) removes its tokens from the returned mask and gets advantage 0.
    """
    values = torch.as_tensor(values, dtype=torch.float32)
    if values.ndim == 1:
        values = values[:, None]
    rows = torch.as_tensor(row_episode, dtype=torch.long)
    if rows.shape[0] != segment_ids.shape[0] or segment_ids.shape != loss_mask.shape:
        raise ValueError(f"shapes do not fit: {rows.shape[0]} rows, segment_ids {tuple(segment_ids.shape)}, "
                         f"loss_mask {tuple(loss_mask.shape)}")
    per_row = values[rows]  # [B, K]
    mask = loss_mask.bool()
    if values.shape[1] == 1:
        token = per_row[:, :1].expand(-1, mask.shape[1])
    else:
        outside = mask & ((segment_ids < 0) | (segment_ids >= values.shape[1]))
        if outside.any():
            b, t = (int(i) for i in outside.nonzero()[0])
            raise ValueError(f"row {b} token {t}: trainable token in segment {int(segment_ids[b, t])}, outside "
                             f"the {values.shape[1]} scored segments")
        token = torch.gather(per_row, 1, segment_ids.clamp(min=0).long())
    keep = mask & ~torch.isnan(token)
    return torch.where(keep, token, torch.zeros_like(token)), keep
