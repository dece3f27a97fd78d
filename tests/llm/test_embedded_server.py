"""The embedded llama.cpp server answers a real chat call through the ``openai`` backend."""

import asyncio
import json

from components.llm.base import Sampling, system, user
from components.llm.factory import LLMPool
from components.params_load import load_params
from tests.conftest import requires_embedded


@requires_embedded
def test_real_chat_call_through_the_openai_backend(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(repo_root / ".cache")  # the assembled models live here after setup
    with LLMPool(params, cache_path=tmp_path / "responses.sqlite") as pool:
        policy = pool.role("policy")
        out = asyncio.run(policy.chat(
            [system("Answer with one word."), user("What is the capital of France?")],
            Sampling(temperature=0.0, max_tokens=8),
        ))
        assert out.ok, out
        assert "paris" in out.text.lower()
        assert out.prompt_tokens > 0 and out.completion_tokens > 0
        server = pool._servers[0]
        assert server.base_url.startswith("http://127.0.0.1:")
        # structured output: llama.cpp constrains the reply to the schema
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        structured = asyncio.run(policy.chat([user("Capital of Italy? Reply in JSON.")],
                                             Sampling(max_tokens=32, json_schema=schema)))
        assert structured.ok and isinstance(json.loads(structured.text)["answer"], str)
        proc = server.proc
    assert proc.poll() is not None  # the server was stopped on close
