"""SFT's activation recomputation by micro-batch size: short micro-batches keep their activations, long ones
recompute them, and the update is the same either way."""

import pytest
import torch

from components.training.model import LoRASettings, activations_kept, build_policy, recomputes_activations
from components.training.params import SFTParams
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import CharTokenizer, tiny_qwen2
from tests.autograd_saved import saved_tensor_count

TOK = CharTokenizer("abcdefghijklmn")
EXAMPLES = [SFTExample([2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 1, 1]), SFTExample([3, 4, 5, 6], [0, 1, 1, 1])]


def trained(checkpointing: bool, min_tokens: int) -> tuple[dict[str, torch.Tensor], int]:
    """LoRA weights after one SFT step, and how many tensors autograd kept for backward in it (a recomputing
    layer keeps only its inputs)."""
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16),
                          gradient_checkpointing=checkpointing)
    config = SFTParams(lr=1e-2, batch_size=2, gradient_checkpointing=checkpointing, checkpoint_min_tokens=min_tokens)
    trainer = SFTTrainer(policy, EXAMPLES, config, pad_token_id=0, seed=0)
    with saved_tensor_count() as saved:
        trainer.step()
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n}
    return weights, saved[0]


def test_short_micro_batches_keep_activations_long_ones_recompute():
    plain, plain_saved = trained(False, 0)
    recomputed, recomputed_saved = trained(True, 0)        # 2 rows x 6 tokens = 12 >= 0: recomputes
    kept, kept_saved = trained(True, 13)                   # 12 < 13: keeps
    assert recomputed_saved * 5 < plain_saved
    assert kept_saved >= plain_saved
    assert trained(True, 12)[1] == recomputed_saved        # the threshold is "fewer than"
    assert any(n.count("lora_B") and p.abs().sum() > 0 for n, p in plain.items())  # B starts at 0: it moved
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], atol=1e-6)
        assert torch.allclose(plain[name], kept[name], atol=1e-6)


def test_activations_kept_restores_the_flags():
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16),
                          gradient_checkpointing=True)
    base = policy.model.get_base_model()
    with activations_kept(policy.model):
        assert not recomputes_activations(base)
    assert recomputes_activations(base)
    with pytest.raises(RuntimeError), activations_kept(policy.model):
        raise RuntimeError("boom")
    assert recomputes_activations(base)
