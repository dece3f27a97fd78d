"""llama.cpp's native server: a clear error when it is not built; it starts, serves several requests at once,
answers chat and JSON-mode calls through the ``openai`` backend, and stops."""

import asyncio
import json
import threading
import time

import httpx
import pytest

from components.embedded.models import ensure_gguf
from components.embedded.native_server import NativeLlamaServer, NativeServerMissing, llama_server_binary
from components.llm.base import Sampling, system, user
from components.llm.factory import LLMPool
from components.params_load import load_params
from components.params_section import ParamsError
from tests.embedded.native import requires_native_server

MODEL = "qwen2.5-coder-0.5b-instruct"


def test_missing_binary_names_the_path_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_LLAMA_SERVER", str(tmp_path / "llama-server"))
    with pytest.raises(NativeServerMissing, match=r"llama-server .*\$RUBRICFLOW_LLAMA_SERVER.*bash scripts/setup.sh"):
        llama_server_binary()


def test_lora_without_the_native_server_is_a_params_error(repo_root):
    with pytest.raises(ParamsError, match="llm.backends.embedded-1_5b.*set server: native"):
        load_params(repo_root / "params.yaml", overrides=["llm.backends.embedded-1_5b.lora=adapter.gguf"])


@pytest.fixture(scope="module")
def server(repo_root):
    with NativeLlamaServer(ensure_gguf(MODEL, repo_root / ".cache"), alias="policy", n_ctx=512, parallel=4) as s:
        yield s


@pytest.mark.embedded
@requires_native_server
def test_server_starts_and_stops(repo_root):
    s = NativeLlamaServer(ensure_gguf(MODEL, repo_root / ".cache"), alias="policy", n_ctx=256, parallel=2).start()
    try:
        assert s.base_url == f"http://127.0.0.1:{s.port}/v1"
        assert [m["id"] for m in httpx.get(f"{s.base_url}/models").json()["data"]] == ["policy"]
        slots = httpx.get(f"{s.root_url}/slots").json()
        assert len(slots) == 2 and all(slot["n_ctx"] == 256 for slot in slots)
        proc, port = s.proc, s.port
    finally:
        s.stop()
    assert proc.poll() is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.embedded
@requires_native_server
def test_concurrent_requests_are_decoded_together(server):
    busy: list[int] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            busy.append(sum(slot["is_processing"] for slot in httpx.get(f"{server.root_url}/slots").json()))
            time.sleep(0.05)

    def complete(i: int) -> dict:
        body = {"prompt": f"Count from {i} to 100:", "n_predict": 48, "temperature": 0.0, "ignore_eos": True}
        return httpx.post(f"{server.root_url}/completion", json=body, timeout=120).json()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = [None] * 4
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, complete(i))) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        done.set()
        watcher.join()
    assert all(r["tokens_predicted"] == 48 for r in results)
    assert len({r["id_slot"] for r in results}) == 4
    assert max(busy) == 4  # all four slots were decoding at the same moment


@pytest.mark.embedded
@requires_native_server
def test_chat_and_json_mode_through_the_openai_backend(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml", overrides=["llm.backends.embedded-0_5b.server=native"])
    params.run.cache_dir = str(repo_root / ".cache")
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
        assert isinstance(server, NativeLlamaServer)
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        structured = asyncio.run(policy.chat([user("Capital of Italy? Reply in JSON.")],
                                             Sampling(max_tokens=32, json_schema=schema)))
        assert structured.ok, structured
        assert isinstance(json.loads(structured.text)["answer"], str)
        proc = server.proc
    assert proc.poll() is not None


def test_several_adapters_are_passed_together_and_swapped_over_the_base_ones(tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("RUBRICFLOW_LLAMA_SERVER", str(binary))
    warm, rl = tmp_path / "warm.gguf", tmp_path / "rl.gguf"
    warm.write_bytes(b"")
    rl.write_bytes(b"")
    server = NativeLlamaServer(tmp_path / "m.gguf", lora=[warm, rl])
    server.port = 1
    cmd = server.command()
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--lora"] == [str(warm), str(rl)]
    assert server.lora == rl
    assert NativeLlamaServer(tmp_path / "m.gguf", lora=warm).loras == (warm,)
    missing = NativeLlamaServer(tmp_path / "m.gguf", lora=[warm, tmp_path / "gone.gguf"])
    missing.port = 1
    with pytest.raises(FileNotFoundError, match="gone.gguf"):
        missing.command()
