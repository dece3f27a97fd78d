"""Shared-prefix packing: token sequences that begin alike run as one sequence, each shared prefix computed once.

A causal LM's state at a token depends only on the tokens before it, so rows that start with the same tokens (a
trajectory's step prompts, which each hold the steps before them) can share those tokens' computation. A pack lays
out the longest row whole and, for each further row, only the tokens after its longest common prefix with a row
already in the pack; a 4D attention mask lets each token see exactly the tokens of its own row before it, and
position ids restart each branch where its prefix ends. One forward pass over the pack gives every row's hidden
states and next-token logits as separate passes would (to float rounding).

    packs = pack_shared_prefixes([[1, 2, 3, 4], [1, 2, 5]], budget=None)
    p = packs[0]            # p.input_ids [1, 2, 3, 4, 5]; p.position_ids [0, 1, 2, 3, 2]
    p.index[1]              # row 1's tokens in the pack: [0, 1, 4]
    model(input_ids=p.input_ids[None], position_ids=p.position_ids[None], attention_mask=p.attention_mask(dtype))

A trainer packs rows of a :class:`~components.training.engines.rollout.RolloutBatch` or an SFT batch
(:func:`pack_rows`: a row shared at most up to the token before its first loss token) and runs a pack
through its policy (:func:`packed_logprobs`): the GRPO trainer's micro-batches of rows sharing a prompt (the
rubric generator's groups), ARCO's mu (a trajectory's step prompts), with ``sft.prefix_packing`` the SFT's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["PrefixPack", "Rows", "pack_rows", "pack_shared_prefixes", "packed_logprobs", "takes_packs"]

# attention implementations that apply a given 4D mask (flash-attention kernels take padding masks only)
_MASKED_ATTENTION = ("eager", "sdpa")


class Rows(Protocol):
    """Right-padded rows ``[B, W]`` as a trainer holds them: a RolloutBatch, an SFT batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor


class PackedForward(Protocol):
    """What a pack runs through: a :class:`~components.training.model.Policy` (named, not imported, so the
    speed options stay below the model that applies them)."""

    device: torch.device
    model: torch.nn.Module

    def forward_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]: ...


def takes_packs(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention applies a 4D mask as given (eager or sdpa), so a pack can run through it."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", "eager") in _MASKED_ATTENTION


