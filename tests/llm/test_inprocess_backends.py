"""The in-process backends on the real embedded 0.5B model: llama.cpp and transformers (dequantized)."""

import asyncio
import json

import pytest

from components.embedded.models import ensure_gguf
from components.llm.base import Sampling, system, user
from tests.conftest import requires_embedded

QUESTION = [system("Answer with one word."), user("What is the capital of France?")]


@requires_embedded
def test_llamacpp_in_process(repo_root):
    from components.llm.backends.llamacpp import LlamaCppChatModel

    model = LlamaCppChatModel(str(ensure_gguf("qwen2.5-coder-0.5b-instruct", repo_root / ".cache")), n_ctx=512)
    out = asyncio.run(model.chat(QUESTION, Sampling(max_tokens=8)))
    assert out.ok and "paris" in out.text.lower() and out.completion_tokens > 0
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    structured = asyncio.run(model.chat([user("Capital of Spain, as JSON.")], Sampling(max_tokens=24, json_schema=schema)))
    assert "city" in json.loads(structured.text)
    two = asyncio.run(model.chat(QUESTION, Sampling(temperature=1.0, seed=1, n=2, max_tokens=4)))
    assert len(two.texts) == 2


@requires_embedded
@pytest.mark.slow
def test_hf_backend_on_the_dequantized_policy(repo_root):
    from components.embedded.models import load_hf_policy
    from components.llm.backends.hf import HFChatModel

    model, tok = load_hf_policy(cache_dir=repo_root / ".cache")
    hf = HFChatModel(model, tok, name="policy")
    out = asyncio.run(hf.chat(QUESTION, Sampling(max_tokens=6)))
    assert out.ok and "paris" in out.text.lower()
    sampled = asyncio.run(hf.chat(QUESTION, Sampling(temperature=1.0, seed=3, n=2, max_tokens=6, stop=("\n",))))
    assert len(sampled.texts) == 2 and all("\n" not in t for t in sampled.texts)
