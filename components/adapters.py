"""An adapter folder's identity: :func:`save_adapter` writes a peft adapter so that the same weights give the same
bytes, and :func:`adapter_digest` hashes those bytes, or a whole model's (the lab's full fine-tuning), for run keys,
response caches and merged-model caches. A leaf that the trainers, the checkpoints, the serving backends and the
GGUF converter share (pyproject.toml's contract keeps it low).

    from components.adapters import adapter_digest, save_adapter
    save_adapter(policy.model, "outputs/sft/adapter"); adapter_digest("outputs/sft/adapter")
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["adapter_digest", "save_adapter"]


def save_adapter(model: Any, folder: str | Path, **kwargs: Any) -> Path:
    """A peft model's ``save_pretrained(folder)`` with every ``adapter_config.json`` it writes made canonical.

    peft holds ``target_modules`` as a set and writes it in the order of the process's string hashing, so two runs
    that trained the very same weights wrote different configs, hence different adapter digests (evaluation run
    keys, merged-model caches) and DVC hashes. The list is written sorted, the keys as peft sorts them. ``kwargs``
    go to ``save_pretrained`` (``selected_adapters=[...]``)."""
    folder = Path(folder)
    model.save_pretrained(str(folder), safe_serialization=True, **kwargs)
    for config in sorted(folder.rglob("adapter_config.json")):
        data = json.loads(config.read_text())
        if isinstance(data.get("target_modules"), list):
            data["target_modules"] = sorted(data["target_modules"])
        tmp = config.with_name(f".{config.name}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, config)
    return folder


def is_whole_model(folder: str | Path) -> bool:
    """Whether a folder holds a whole model (full fine-tuning: config, weights and tokenizer) rather than a LoRA
    adapter."""
    folder = Path(folder)
    return (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file()


def whole_model_digest(path: str | Path) -> str | None:
    """:func:`adapter_digest` of a whole model's folder; None when ``path`` is not one (a model's name, an adapter)."""
    return adapter_digest(path) if is_whole_model(path) else None


def adapter_digest(adapter: str | Path, *, arch: str = "qwen2") -> str | None:
    """sha256 of an adapter's content (a peft folder's config and weights, a whole model's, or a GGUF file); None
    if absent. What identifies the weights an adapter path serves, e.g. in an evaluation's resume key."""
    adapter = Path(adapter)
    digest = hashlib.sha256(arch.encode())
    if adapter.is_file():
        digest.update(adapter.read_bytes())
    elif adapter.is_dir():
        names = ("config.json", "model.safetensors") if is_whole_model(adapter) else (
            "adapter_config.json", "adapter_model.safetensors")
        for name in names:
            path = adapter / name
            if path.is_file():
                digest.update(path.read_bytes())
    else:
        return None
    return digest.hexdigest()
