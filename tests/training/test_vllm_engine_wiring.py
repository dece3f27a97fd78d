"""`train_policy.engine: vllm` on a CPU machine: the warm-started base is exported as a transformers folder
whose weights are the policy's base (LoRA left out), and the engine is built from params with that folder,
the LoRA rank and the colocation options. vLLM itself is replaced by a stub module that records what it is
given (the real engine is exercised by the `vllm` tests on the CPU and the `gpu` tests on CUDA)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from transformers import AutoModelForCausalLM

from components.params_load import load_params
from components.policy_run import make_engine
from components.run_spec import run_spec
from components.training.engines.vllm_base import base_state_dict, export_base
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2


@pytest.fixture
def policy():
    torch.manual_seed(0)
    model = tiny_qwen2(vocab_size=40, seed=0)
    pol = build_policy(model, lora=LoRASettings(r=4, alpha=8))
    with torch.no_grad():  # a trained-looking adapter, so "base" and "with adapter" differ
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    return pol


def test_the_exported_base_is_the_policy_without_its_adapter(policy, tmp_path):
    names = base_state_dict(policy.model)
    assert not any("lora_" in n or "base_layer" in n for n in names)
    folder = export_base(policy.model, None, tmp_path, identity="tiny|warm-digest")
    assert export_base(policy.model, None, tmp_path, identity="tiny|warm-digest") == folder  # written once
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[3, 5, 7, 11, 2]])
    with torch.no_grad(), policy.model.disable_adapter():
        base_logits = policy.model(ids).logits
    with torch.no_grad():
        adapted_logits = policy.model(ids).logits
        exported_logits = reloaded(ids).logits
    assert torch.allclose(exported_logits, base_logits, atol=1e-6)
    assert not torch.allclose(exported_logits, adapted_logits, atol=1e-3)  # the adapter really was left out
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no staging folder left behind


@pytest.fixture
def fake_vllm(monkeypatch):
    built = {}

    class LLM:
        def __init__(self, **kwargs):
            built.update(kwargs)

        def get_tokenizer(self):
            return None

    class LoRARequest:  # vLLM's fields (vllm/lora/request.py), by keyword as the slot passes them
        def __init__(self, *, lora_name, lora_int_id, lora_path):
            self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, module in {"vllm": vllm, "vllm.lora": lora, "vllm.lora.request": request}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return built


def test_the_vllm_engine_loads_the_exported_base_and_takes_each_update_as_a_lora(
        repo_root, tmp_path, policy, fake_vllm):
    warm = tmp_path / "warm_adapter"
    policy.model.save_pretrained(str(warm))  # stands in for the warm-start adapter merged into the base
    params = load_params(repo_root / "params.yaml", overrides=[
        f"run.cache_dir={tmp_path / 'cache'}", "train_policy.engine=vllm", "lora.r=4",
        "train_policy.vllm_options={gpu_memory_utilization: 0.3}"])
    engine = make_engine(run_spec(params), policy, tokenizer=None, base_adapters=[str(warm)])
    assert fake_vllm["model"].startswith(str(tmp_path / "cache" / "vllm_base"))
    assert fake_vllm["enable_lora"] is True and fake_vllm["max_lora_rank"] == 8  # r 4, rounded up to a rank vLLM takes
    assert fake_vllm["gpu_memory_utilization"] == 0.3 and fake_vllm["seed"] == params.seed
    engine.update_weights(policy, step=3)
    request = engine.adapter.request
    assert request.lora_int_id == 1 and request.lora_path.endswith("step_000003")
    engine.update_weights(policy, step=4)
    assert engine.adapter.request.lora_int_id == 2  # a fresh id makes vLLM load the new weights


def test_full_fine_tuning_is_refused_by_the_vllm_engine(repo_root, fake_vllm):
    params = load_params(repo_root / "params.yaml", overrides=["train_policy.engine=vllm"])
    full = types.SimpleNamespace(is_lora=False, model=tiny_qwen2(vocab_size=40, seed=0))
    with pytest.raises(ValueError, match="LoRA policies only"):
        make_engine(run_spec(params), full, tokenizer=None)
    assert fake_vllm == {}  # refused before any engine was built


def test_under_the_paper_profile_a_trained_policy_is_evaluated_by_vllm_over_the_base_it_was_rolled_out_from(
        repo_root, tmp_path, policy, fake_vllm):
    """evaluate@<variant> with train_policy.engine: vllm: the exported warm-started base (what the rollouts ran on)
    with the RL adapter as vLLM's one LoRA, not the warm start's served LoRA module with a second one stacked."""
    from components.llm.factory import LLMPool
    from components.trained_policy import with_trained_policy
    from components.training.warm_started import warm_start_adapter

    out, cache = tmp_path / "out", tmp_path / "cache"
    params = load_params(repo_root / "params.yaml", profile="paper",
                         overrides=[f"run.out_dir={out}", f"run.cache_dir={cache}", "lora.r=4"])
    warm = warm_start_adapter(run_spec(params), "react")
    policy.model.save_pretrained(str(warm))  # stands in for the sft stage's adapter
    make_engine(run_spec(params), policy, tokenizer=None, base_adapters=[str(warm)])  # train_policy exports the base
    exported = fake_vllm["model"]
    rl = out / "train" / "arbor" / "adapter"
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.25)  # another adapter than the warm start's
    policy.model.save_pretrained(str(rl))
    fake_vllm.clear()
    with pytest.raises(FileNotFoundError, match="no adapter"):
        with_trained_policy(params, "dapo")  # not trained under this out_dir
    evaluated = with_trained_policy(params, "arbor")
    backend_name = evaluated.methods["arbor"].roles["policy"]
    backend = evaluated.llm.backends[backend_name]
    assert (backend.type, backend.model, backend.adapters) == ("vllm", exported, [str(rl)])
    assert evaluated.methods["arbor"].agent == evaluated.methods["sft"].agent == "react"
    pool = LLMPool(evaluated)
    model = pool.backend(backend_name)
    assert fake_vllm["model"] == exported and fake_vllm["max_lora_rank"] == 8
    assert model.adapter.request.lora_path == str(rl)
    other = load_params(repo_root / "params.yaml", profile="paper",
                        overrides=[f"run.out_dir={out}", f"run.cache_dir={tmp_path / 'other_cache'}", "lora.r=4"])
    with pytest.raises(FileNotFoundError, match="holds no warm-started base"):
        with_trained_policy(other, "arbor")
