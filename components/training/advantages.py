"""Group-relative advantages and their placement on tokens.

GRPO replaces a learned critic with a baseline computed inside a group of samples that share a prompt:
``A_i = (r_i - mean_group(r)) / (std_group(r) + eps)`` (Co-ReAct Eq. 5; the std division can be turned
off, as in Dr. GRPO). RubricEM's SS-GRPO applies the same normalisation per stage, on a ``[n, K]`` matrix
of stage returns, and gives every token of stage ``k`` the advantage ``A_{i,k}``; ARCO does the same with
per-step rewards. The loss in :mod:`components.training.losses` therefore takes advantages per token,
shape ``[B, T]``, and this module builds them:

- :func:`group_advantages` normalises rewards within groups (1-D rewards or ``[n, K]`` stage returns);
- :func:`episode_group_advantages` does it per episode when one episode spans several rows;
- :func:`broadcast_sequence_advantages` spreads one scalar per sequence over its trainable tokens;
- :func:`segment_advantages` places one value per segment (stage, step, turn) on that segment's tokens.

Usage::

    adv = group_advantages(torch.tensor(rewards), group_ids)          # [B]
    token_adv = broadcast_sequence_advantages(adv, batch.loss_mask)    # [B, T]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

__all__ = [
    "broadcast_sequence_advantages",
    "episode_group_advantages",
    "group_advantages",
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
    A group of one sample, or a group whose rewards are all equal, gets advantage 0: there is nothing
    to compare against. ``unbiased_std`` picks Bessel's correction (torch's default, TRL's choice); the
    default population std matches the papers' ``Std``.
    """
    rewards = torch.as_tensor(rewards)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    groups = torch.as_tensor(group_ids, dtype=torch.long, device=rewards.device)
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards must be [n] or [n, K], got shape {tuple(rewards.shape)}")
    if groups.shape != rewards.shape[:1]:
        raise ValueError(f"group_ids has {groups.shape[0]} entries for {rewards.shape[0]} rewards")
    out = torch.zeros_like(rewards)
    for g in torch.unique(groups):
        rows = groups == g
        r = rewards[rows]
        if r.shape[0] < 2:
            continue
        centred = r - r.mean(dim=0, keepdim=True)
        if normalize_std:
            std = r.std(dim=0, unbiased=unbiased_std, keepdim=True)
            centred = centred / (torch.where(std > 0, std, torch.ones_like(std)) + eps)
        out[rows] = centred
    return out


def episode_group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    episodes: Sequence[Hashable],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages ``[B]`` for rows that may share an episode.

    A multi-turn episode can be several training rows (one per turn when each turn has a fresh prompt);
    it counts once in its group's mean and std, and each of its rows gets the episode's advantage.
    Rows of one episode must carry the same reward. With all-distinct ``episodes`` this is
    :func:`group_advantages`.
    """
    first: dict[Hashable, int] = {}
    for i, key in enumerate(episodes):
        if key in first and rewards[first[key]] != rewards[i]:
            raise ValueError(f"rows of episode {key!r} have different rewards: {rewards[first[key]]} != {rewards[i]}")
        first.setdefault(key, i)
    order = list(first)
    per_episode = group_advantages(
        torch.tensor([float(rewards[first[k]]) for k in order], dtype=torch.float32),
        [groups[first[k]] for k in order],
        normalize_std=normalize_std,
        eps=eps,
    )
    position = {k: j for j, k in enumerate(order)}
    return per_episode[torch.tensor([position[k] for k in episodes], dtype=torch.long)]


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
