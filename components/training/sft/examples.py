"""Supervised fine-tuning with span masking: only assistant-generated spans are learned.

A training text is a list of ``(text, trainable)`` segments, e.g. system prompt and question (False),
the assistant's thought and tool call (True), the tool's output (False), the next assistant turn (True).
Each segment is tokenized on its own and the ids concatenated, so span boundaries are exact token
boundaries (when segments end at chat-template special tokens this equals tokenizing the whole text;
elsewhere a merge across a boundary can differ). The loss is next-token cross-entropy at trainable positions only, with the same
aggregation options as the RL loss.

Usage::

    ex = build_sft_example([("Q: ...\\n", False), ("Action: search[...]\\n", True)], tokenizer)
    batch = collate_sft([ex], pad_token_id=tokenizer.pad_token_id)
    loss = sft_loss(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                    batch.input_ids, batch.loss_mask)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from components.training.losses import LossAgg, aggregate, token_logprobs

__all__ = ["SFTBatch", "SFTExample", "build_sft_example", "collate_sft", "sft_loss"]


@dataclass
class SFTExample:
    """Token ids and a 0/1 loss mask of the same length (1 = learn to predict this token)."""

    input_ids: list[int]
    loss_mask: list[int]


def build_sft_example(
    segments: Sequence[tuple[str, bool]],
    tokenizer: Any,
    *,
    max_length: int | None = None,
) -> SFTExample:
    """Tokenize ``(text, trainable)`` segments (no special tokens added) and mark trainable tokens.

    ``tokenizer`` needs ``encode(text, add_special_tokens=False) -> list[int]``. The first token is never
    trainable (nothing precedes it). ``max_length`` cuts the sequence at the right.
    """
    if not segments:
        raise ValueError("no segments")
    ids: list[int] = []
    mask: list[int] = []
    for text, trainable in segments:
        toks = list(tokenizer.encode(text, add_special_tokens=False))
        ids.extend(toks)
        mask.extend([int(bool(trainable))] * len(toks))
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    if mask:
        mask[0] = 0
    return SFTExample(ids, mask)


@dataclass
class SFTBatch:
    """Right-padded rows ``[B, T]``: token ids, 0/1 attention mask and boolean loss mask."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor


def collate_sft(examples: Sequence[SFTExample], *, pad_token_id: int) -> SFTBatch:
    """Right-pad examples into an :class:`SFTBatch`."""
    width = max(max(len(e.input_ids) for e in examples), 1)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[i, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.bool)
    return SFTBatch(input_ids, attention, loss_mask)


def sft_loss(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    agg: LossAgg = "token_mean",
) -> torch.Tensor:
    """Mean negative log-likelihood of the tokens where ``loss_mask`` is 1 (aggregated by ``agg``)."""
    return aggregate(-token_logprobs(logits, input_ids), loss_mask, agg)
