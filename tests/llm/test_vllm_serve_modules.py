"""How a managed ``vllm serve`` takes more backends' LoRA modules (components/llm/backends/vllm_serve.py), without vLLM:
the requests the running server gets (load, unload-then-load for a changed adapter, nothing for the same one), an
error answer named, and :func:`shared` handing a backend with another adapter over the same base the running server.
The real server: tests/llm/test_vllm_serve_lora_modules_cpu.py (``-m vllm``).

    .venv/bin/python -m pytest tests/llm/test_vllm_serve_modules.py
"""

from __future__ import annotations

import json

import httpx
import pytest

from components.llm.backends import vllm_serve
from components.llm.backends.vllm_serve import VLLMServer, shared


def adapter(folder, weights: bytes):
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


class Alive:
    pid = 1

    def poll(self):
        return None


@pytest.fixture
def posts(monkeypatch):
    sent = []

    def post(url, json, timeout):
        sent.append((url.rsplit("/", 1)[-1], json))
        return httpx.Response(200, text="Success")

    monkeypatch.setattr(httpx, "post", post)
    return sent


def running_server(tmp_path, **lora) -> VLLMServer:
    server = VLLMServer("base", alias="tiny-base", lora=lora, log_path=tmp_path / "vllm.log")
    server.port, server.proc = 8000, Alive()
    from components.adapters import adapter_digest

    server.loaded = {name: adapter_digest(path) for name, path in lora.items()}
    return server


def test_a_module_is_loaded_once_and_reloaded_when_its_content_changed(tmp_path, posts):
    a = adapter(tmp_path / "a", b"A")
    server = running_server(tmp_path, judge_a=a)
    server.add_lora("judge_a", a)
    assert posts == []  # the same content: nothing sent
    b = adapter(tmp_path / "b", b"B")
    server.add_lora("judge_b", b)
    assert posts == [("load_lora_adapter", {"lora_name": "judge_b", "lora_path": str(b)})]
    adapter(tmp_path / "b", b"B retrained")
    server.add_lora("judge_b", b)
    assert posts[1:] == [("unload_lora_adapter", {"lora_name": "judge_b"}),
                         ("load_lora_adapter", {"lora_name": "judge_b", "lora_path": str(b)})]
    assert server.lora == {"judge_a": str(a), "judge_b": str(b)} and len(set(server.loaded.values())) == 2


def test_an_error_answer_names_the_route_and_the_log(tmp_path, monkeypatch):
    server = running_server(tmp_path)
    monkeypatch.setattr(httpx, "post", lambda url, json, timeout: httpx.Response(400, text="conflicts with a base"))
    with pytest.raises(RuntimeError, match=r"/v1/load_lora_adapter .* answered 400: conflicts with a base \(log: .*"
                                           r"vllm.log\)"):
        server.add_lora("x", adapter(tmp_path / "x", b"X"))
    assert "x" not in server.loaded


def test_shared_gives_a_backend_over_the_same_base_the_running_server(tmp_path, posts, monkeypatch):
    monkeypatch.setattr(vllm_serve, "_RUNNING", {})
    first = running_server(tmp_path, judge_a=adapter(tmp_path / "a", b"A"))
    vllm_serve._RUNNING[first.key] = first
    b = adapter(tmp_path / "b", b"B")
    second = VLLMServer("base", alias="tiny-base", lora={"judge_b": b}, log_path=tmp_path / "other.log")
    assert second.key == first.key  # the log and the modules are not the server's identity
    assert shared(second) is first and set(first.loaded) == {"judge_a", "judge_b"}
    assert posts == [("load_lora_adapter", {"lora_name": "judge_b", "lora_path": str(b)})]
    other_base = VLLMServer("base", alias="tiny-base", lora={"judge_b": b}, args=("--dtype", "float32"))
    plain = VLLMServer("base", alias="tiny-base")
    assert other_base.key != first.key and plain.key != first.key  # other settings, or no LoRA: another server
