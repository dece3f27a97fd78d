"""The fused LoRA forward: a hand-computed layer in both directions, the same policy and gradients as peft's
forward on a tiny Qwen2, peft's own forward for the reference pass and for any case but the plain one, the int8
base under it, a merge afterwards, and the switches (on, never keyed)."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import Linear as LoraLinear
from torch import nn

from components.params_load import load_params
from components.training.model import LoRASettings, build_policy
from components.training.speed.fused_lora import fuse_lora_forward, unfuse_lora_forward
from components.training.tiny import tiny_qwen2
from tests.training.lora_pair import IDS, MASK, loss_and_grads

TINY = {"hidden_size": 64, "intermediate_size": 128}


class _One(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2, bias=False)

    def forward(self, x):
        return self.proj(x)


def _peft_calls(monkeypatch) -> list[int]:
    """A counter of calls to peft's own LoRA forward."""
    calls = []
    own = LoraLinear.forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return own(self, *args, **kwargs)

    monkeypatch.setattr(LoraLinear, "forward", counted)
    return calls


def test_a_fused_lora_layer_matches_the_hand_computed_value_and_gradients(monkeypatch):
    model = get_peft_model(_One(), LoraConfig(r=1, lora_alpha=2, target_modules=["proj"]))  # scaling 2
    layer = model.base_model.model.proj
    with torch.no_grad():
        layer.base_layer.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        layer.lora_A["default"].weight.copy_(torch.tensor([[1.0, 1.0]]))
        layer.lora_B["default"].weight.copy_(torch.tensor([[2.0], [1.0]]))
    calls = _peft_calls(monkeypatch)
    assert fuse_lora_forward(model) == 1
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    y = model(x)
    assert calls == []  # the fused path, not peft's
    # W x = [5, 11]; A x = 3, scaled 6; B * 6 = [12, 6]
    assert y.tolist() == [[17.0, 17.0]]
    y.backward(torch.tensor([[1.0, -1.0]]))
    assert layer.lora_B["default"].weight.grad.tolist() == [[6.0], [-6.0]]  # g * (2 * A x)
    assert layer.lora_A["default"].weight.grad.tolist() == [[2.0, 4.0]]  # 2 * (B . g) * x, B . g = 1
    assert x.grad.tolist() == [[0.0, 0.0]]  # W^T g = [-2, -2], plus 2 * A^T (B . g) = [2, 2]
    assert layer.base_layer.weight.grad is None


def _pair(seed: int, alpha: int = 8):
    """Two policies with the same base and the same nonzero adapter (rank 4): peft's forward and the fused one."""
    lora = LoRASettings(r=4, alpha=alpha)
    peft_side = build_policy(tiny_qwen2(12, seed=seed, **TINY), lora=lora)
    fused_side = build_policy(tiny_qwen2(12, seed=seed, **TINY), lora=lora, fused_lora=True)
    torch.manual_seed(0)
    with torch.no_grad():
        for (name, a), (_, b) in zip(peft_side.model.named_parameters(), fused_side.model.named_parameters(),
                                     strict=True):
            if "lora_B" in name:
                a.normal_(std=0.1)
            if "lora_" in name:
                b.copy_(a)
    return peft_side, fused_side


@pytest.mark.parametrize("alpha", [8, 6], ids=["scaling 2", "scaling 1.5"])
def test_a_fused_policy_gives_peft_s_log_probs_and_gradients(monkeypatch, alpha):
    """The same numbers to the bit when the scaling (alpha / r) is a power of two, as in params.yaml's lora; to
    float rounding otherwise."""
    peft_side, fused_side = _pair(3, alpha)
    assert sum("forward" in m.__dict__ for m in fused_side.model.modules()) == 2 * 7  # 2 layers x 7 targets
    logp_p, ref_p, g_p = loss_and_grads(peft_side)
    calls = _peft_calls(monkeypatch)
    logp_f, ref_f, g_f = loss_and_grads(fused_side)
    assert len(calls) == 2 * 7  # the reference pass (adapter disabled) only: peft's forward, the base alone
    assert torch.equal(ref_f, ref_p)
    assert not torch.allclose(logp_p, ref_p, atol=1e-3)  # the adapter moves the policy
    assert set(g_f) == set(g_p) and all("lora_" in n for n in g_f)
    if alpha == 8:
        assert torch.equal(logp_f, logp_p) and all(torch.equal(g_f[n], g_p[n]) for n in g_p)
    assert torch.allclose(logp_f, logp_p, atol=1e-5)
    for name in g_p:
        assert torch.allclose(g_f[name], g_p[name], atol=1e-6, rtol=1e-4), name


