"""Policies (LoRA and full fine-tuning) and their frozen references; DeepSpeed configs; import hygiene."""

import subprocess
import sys

import torch

from components.training.distributed import deepspeed_config, load_config_file
from components.training.losses import token_logprobs
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2

IDS = torch.tensor([[2, 3, 4, 5, 6, 7]])
MASK = torch.ones_like(IDS)


def _nudge(policy):
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    for _ in range(5):
        opt.zero_grad()
        (-policy.token_logprobs(IDS, MASK)[:, 1:].sum()).backward()
        opt.step()


def test_lora_reference_is_the_base_model_with_adapter_disabled():
    base = tiny_qwen2(12, seed=4)
    with torch.no_grad():
        base_logits = tiny_qwen2(12, seed=4)(input_ids=IDS).logits
    policy = build_policy(base, lora=LoRASettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert all(any(t in n for t in ("q_proj", "v_proj")) for n in names)
    _nudge(policy)
    with torch.no_grad():
        trained = policy.token_logprobs(IDS, MASK)
    ref = policy.token_logprobs(IDS, MASK, reference=True)
    assert not ref.requires_grad
    assert torch.allclose(ref, token_logprobs(base_logits, IDS), atol=1e-6)
    assert trained[:, 1:].sum() > ref[:, 1:].sum() + 0.1  # the adapter moved the policy, not the reference
    # the adapter is enabled again after the reference pass
    with torch.no_grad():
        assert torch.equal(policy.token_logprobs(IDS, MASK), trained)


def test_full_finetuning_reference_is_a_frozen_copy():
    policy = build_policy(tiny_qwen2(12, seed=4), lora=None)
    assert len(policy.trainable_parameters()) == len(list(policy.model.parameters()))
    before = policy.token_logprobs(IDS, MASK, reference=True)
    _nudge(policy)
    with torch.no_grad():
        trained = policy.token_logprobs(IDS, MASK)
    assert torch.equal(policy.token_logprobs(IDS, MASK, reference=True), before)
    assert trained[:, 1:].sum() > before[:, 1:].sum() + 0.1


def test_deepspeed_json_files_match_the_function():
    for stage in (2, 3):
        cfg = deepspeed_config(stage)
        assert load_config_file(stage) == cfg
        assert cfg["zero_optimization"]["stage"] == stage
        assert cfg["gradient_clipping"] == 1.0
    offloaded = deepspeed_config(3, offload_optimizer=True, offload_params=True, micro_batch_size=2)
    assert offloaded["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert offloaded["train_micro_batch_size_per_gpu"] == 2


def test_training_modules_never_import_gpu_only_packages():
    code = (
        "import sys\n"
        "import components.training\n"
        "from components.training import advantages, checkpoint, distributed, losses, model, rollout, sft, "
        "tiny, trainer\n"
        "bad = [m for m in ('vllm', 'deepspeed', 'trl', 'mlflow', 'prefect') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
