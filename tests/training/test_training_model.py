"""Policies (LoRA and full fine-tuning) and their frozen references; masked log-probs and hidden states
against the full-sequence computation; DeepSpeed configs; import hygiene."""

import subprocess
import sys

import pytest
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
        "from components.training import checkpoint, distributed, losses, model, tiny\n"
        "from components.training.engines import rollout\n"
        "from components.training.grpo import advantages, trainer\n"
        "from components.training.sft import examples\n"
        "bad = [m for m in ('vllm', 'deepspeed', 'trl', 'mlflow', 'prefect') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


def full_sequence_logprobs(model, ids, mask, temperature=1.0):
    """What ``Policy.token_logprobs`` computed before masked positions: logits at every position, then an fp32
    log-softmax over the whole vocabulary."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    scaled = logits[:, :-1].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    picked = scaled.gather(-1, ids[:, 1:, None])[..., 0] - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))


def _padded_batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, 40, (3, 12), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0  # right padding
    ids[1, 9:] = 0
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[0, 5:8] = True
    loss_mask[1, 4:9] = True
    loss_mask[2, 6:7] = True
    weights = torch.randn(ids.shape, generator=g)
    return ids, attention, loss_mask, weights


def _lora_policy(dtype=torch.float32):
    policy = build_policy(tiny_qwen2(40, seed=6).to(dtype), lora=LoRASettings(r=4, alpha=8))
    with torch.no_grad():  # a non-trivial adapter, so its gradients are not the trivial lora_A = 0 case
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    return policy


def _grads(policy):
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_masked_logprobs_equal_the_full_sequence_values_and_gradients(temperature):
    ids, attention, loss_mask, weights = _padded_batch()
    policy = _lora_policy()
    heads = []  # rows the LM head projects: one per masked position, not the rows' whole span
    policy.model.get_output_embeddings().register_forward_hook(lambda _m, args, _o: heads.append(args[0].shape))

    full = full_sequence_logprobs(policy.model, ids, attention, temperature)
    (full * weights * loss_mask).sum().backward()
    expected = _grads(policy)
    policy.model.zero_grad(set_to_none=True)

    part = policy.token_logprobs(ids, attention, temperature=temperature, positions=loss_mask)
    assert heads[-1][:-1] == (int(loss_mask.sum()),)
    assert part.shape == ids.shape
    assert torch.allclose(part[loss_mask], full[loss_mask].detach(), atol=1e-5)
    assert torch.all(part[~loss_mask] == 0)
    (part * weights * loss_mask).sum().backward()
    got = _grads(policy)
    assert got.keys() == expected.keys() and len(got) > 0
    for name, grad in expected.items():
        assert torch.allclose(got[name], grad, atol=1e-5, rtol=1e-4), name
    assert sum(float(g.abs().sum()) for g in got.values()) > 1e-2

    whole = policy.token_logprobs(ids, attention, temperature=temperature)  # positions=None: every position
    assert torch.allclose(whole, full.detach(), atol=1e-5)
    ref_part = policy.token_logprobs(ids, attention, reference=True, positions=loss_mask)
    with policy.reference() as ref:
        ref_full = full_sequence_logprobs(ref, ids, attention).detach()
    assert not ref_part.requires_grad
    assert torch.allclose(ref_part[loss_mask], ref_full[loss_mask], atol=1e-5)


def test_masked_logprobs_in_bf16_match_the_full_sequence():
    ids, attention, loss_mask, weights = _padded_batch()
    policy = _lora_policy(torch.bfloat16)
    assert policy.model(input_ids=ids).logits.dtype == torch.bfloat16
    full = full_sequence_logprobs(policy.model, ids, attention)
    (full * weights * loss_mask).sum().backward()
    expected = _grads(policy)
    policy.model.zero_grad(set_to_none=True)
    part = policy.token_logprobs(ids, attention, positions=loss_mask)
    assert part.dtype == torch.float32
    # the LM head runs on fewer rows, so bf16 matmuls may round differently in the last bits
    assert torch.allclose(part[loss_mask], full[loss_mask].detach(), atol=2e-2)
    (part * weights * loss_mask).sum().backward()
    for name, grad in _grads(
        policy
    ).items():  # peft keeps the adapter in fp32; the base (and logits) are bf16
        assert torch.allclose(grad.float(), expected[name].float(), atol=2e-2, rtol=5e-2), name


def test_positions_that_do_not_match_the_batch_are_rejected():
    policy = _lora_policy()
    ids, attention, loss_mask, _ = _padded_batch()
    with pytest.raises(ValueError, match="positions"):
        policy.token_logprobs(ids, attention, positions=loss_mask[:, :-1])
    with_first = loss_mask.clone()
    with_first[:, 0] = True  # position 0 has no prefix: never scored
    logp = policy.token_logprobs(ids, attention, positions=with_first)
    assert torch.all(logp[:, 0] == 0) and torch.equal(logp, policy.token_logprobs(ids, attention, positions=loss_mask))


def test_forward_logprobs_returns_hidden_states_from_the_same_pass():
    ids, attention, loss_mask, _ = _padded_batch()
    policy = _lora_policy()
    score_head = torch.nn.Linear(32, 1)
    forwards = []
    policy.model.get_base_model().model.register_forward_hook(lambda *a: forwards.append(1))
    logp, hidden = policy.forward_logprobs(ids, attention, positions=loss_mask, output_hidden_states=True)
    assert len(forwards) == 1
    assert hidden.shape == (3, 12, 32)
    assert torch.equal(logp, policy.token_logprobs(ids, attention, positions=loss_mask))
    with torch.no_grad():
        out = policy.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
    assert torch.allclose(hidden, out.hidden_states[-1], atol=1e-6)  # the final norm's output
    assert torch.allclose(
        policy.model.get_output_embeddings()(hidden), out.logits, atol=1e-5
    )  # the head input
    # a loss hook adds a term from hidden states: one backward reaches the head and the adapter
    loss = -(logp * loss_mask).sum() + score_head(hidden[:, -1]).pow(2).sum()
    loss.backward()
    assert score_head.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in policy.trainable_parameters())
    _, none = policy.forward_logprobs(ids, attention, positions=loss_mask)
    assert none is None
    _, ref_hidden = policy.forward_logprobs(ids, attention, reference=True, output_hidden_states=True)
    assert not ref_hidden.requires_grad and not torch.allclose(ref_hidden, hidden.detach(), atol=1e-4)
