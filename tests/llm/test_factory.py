import asyncio

import pytest

from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import PermanentLLMError, TransientLLMError, user
from components.llm.factory import LLMPool
from components.params_load import load_params
from tests.conftest import requires_embedded


def test_roles_share_backends_and_account_separately(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    judge = ScriptedChatModel(lambda m, s: "yes", name="judge-model")
    with LLMPool(params, overrides={"embedded-1_5b": judge}) as pool:
        a, b = pool.role("answer_judge"), pool.role("verifier")
        assert a.inner is b.inner is judge
        asyncio.run(a.chat([user("x")]))
        asyncio.run(a.chat([user("y")]))
        asyncio.run(b.chat([user("z")]))
        metrics = pool.accounting.metrics()
        assert metrics["llm.answer_judge.calls"] == 2 and metrics["llm.verifier.calls"] == 1
        council = pool.roles("council_judges")
        assert [c.role for c in council] == ["council_judges[0]", "council_judges[1]"]
        with pytest.raises(KeyError, match="use roles"):
            pool.role("council_judges")


def test_scripted_backend_cannot_come_from_params(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    params.llm.backends["embedded-1_5b"].type = "scripted"
    with LLMPool(params) as pool, pytest.raises(PermanentLLMError, match="unit tests only"):
        pool.backend("embedded-1_5b")


def test_scripted_backend_replays_errors_through_middleware(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    params.llm.middleware.backoff_initial_s = 0.0
    params.llm.middleware.backoff_jitter_s = 0.0
    script = ScriptedChatModel([TransientLLMError("flaky"), "ok"])
    with LLMPool(params, overrides={"embedded-1_5b": script}) as pool:
        out = asyncio.run(pool.role("teacher").chat([user("q")]))
    assert out.ok and out.text == "ok" and out.attempts == 2


@requires_embedded
def test_an_hf_backend_serves_the_tiny_model_with_its_adapters_merged(repo_root, tmp_path):
    """`embedded: tiny-qwen2` on an hf backend is the code-built model (the same weights in every copy), and its
    `lora` adapters are merged into them in process; the response cache tells the two apart."""
    import torch

    from components.embedded.models import load_hf_policy
    from components.training.model import LoRASettings, build_policy

    params = load_params(repo_root / "params.yaml", "paper", overlays=["smoke"], overrides=[
        f"run.out_dir={tmp_path}", f"run.cache_dir={repo_root / '.cache'}"])  # the exported tokenizer is reused
    model, _ = load_hf_policy("tiny-qwen2", params.run.cache_dir)
    policy = build_policy(model, lora=LoRASettings(r=1, alpha=1))
    with torch.no_grad():
        for name, weight in policy.model.named_parameters():
            if "lora_B" in name:
                weight.fill_(0.5)
    policy.model.save_pretrained(str(tmp_path / "sft" / "adapter"))
    expected = policy.model.merge_and_unload().state_dict()
    with LLMPool(params, cache_path=tmp_path / "responses.sqlite") as pool:
        plain, served = pool.backend("qwen3-14b"), pool.backend("embedded-0_5b-sft")
        key = "model.layers.0.self_attn.q_proj.weight"
        assert torch.equal(served.model.state_dict()[key], expected[key])
        assert not torch.equal(plain.model.state_dict()[key], expected[key])
        assert plain.cache_identity() != served.cache_identity()
        reply = asyncio.run(pool.role("policy").chat([user("Q?")]))
        assert reply.texts and reply.model == "tiny-qwen2"
    params.llm.backends["embedded-0_5b-sft"].lora = str(tmp_path / "missing")
    with LLMPool(params, cache_path=tmp_path / "responses.sqlite") as pool, \
            pytest.raises(PermanentLLMError, match="missing does not exist"):
        pool.backend("embedded-0_5b-sft")


@requires_embedded
def test_a_whole_model_retrained_at_the_same_path_is_a_new_cache_identity(repo_root, tmp_path):
    """A policy trained by full fine-tuning is served from its folder (the lab's nano and each lab cell); the
    response cache must tell its weights apart, not its path, or a retrained model's evaluation reads the old one's
    replies (it did: a lab cell rerun at lr 3e-4 scored the lr 1e-4 cell's test answers in 0.5 s)."""
    import torch

    from components.embedded.models import load_hf_policy

    folder = tmp_path / "policy"
    model, tok = load_hf_policy("tiny-qwen2", repo_root / ".cache")
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    params = load_params(repo_root / "params.yaml", "paper", overlays=["smoke"], overrides=[
        f"run.out_dir={tmp_path}", f"llm.backends.embedded-0_5b-hf.model={folder}",
        "llm.backends.embedded-0_5b-hf.embedded=null"])

    def identity() -> str:
        with LLMPool(params, cache_path=tmp_path / "responses.sqlite") as pool:
            return pool.backend("embedded-0_5b-hf").cache_identity()

    first = identity()
    assert identity() == first
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    model.save_pretrained(str(folder))
    assert identity() != first


@requires_embedded
def test_the_hf_backend_stops_where_transformers_stop_strings_stop(repo_root):
    """The hf backend keeps each stop-string criterion it built (building one scans the whole vocabulary) and
    stops exactly where ``generate(stop_strings=...)`` does."""
    import torch

    from components.embedded.models import load_hf_policy
    from components.llm.backends.hf import HFChatModel
    from components.llm.base import Sampling

    model, tok = load_hf_policy("tiny-qwen2", repo_root / ".cache")
    hf = HFChatModel(model, tok, name="tiny")
    ask = [user("Who directed the film?")]
    free = asyncio.run(hf.chat(ask, Sampling(temperature=0.0, max_tokens=24))).texts[0]
    stop = free[len(free) // 2:len(free) // 2 + 3]  # a piece of what it writes, so the stop is hit
    stopped = asyncio.run(hf.chat(ask, Sampling(temperature=0.0, max_tokens=24, stop=(stop,))))
    ids = tok.apply_chat_template([{"role": "user", "content": ask[0].content}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        raw = model.generate(**ids, max_new_tokens=24, do_sample=False, stop_strings=[stop], tokenizer=tok,
                             pad_token_id=tok.pad_token_id)
    reference = tok.decode(raw[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert stopped.finish_reasons == ["stop"] and stopped.texts[0] == reference[:reference.index(stop)]
    assert free.startswith(stopped.texts[0]) and hf._stop_criteria((stop,)) is hf._stop_criteria((stop,))
