"""The base weights of a LoRA policy as a transformers folder vLLM can load.

A policy trained from a warm start has the warm-start adapter merged into its base and a fresh RL LoRA over
it. vLLM applies one LoRA per request on top of the weights it loaded, so the rollout engine loads the
merged base from a folder and takes the RL LoRA after each update. The folder is written once per
``identity`` (the base model and the adapters merged into it) and reused by later runs.

    folder = export_base(policy.model, tokenizer, Path(".cache/vllm_base"), identity="Qwen/Qwen3-14B|<digest>")
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from components.run_spec import RunSpec

__all__ = ["base_folder", "base_state_dict", "export_base", "warm_started_base"]


def base_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    """The base model's weights under its own parameter names: LoRA matrices left out, peft's
    ``base_layer`` wrapper names unwrapped."""
    out = {}
    for name, tensor in peft_model.get_base_model().state_dict().items():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def warm_started_base(spec: RunSpec, base_adapters: Sequence[str | Path]) -> tuple[Path, str]:
    """(root, identity) of the exported base of the trainable policy with ``base_adapters`` merged into it: the
    cache folder that holds exported bases, and what names this one (the ``trainable_policy`` backend's model and
    the digests of the adapters, in order). :func:`export_base` writes it; :func:`base_folder` finds it."""
    from components.adapters import adapter_digest

    backend = spec.backend("trainable_policy")
    identity = "|".join([backend.embedded or backend.model, *(str(adapter_digest(a)) for a in base_adapters)])
    return Path(spec.run.cache_dir) / "vllm_base", identity


def base_folder(root: Path, identity: str) -> Path:
    """Where :func:`export_base` writes (or has written) the base named by ``identity``."""
    return Path(root) / hashlib.sha256(identity.encode()).hexdigest()[:16]


def export_base(peft_model: Any, tokenizer: Any, root: Path, identity: str) -> Path:
    """``root/<digest of identity>``, holding the base weights, config and tokenizer (written on first use,
    atomically, so a crash never leaves a half-written folder that a later run would load)."""
    folder = base_folder(root, identity)
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        peft_model.get_base_model().save_pretrained(str(staging), state_dict=base_state_dict(peft_model))
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(str(staging))
        os.replace(staging, folder)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "config.json").exists():  # not another writer's finished copy: a real failure
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder
