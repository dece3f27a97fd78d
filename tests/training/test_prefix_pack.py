"""Shared-prefix packs: their layout (tokens, positions, who sees whom), the budget and share limits, and that one
forward pass over a pack gives each row the logits separate passes give it (a tiny random Qwen2, eager and sdpa)."""

import numpy as np
import pytest
import torch

from components.embedded.tiny import tiny_qwen2
from components.training.speed.prefix_pack import pack_shared_prefixes


def test_a_pack_lays_out_each_shared_prefix_once_and_each_token_sees_only_its_own_row():
    (pack,) = pack_shared_prefixes([[1, 2, 5], [1, 2, 3, 4]], budget=None)
    assert pack.rows == [1, 0]  # the longest row first: it is the trunk
    assert pack.input_ids.tolist() == [1, 2, 3, 4, 5] and pack.position_ids.tolist() == [0, 1, 2, 3, 2]
    assert [i.tolist() for i in pack.index] == [[0, 1, 2, 3], [0, 1, 4]]
    expected = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # the branch's token sees the shared prefix and itself, not the trunk's 3 and 4
    ], dtype=bool)
    assert np.array_equal(pack.visible().numpy(), expected)
    mask = pack.attention_mask(torch.float32)
    assert mask.shape == (1, 1, 5, 5) and mask[0, 0, 4, 2] == torch.finfo(torch.float32).min and mask[0, 0, 4, 1] == 0


def test_a_row_joins_the_pack_it_shares_most_with_and_branches_from_its_closest_row():
    (pack,) = pack_shared_prefixes([[7, 8, 9, 10], [7, 8, 9, 11, 12], [7, 6]], budget=None)
    assert pack.rows == [1, 0, 2]
    assert [i.tolist() for i in pack.index] == [[0, 1, 2, 3, 4], [0, 1, 2, 5], [0, 6]]
    assert pack.input_ids.tolist() == [7, 8, 9, 11, 12, 10, 6]


def test_the_budget_opens_new_packs_and_a_longer_row_stands_alone():
    packs = pack_shared_prefixes([[1, 2, 3, 4], [1, 2, 3, 5], [9] * 6], budget=5)
    assert [p.rows for p in packs] == [[2], [0, 1]]  # 6 tokens alone; then 4 + 1 branch token = 5
    packs = pack_shared_prefixes([[1, 2, 3, 4], [1, 2, 3, 5]], budget=4)
    assert [p.rows for p in packs] == [[0], [1]]


def test_the_share_limit_keeps_a_rows_tail_in_its_own_branch():
    (pack,) = pack_shared_prefixes([[1, 2, 3, 4], [1, 2, 3, 5]], budget=None, share_limit=[4, 1])
    assert [i.tolist() for i in pack.index] == [[0, 1, 2, 3], [0, 4, 5, 6]]
    assert pack.position_ids.tolist() == [0, 1, 2, 3, 1, 2, 3]
    (same,) = pack_shared_prefixes([[1, 2, 3], [1, 2, 3]], budget=None)  # a duplicate keeps its last token
    assert [i.tolist() for i in same.index] == [[0, 1, 2], [0, 1, 3]]
    with pytest.raises(ValueError, match="share_limit"):
        pack_shared_prefixes([[1], [2]], budget=None, share_limit=[1])


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@torch.no_grad()
def test_one_pass_over_a_pack_gives_each_row_its_own_passs_logits(attention):
    model = tiny_qwen2(64, max_positions=64, seed=3).eval()
    model.config._attn_implementation = attention
    g = torch.Generator().manual_seed(0)
    trunk = torch.randint(2, 64, (12,), generator=g).tolist()
    rows = [trunk, trunk[:5] + torch.randint(2, 64, (4,), generator=g).tolist(), trunk[:9] + [3, 4],
            torch.randint(2, 64, (6,), generator=g).tolist()]  # the last shares nothing: a separate tree
    (pack,) = pack_shared_prefixes(rows, budget=None)
    out = model(input_ids=pack.input_ids[None], position_ids=pack.position_ids[None],
                attention_mask=pack.attention_mask(torch.float32), use_cache=False).logits[0]
    assert len(pack) == 12 + 4 + 2 + 6
    for r, index in zip(pack.rows, pack.index):
        alone = model(input_ids=torch.tensor([rows[r]]), use_cache=False).logits[0]
        assert torch.allclose(out[torch.from_numpy(index)], alone, atol=1e-5), (attention, r)


def test_only_attention_that_applies_a_given_mask_takes_packs():
    from types import SimpleNamespace

    from components.training.speed.prefix_pack import takes_packs

    def model(attention):
        return SimpleNamespace(config=SimpleNamespace(_attn_implementation=attention))

    assert takes_packs(model("sdpa")) and takes_packs(model("eager"))
    assert not takes_packs(model("flash_attention_2")) and not takes_packs(model("flex_attention"))
