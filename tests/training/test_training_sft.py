"""SFT span masking: only trainable segments count, checked against a hand computation."""

import math

import pytest
import torch

from components.training.sft.examples import SFTExample, build_sft_example, collate_sft, sft_loss
from components.training.tiny import CharTokenizer

TOK = CharTokenizer("abcdefg")  # a=2 ... g=8


def test_build_example_marks_only_trainable_spans():
    ex = build_sft_example([("ab", False), ("cd", True), ("ef", False), ("g", True)], TOK)
    assert ex.input_ids == [2, 3, 4, 5, 6, 7, 8]
    assert ex.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    # the first token has no prefix, so it is never trainable
    assert build_sft_example([("ab", True)], TOK).loss_mask == [0, 1]
    assert build_sft_example([("abc", False), ("def", True)], TOK, max_length=4).loss_mask == [0, 0, 0, 1]


def _log_softmax(row, index):
    return row[index] - math.log(sum(math.exp(v) for v in row))


def test_sft_loss_counts_only_trainable_tokens():
    ex = build_sft_example([("ab", False), ("cd", True), ("ef", False), ("g", True)], TOK)
    batch = collate_sft([ex], pad_token_id=TOK.pad_token_id)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 7, TOK.vocab_size, generator=gen, dtype=torch.float64)
    rows = logits[0].tolist()
    ids = ex.input_ids
    # tokens at positions 2, 3, 6 are trainable; each is predicted from the logits one position earlier
    expected = -sum(_log_softmax(rows[t - 1], ids[t]) for t in (2, 3, 6)) / 3
    got = sft_loss(logits, batch.input_ids, batch.loss_mask)
    assert got.item() == pytest.approx(expected, abs=1e-12)

    # logits that predict prompt/observation tokens (positions 0, 3, 4) do not matter
    changed = logits.clone()
    changed[0, [0, 3, 4]] = 100.0 * torch.randn(3, TOK.vocab_size, generator=gen, dtype=torch.float64)
    assert sft_loss(changed, batch.input_ids, batch.loss_mask).item() == pytest.approx(
        expected, abs=1e-12
    )
    # but the ones predicting trainable tokens do
    changed[0, 1] += 5.0 * torch.randn(TOK.vocab_size, generator=gen, dtype=torch.float64)
    assert sft_loss(changed, batch.input_ids, batch.loss_mask).item() != pytest.approx(expected)


def test_collate_right_pads_and_masks_padding():
    batch = collate_sft([SFTExample([2, 3, 4], [0, 1, 1]), SFTExample([5, 6], [0, 1])], pad_token_id=0)
    assert batch.input_ids.tolist() == [[2, 3, 4], [5, 6, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.loss_mask.tolist() == [[False, True, True], [False, True, False]]
