"""Int8 matmuls for the frozen base of a LoRA policy: exact on values int8 holds exactly, close to fp32
otherwise, gradients for the adapter only, the reference pass through them too, and the switch off by default
and out of the run keys while off."""

import pytest
import torch
from torch import nn

from components.params_load import load_params
from components.training.losses import token_logprobs
from components.training.model import LoRASettings, build_policy
from components.training.speed.int8_base import int8_linear, quantize_frozen_base, quantize_rows, restore_fp32
from components.training.tiny import tiny_qwen2
from tests.training.lora_pair import IDS, MASK, loss_and_grads


def _frozen(weight: list[list[float]]) -> nn.Linear:
    lin = nn.Linear(len(weight[0]), len(weight), bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(weight))
    lin.weight.requires_grad_(False)
    return lin


def test_quantize_rows_keeps_a_row_whose_absmax_is_127():
    q, scale = quantize_rows(torch.tensor([[127.0, -3.0, 0.0], [2.0, 1.0, -0.5]]))
    assert q.dtype == torch.int8
    assert q[0].tolist() == [127, -3, 0] and scale[0].item() == 1.0
    assert q[1].tolist() == [127, 64, -32]  # 2 -> 127, 1 -> 63.5 rounds to 64, -0.5 -> -31.75 rounds to -32


def test_int8_linear_is_exact_where_int8_holds_every_value():
    # every row and every column of W reaches 127, and so does the input row and the output gradient: every
    # scale is 1 and the int32 accumulation is exact
    lin = int8_linear(_frozen([[127.0, -1.0], [2.0, 127.0]]))
    x = torch.tensor([[127.0, 3.0]], requires_grad=True)
    y = lin(x)
    assert y.tolist() == [[127 * 127 - 3, 2 * 127 + 3 * 127]]  # 16126, 635
    y.backward(torch.tensor([[127.0, -2.0]]))
    assert x.grad.tolist() == [[127 * 127 - 2 * 2, 127 * -1 - 2 * 127]]  # g @ W: 16125, -381


def test_int8_linear_is_close_to_fp32_in_both_directions():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=True)
    lin.requires_grad_(False)
    x = torch.randn(3, 5, 64)
    g = torch.randn(3, 5, 48)
    x32 = x.clone().requires_grad_(True)
    y32 = lin(x32)
    y32.backward(g)
    x8 = x.clone().requires_grad_(True)
    y8 = int8_linear(lin)(x8)
    y8.backward(g)
    assert y8.shape == y32.shape
    assert (y8 - y32).norm() / y32.norm() < 0.02
    assert (x8.grad - x32.grad).norm() / x32.grad.norm() < 0.02
    assert not torch.equal(y8, y32)  # it is the int8 path, not the fp32 one


def test_int8_linear_refuses_trainable_or_non_float32_weights():
    with pytest.raises(ValueError, match="frozen"):
        int8_linear(nn.Linear(4, 4))
    lin = nn.Linear(4, 4).to(torch.float64).requires_grad_(False)
    with pytest.raises(ValueError, match="float32"):
        int8_linear(lin)
    with pytest.raises(ValueError, match="CPU option"):  # any device but the CPU (a GPU's weights alike)
        int8_linear(nn.Linear(4, 4, device="meta").requires_grad_(False))


def test_a_lora_policy_on_an_int8_base_trains_the_adapter_like_fp32():
    lora = LoRASettings(r=4, alpha=8)
    fp32 = build_policy(tiny_qwen2(12, hidden_size=64, intermediate_size=128, seed=3), lora=lora)
    int8 = build_policy(tiny_qwen2(12, hidden_size=64, intermediate_size=128, seed=3), lora=lora, int8_base=True)
    torch.manual_seed(0)
    for (name, a), (_, b) in zip(fp32.model.named_parameters(), int8.model.named_parameters(), strict=True):
        with torch.no_grad():
            if "lora_B" in name:  # B starts at zero: a nonzero B, so that the adapter moves the policy
                a.normal_(std=0.1)
            if "lora_" in name:  # the same adapter on both bases (peft draws A from the global generator)
                b.copy_(a)
    logp32, ref32, g32 = loss_and_grads(fp32)
    logp8, ref8, g8 = loss_and_grads(int8)
    assert set(g8) == set(g32) and all("lora_" in n for n in g8)  # the base gets no gradient
    for int8_side, fp32_side in ((logp8, logp32), (ref8, ref32)):  # the reference pass runs int8 too
        diff = (int8_side - fp32_side)[:, 1:].abs()
        assert 0 < diff.mean() < 0.05 and diff.max() < 0.15
    flat32 = torch.cat([g32[n].flatten() for n in sorted(g32)])
    flat8 = torch.cat([g8[n].flatten() for n in sorted(g8)])
    assert torch.nn.functional.cosine_similarity(flat8, flat32, dim=0) > 0.98


