"""The shared vLLM LoRA hot-swap path: every published adapter gets a fresh id and its own folder, and both
the chat backend and the rollout engine serve through it. vLLM itself is replaced by a stub module (no GPU
here); the slot only needs its LoRARequest record."""

import sys
import types
from dataclasses import dataclass

import pytest

from components.llm.backends.vllm_lora import AdapterSlot


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@pytest.fixture
def fake_vllm(monkeypatch):
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, module in {"vllm": types.ModuleType("vllm"), "vllm.lora": types.ModuleType("vllm.lora"),
                         "vllm.lora.request": request}.items():
        monkeypatch.setitem(sys.modules, name, module)


class Saver:
    def save_pretrained(self, path, **kwargs):  # as peft's: safe_serialization=..., selected_adapters=...
        from pathlib import Path

        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"w")


def test_each_publish_serves_a_new_id_and_folder(fake_vllm, tmp_path):
    slot = AdapterSlot("policy")
    assert slot.request is None
    first = slot.publish(Saver(), tmp_path, step=1)
    second = slot.publish(Saver(), tmp_path, step=2)
    assert first != second and (second / "adapter_model.safetensors").exists()
    assert slot.request == FakeLoRARequest("policy-2", 2, str(second))
    slot.set(None)
    assert slot.request is None and slot.version == 2


def test_chat_backend_and_rollout_engine_swap_through_the_slot(fake_vllm, tmp_path):
    from types import SimpleNamespace

    from components.llm.backends.vllm_engine import VLLMChatModel
    from components.training.engines.rollout import VLLMRolloutEngine

    chat = object.__new__(VLLMChatModel)  # no engine: only the adapter path is exercised
    chat.name, chat.adapter = "qwen", AdapterSlot("policy")
    chat.set_adapter(str(tmp_path / "a"))
    assert chat.adapter.request.lora_path == str(tmp_path / "a") and chat.cache_identity() == "qwen@lora1"

    engine = object.__new__(VLLMRolloutEngine)
    engine.adapter, engine.adapter_dir = AdapterSlot("policy"), tmp_path / "engine"
    engine.update_weights(SimpleNamespace(model=Saver()), step=3)
    assert engine.adapter.request == FakeLoRARequest("policy-1", 1, str(tmp_path / "engine" / "step_000003"))
