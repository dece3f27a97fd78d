"""The one LoRA hot-swap path of vLLM, shared by the chat backend (``vllm``) and the rollout engine, and the one way
both release an engine (:func:`shutdown_llm`) and set vLLM up on a CPU (:func:`cpu_defaults`).

vLLM caches adapters by integer id, so serving new weights means a new ``LoRARequest`` with a fresh id; the
adapter folder is what peft's ``save_pretrained`` writes. vLLM is imported only when an adapter is set.

    slot = AdapterSlot("policy")
    slot.publish(policy.model, "outputs/train/grpo/vllm", step=10)   # save, then serve it
    llm.generate(prompts, params, lora_request=slot.request)
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

from components.adapters import save_adapter

__all__ = ["CPU_ENV", "LORA_RANKS", "AdapterSlot", "cpu_defaults", "shutdown_llm", "vllm_lora_rank"]

CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
"""vLLM's settings on a machine without CUDA, unless the environment sets them: the engine core in this process (no
second process to start and feed over sockets) and 1 GiB of KV cache (its default takes a share of the machine's
memory)."""


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (vllm/config/lora.py)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of rank ``rank`` (lora.r 4 -> 8)."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"lora.r={rank}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}")


def cpu_defaults() -> None:
    """Apply :data:`CPU_ENV` where the environment leaves them unset, on a machine without CUDA (before vLLM starts)."""
    import torch

    if not torch.cuda.is_available():
        for key, value in CPU_ENV.items():
            os.environ.setdefault(key, value)


def shutdown_llm(owner: Any, attr: str = "llm") -> None:
    """Stop the in-process ``vllm.LLM`` at ``owner.<attr>`` and free what it held (weights, KV cache, the
    accelerator's share): the attribute becomes None, so the last reference goes before the collection. Again: no-op."""
    llm = getattr(owner, attr, None)
    if llm is None:
        return
    setattr(owner, attr, None)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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
        self.request = LoRARequest(lora_name=f"{self.name}-{self.version}", lora_int_id=self.version,
                                   lora_path=str(adapter_dir))

    def publish(self, model: Any, root: str | Path, step: int) -> Path:
        """Save a peft model's adapter under ``root/step_N`` and serve it."""
        path = Path(root) / f"step_{step:06d}"
        save_adapter(model, path)
        self.set(path)
        return path
