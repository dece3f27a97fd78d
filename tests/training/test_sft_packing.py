"""``sft.prefix_packing``: an SFT micro-batch runs as one shared-prefix pack, and the step is the padded step's
(loss, weights after it) with fewer tokens through the model; off, the setting leaves the stage's key and dumps as
they were.

    .venv/bin/python -m pytest -q tests/training/test_sft_packing.py
"""

import pytest
import torch

from components.training.model import LoRASettings, build_policy
from components.training.params import SFTParams
from components.training.prompt_order import PromptSampler
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefghijklmn")
HISTORY = [2, 3, 4, 5, 6, 7, 8]
# two turn rows of one episode (the second repeats the first's history and reply) and a row of another; the
# longest is not first, so the pack's row order differs from the batch's
EXAMPLES = [
    SFTExample(HISTORY + [9, 10], [0] * 7 + [1, 1]),
    SFTExample([11, 12, 13, 2, 3], [0, 0, 1, 1, 1]),
    SFTExample(HISTORY + [9, 10, 4, 5, 11, 12], [0] * 10 + [1, 1, 1]),
]


def step(packing: bool, loss_agg: str = "token_mean") -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
    config = SFTParams(lr=1e-2, batch_size=3, prefix_packing=packing, loss_agg=loss_agg)
    trainer = SFTTrainer(policy, EXAMPLES, config, pad_token_id=0, seed=1)
    assert trainer.packs is packing
    metrics = trainer.step()
    return metrics, {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_a_packed_step_is_the_padded_step(loss_agg):
    # seed 1 draws the rows in their own order, and a pack lays out the longest first: the two orders differ
    assert PromptSampler(len(EXAMPLES), 1, True).next(3) == [0, 1, 2]
    padded, padded_weights = step(False, loss_agg)
    packed, packed_weights = step(True, loss_agg)
    assert padded["pass_tokens"] == 3 * 13
    # the long row whole (13); the shorter turn row of its episode from the token before its first loss token on
    # (3: its first 6 tokens are the long row's); the other episode's row whole (5)
    assert packed["pass_tokens"] == 13 + 3 + 5
    assert packed["tokens"] == padded["tokens"] == 2 + 3 + 3
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-6)
    assert any(n.count("lora_B") and w.abs().sum() > 0 for n, w in padded_weights.items())  # B starts at 0
    for name, weight in padded_weights.items():
        assert torch.allclose(weight, packed_weights[name], atol=1e-6), name


def test_packing_off_leaves_dumps_as_they_were():
    assert "prefix_packing" not in SFTParams().model_dump()
    assert SFTParams(prefix_packing=True).model_dump()["prefix_packing"] is True