def test_every_base_linear_under_lora_is_patched_and_restore_gives_fp32_back():
    model = tiny_qwen2(12, seed=5)
    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    with torch.no_grad():
        before = policy.token_logprobs(IDS, MASK)
    assert quantize_frozen_base(policy.model) == 2 * 2  # two layers, q_proj and v_proj
    with torch.no_grad():
        assert not torch.equal(policy.token_logprobs(IDS, MASK), before)
    assert restore_fp32(policy.model) == 4
    with torch.no_grad():
        assert torch.equal(policy.token_logprobs(IDS, MASK), before)


def test_int8_base_needs_lora():
    with pytest.raises(ValueError, match="needs LoRA"):
        build_policy(tiny_qwen2(12, seed=1), lora=None, int8_base=True)
    with pytest.raises(ValueError, match="LoRA model"):
        quantize_frozen_base(tiny_qwen2(12, seed=1))


def test_the_switch_is_off_by_default_and_keyed_only_when_on():
    params = load_params()
    assert params.grpo.int8_base is False and params.sft.int8_base is False
    assert "int8_base" not in params.grpo.model_dump() and "int8_base" not in params.sft.model_dump()
    on = load_params(overrides=["grpo.int8_base=true", "sft.int8_base=true"])
    assert on.grpo.model_dump()["int8_base"] is True and on.sft.model_dump()["int8_base"] is True


def test_a_merge_after_restore_serves_the_merged_weights_on_a_fresh_int8_base():
    """Co-ReAct's generator rebase: restore, merge the trained adapter, quantize again (no stale int8 copies)."""
    lora = LoRASettings(r=4, alpha=8)
    int8 = build_policy(tiny_qwen2(12, hidden_size=64, intermediate_size=128, seed=7), lora=lora, int8_base=True)
    fp32 = build_policy(tiny_qwen2(12, hidden_size=64, intermediate_size=128, seed=7), lora=lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for (name, a), (_, b) in zip(fp32.model.named_parameters(), int8.model.named_parameters(), strict=True):
            if "lora_B" in name:
                a.normal_(std=0.2)
            if "lora_" in name:
                b.copy_(a)
    restore_fp32(int8.model)
    merged, merged_fp32 = int8.model.merge_and_unload(), fp32.model.merge_and_unload()
    with torch.no_grad():
        assert torch.equal(merged(input_ids=IDS).logits, merged_fp32(input_ids=IDS).logits)  # no stale int8 copy
        expected = token_logprobs(merged_fp32(input_ids=IDS).logits, IDS)
    fresh = build_policy(merged, lora=lora, int8_base=True)
    with torch.no_grad():
        served = fresh.token_logprobs(IDS, MASK, reference=True)
    assert 0 < (served - expected)[:, 1:].abs().mean() < 0.05  # the merged weights, through int8


def test_recomputed_activations_give_the_same_int8_gradients():
    """ARCO's policy recomputes every micro-batch's activations in the backward pass: int8 under it as without."""
    lora = LoRASettings(r=4, alpha=8)
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(2)  # the same LoRA A draw on both
        policy = build_policy(tiny_qwen2(12, hidden_size=64, intermediate_size=128, seed=9), lora=lora,
                              int8_base=True, gradient_checkpointing=checkpointing)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.05)
        policy.model.train()
        grads.append(loss_and_grads(policy)[2])
    assert set(grads[0]) == set(grads[1])
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name