def test_anything_but_the_plain_case_runs_peft_s_forward(monkeypatch):
    policy = build_policy(tiny_qwen2(12, seed=4, **TINY), lora=LoRASettings(r=4, alpha=8, dropout=0.1),
                          fused_lora=True)
    calls = _peft_calls(monkeypatch)
    with torch.no_grad():
        policy.token_logprobs(IDS, MASK)
    assert len(calls) == 2 * 7  # dropout on the adapter's input: peft's own forward, every layer


def test_zero3_shards_run_peft_s_forward(monkeypatch):
    policy = build_policy(tiny_qwen2(12, seed=4, **TINY), lora=LoRASettings(r=4, alpha=8), fused_lora=True)
    for module in policy.model.modules():
        if isinstance(module, LoraLinear):
            module.lora_A["default"].weight.ds_id = 0  # as DeepSpeed marks a partitioned parameter
    calls = _peft_calls(monkeypatch)
    with torch.no_grad():
        policy.token_logprobs(IDS, MASK)
    assert len(calls) == 2 * 7  # its weights are gathered only when its modules are called: peft calls them


def test_the_int8_base_runs_under_the_fused_forward():
    lora = LoRASettings(r=4, alpha=8)
    plain = build_policy(tiny_qwen2(12, seed=6, **TINY), lora=lora, int8_base=True)
    fused = build_policy(tiny_qwen2(12, seed=6, **TINY), lora=lora, int8_base=True, fused_lora=True)
    with torch.no_grad():
        for (name, a), (_, b) in zip(plain.model.named_parameters(), fused.model.named_parameters(), strict=True):
            if "lora_" in name:
                b.copy_(a.normal_(std=0.1) if "lora_B" in name else a)
        assert torch.allclose(plain.token_logprobs(IDS, MASK), fused.token_logprobs(IDS, MASK), atol=1e-5)


def test_unfuse_and_merge_give_peft_s_model_back():
    peft_side, fused_side = _pair(8)
    with torch.no_grad():
        expected = peft_side.token_logprobs(IDS, MASK)
        assert unfuse_lora_forward(fused_side.model) == 2 * 7
        assert torch.equal(fused_side.token_logprobs(IDS, MASK), expected)
        fuse_lora_forward(fused_side.model)
        merged = fused_side.model.merge_and_unload()  # Co-ReAct's generator merges a fused policy's adapter
        assert torch.allclose(merged(input_ids=IDS).logits, peft_side.model(input_ids=IDS).logits, atol=1e-5)


def test_fusing_needs_lora_layers_and_full_fine_tuning_ignores_the_switch():
    with pytest.raises(ValueError, match="LoRA model"):
        fuse_lora_forward(tiny_qwen2(12, seed=1))
    policy = build_policy(tiny_qwen2(12, seed=1), lora=None, fused_lora=True)  # nothing to fuse: no error
    assert not any("forward" in m.__dict__ for m in policy.model.modules())


def test_on_by_default_and_never_in_a_run_key():
    from components.training.grpo.policy_run_key import run_settings

    params = load_params()
    assert params.grpo.fused_lora is True and params.sft.fused_lora is True
    assert params.lora.alpha / params.lora.r == 2  # a power of two: peft's numbers to the bit (above)
    off = load_params(overrides=["grpo.fused_lora=false"])
    assert run_settings(off, "grpo") == run_settings(params, "grpo")
