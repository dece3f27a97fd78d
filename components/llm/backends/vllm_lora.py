"""The one LoRA hot-swap path of vLLM, shared by the chat backend (``vllm``) and the GPU rollout engine.

vLLM caches adapters by integer id, so serving new weights means a new ``LoRARequest`` with a fresh id; the
adapter folder is what peft's ``save_pretrained`` writes. vLLM is imported only when an adapter is set.

    slot = AdapterSlot("policy")
    slot.publish(policy.model, "outputs/train/grpo/vllm", step=10)   # save, then serve it
    llm.generate(prompts, params, lora_request=slot.request)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.embedded.lora_gguf import save_adapter

__all__ = ["AdapterSlot"]


class AdapterSlot:
    def __init__(self, name: str = "policy"):
        self.name, self.version, self.request = name, 0, None

    def set(self, adapter_dir: str | Path | None) -> None:
        """Serve the adapter in ``adapter_dir`` from now on (None: the base model)."""
        if adapter_dir is None:
            self.request = None
            return
        from vllm.lora.request import LoRARequest

        self.version += 1
        self.request = LoRARequest(f"{self.name}-{self.version}", self.version, str(adapter_dir))

    def publish(self, model: Any, root: str | Path, step: int) -> Path:
        """Save a peft model's adapter under ``root/step_N`` and serve it."""
        path = Path(root) / f"step_{step:06d}"
        save_adapter(model, path)
        self.set(path)
        return path
