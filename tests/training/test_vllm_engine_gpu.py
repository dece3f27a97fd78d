"""The vLLM rollout engine against a real ``vllm`` on a GPU (``-m gpu``; skipped without CUDA or vLLM, which is
every machine this repository's CI has: scripts/gpu_tests.sh runs it where both exist).

A tiny random Qwen2 (head size 64, which vLLM's attention kernels take) is written to a folder and loaded by
:class:`components.training.engines.rollout.VLLMRolloutEngine` without a tokenizer (prompts are token ids).
Checked: greedy rollouts have the requested length and come with vLLM's log-probs, which agree with the
transformers model's for the same tokens; a published LoRA changes what is sampled, and publishing the zero
adapter gives the base's tokens back (each update gets a fresh adapter id, so vLLM loads the new weights).
"""

from __future__ import annotations

import pytest
import torch

from components.training.engines.rollout import SamplingParams
from components.training.model import LoRASettings, build_policy
from components.training.tiny import CharTokenizer, tiny_qwen2

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz0123456789")
PROMPTS = [[2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13]]


def test_the_real_vllm_engine_rolls_out_and_takes_each_update_as_a_lora(tmp_path):
    pytest.importorskip("vllm")
    from components.training.engines.rollout import VLLMRolloutEngine

    model = tiny_qwen2(TOK.vocab_size, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256, seed=0)
    model.save_pretrained(str(tmp_path / "base"))
    engine = VLLMRolloutEngine(str(tmp_path / "base"), tokenizer=TOK, max_lora_rank=8, adapter_dir=tmp_path / "lora",
                               dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True,
                               skip_tokenizer_init=True)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=())
    base = engine.generate(PROMPTS, greedy)
    assert [len(g.token_ids) for g in base] == [6, 6, 6]
    assert all(g.logprobs is not None and len(g.logprobs) == 6 for g in base)
    with torch.no_grad():  # vLLM's log-probs are the model's, to kernel precision
        for prompt, g in zip(PROMPTS, base, strict=True):
            ids = torch.tensor([prompt + g.token_ids])
            logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), dim=-1)
            hf = logp[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)]
            assert torch.allclose(hf, torch.tensor(g.logprobs), atol=1e-2)

    policy = build_policy(model, lora=LoRASettings(r=8, alpha=16))
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 2.0)
    engine.update_weights(policy, step=1)
    adapted = engine.generate(PROMPTS, greedy)
    assert [g.token_ids for g in adapted] != [g.token_ids for g in base]
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.zero_()
    engine.update_weights(policy, step=2)
    assert engine.adapter.request.lora_int_id == 2
    assert [g.token_ids for g in engine.generate(PROMPTS, greedy)] == [g.token_ids for g in base]


VLLM_SHARE = 0.3
"""vLLM's share of the GPU beside the trainer (``gpu_memory_utilization``; the paper profile's default is 0.35)."""


def test_training_with_vllm_on_the_same_gpu(tmp_path):
    """Colocated: the policy trains on CUDA while vLLM holds VLLM_SHARE of the same GPU; after each optimizer step the
    update reaches vLLM, whose log-probs are then the trained policy's (not the step before's)."""
    pytest.importorskip("vllm")
    from components.training.engines.rollout import VLLMRolloutEngine

    model = tiny_qwen2(TOK.vocab_size, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256, seed=0)
    model.save_pretrained(str(tmp_path / "base"))
    free0, total = torch.cuda.mem_get_info()
    engine = VLLMRolloutEngine(str(tmp_path / "base"), tokenizer=TOK, max_lora_rank=8, adapter_dir=tmp_path / "lora",
                               dtype="float32", gpu_memory_utilization=VLLM_SHARE, enforce_eager=True,
                               skip_tokenizer_init=True, max_model_len=256)
    held = free0 - torch.cuda.mem_get_info()[0]
    print(f"\nvLLM holds {held / 2**30:.1f} GiB of {total / 2**30:.0f} GiB ({held / total:.0%}; asked {VLLM_SHARE:.0%})")
    assert held <= (VLLM_SHARE + 0.05) * total
    policy = build_policy(model.cuda(), lora=LoRASettings(r=8, alpha=16))
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=5e-2)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=())
    try:
        for step in range(1, 4):
            gens = engine.generate(PROMPTS, sampling)
            ids = [p + g.token_ids for p, g in zip(PROMPTS, gens, strict=True)]
            width = max(map(len, ids))
            input_ids = torch.tensor([i + [0] * (width - len(i)) for i in ids], device="cuda")
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device="cuda")
            logp = policy.token_logprobs(input_ids, mask)
            with torch.no_grad():  # the rollouts' log-probs are this policy's before the step
                for row, (p, g) in enumerate(zip(PROMPTS, gens, strict=True)):
                    ours = logp[row, len(p):len(p) + len(g.token_ids)].float().cpu()
                    assert torch.allclose(ours, torch.tensor(g.logprobs), atol=1e-3), step
            loss = -(logp * mask).sum() / mask.sum()  # reinforce every sampled token: the policy moves
            opt.zero_grad()
            loss.backward()
            opt.step()
            engine.update_weights(policy, step=step)
        print(f"3 colocated steps; peak trainer memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    finally:
        engine.close()
    assert torch.cuda.mem_get_info()[0] >= free0 - 0.05 * total  # close handed vLLM's share back