@dataclass
class PrefixPack:
    """Rows ``rows`` (indices into the packed sequences) laid out as one sequence; ``index[j]`` holds, for each
    token of row ``rows[j]``, its place in the pack."""

    rows: list[int] = field(default_factory=list)
    index: list[np.ndarray] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)
    _pos: list[int] = field(default_factory=list)
    _seqs: list[np.ndarray] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.tensor(self._ids, dtype=torch.long)

    @property
    def position_ids(self) -> torch.Tensor:
        return torch.tensor(self._pos, dtype=torch.long)

    def visible(self) -> torch.Tensor:
        """``[L, L]`` bool: token ``q`` may attend to token ``k`` (``k`` is on ``q``'s row, at or before it)."""
        n = len(self)
        seen = np.zeros((n, n), dtype=bool)
        for idx in self.index:
            causal = np.tril(np.ones((len(idx), len(idx)), dtype=bool))
            seen[idx[:, None], idx[None, :]] |= causal
        return torch.from_numpy(seen)

    def attention_mask(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The additive ``[1, 1, L, L]`` mask transformers takes as given (0 where visible, the dtype's minimum
        elsewhere); additive rather than boolean, so eager attention reads it as sdpa does."""
        blocked = torch.zeros((len(self), len(self)), dtype=dtype).masked_fill(~self.visible(), torch.finfo(dtype).min)
        return blocked[None, None]

    def _add(self, row: int, seq: np.ndarray, parent: int | None, shared: int) -> None:
        start = len(self._ids)
        prefix = self.index[parent][:shared] if parent is not None else np.zeros(0, dtype=np.int64)
        self.rows.append(row)
        self._seqs.append(seq)
        self.index.append(np.concatenate([prefix, np.arange(start, start + len(seq) - shared)]).astype(np.int64))
        self._ids += seq[shared:].tolist()
        self._pos += list(range(shared, len(seq)))


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def pack_shared_prefixes(seqs: Sequence[Sequence[int]], budget: int | None,
                         share_limit: Sequence[int] | None = None) -> list[PrefixPack]:
    """Packs of ``seqs``, longest first, each row joining the pack where it shares the most leading tokens with a
    row already there and where it fits ``budget`` packed tokens (None: no limit; a row longer than the budget
    gets a pack of its own). ``share_limit[i]`` caps how many of row ``i``'s tokens may be shared, so that the
    tokens from there on (and the one before each of them) lie contiguously in the pack."""
    arrays = [np.asarray(s, dtype=np.int64) for s in seqs]
    limits = [len(a) for a in arrays] if share_limit is None else list(share_limit)
    if len(limits) != len(arrays):
        raise ValueError(f"share_limit has {len(limits)} entries for {len(arrays)} sequences")
    packs: list[PrefixPack] = []
    for i in sorted(range(len(arrays)), key=lambda i: (-len(arrays[i]), i)):
        seq, best = arrays[i], None
        for pack in packs:
            shared, parent = max(((min(_common_prefix(seq, other), limits[i], len(seq) - 1), j)
                                  for j, other in enumerate(pack._seqs)), key=lambda t: (t[0], -t[1]))
            fits = budget is None or len(pack) + len(seq) - shared <= budget
            if fits and (best is None or shared > best[1]):
                best = (pack, max(shared, 0), parent)
        if best is None:
            pack = PrefixPack()
            pack._add(i, seq, None, 0)
            packs.append(pack)
        else:
            pack, shared, parent = best
            pack._add(i, seq, parent if shared else None, shared)
    return packs


def pack_rows(batch: Rows, rows: Sequence[int], budget: int | None) -> list[PrefixPack]:
    """Rows ``rows`` of ``batch`` as packs (``pack.rows`` are row indices of ``batch``). A row's tokens are
    shared at most up to the one before its first loss token, so its loss tokens, and the token before each,
    lie contiguously in its own branch (where a forward pass reads their log-probs)."""
    rows = list(rows)
    seqs, limits = [], []
    for r in rows:
        n = int(batch.attention_mask[r].sum())
        loss = batch.loss_mask[r, :n].nonzero()
        seqs.append(batch.input_ids[r, :n].tolist())
        limits.append(max(int(loss[0]) - 1, 0) if len(loss) else n)
    packs = pack_shared_prefixes(seqs, budget, limits)
    for pack in packs:
        pack.rows = [rows[i] for i in pack.rows]
    return packs


def packed_logprobs(policy: PackedForward, batch: Rows, pack: PrefixPack, *, temperature: float = 1.0,
                    reference: bool = False, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass of ``policy`` over ``pack``: the log-probs of its rows' loss tokens ``[len(rows), W]``
    in ``pack.rows`` order, aligned with ``batch``'s ``W`` columns (zero elsewhere), and the pack's last hidden
    states ``[L, H]`` (None unless ``hidden``; row ``j``'s are at ``pack.index[j]``)."""
    device = policy.device
    loss = torch.zeros(len(pack), dtype=torch.bool)
    for r, index in zip(pack.rows, pack.index, strict=True):
        loss[torch.from_numpy(index)[batch.loss_mask[r, : len(index)].bool()]] = True
    dtype = policy.model.get_input_embeddings().weight.dtype
    logp, states = policy.forward_logprobs(
        pack.input_ids[None].to(device), pack.attention_mask(dtype).to(device), temperature=temperature,
        reference=reference, positions=loss[None], output_hidden_states=hidden,
        position_ids=pack.position_ids[None].to(device))
    width = batch.input_ids.shape[1]
    rows = [torch.nn.functional.pad(logp[0, torch.from_numpy(index).to(device)], (0, width - len(index)))
            for index in pack.index]
    return torch.stack(rows), None if states is None else states[0]
