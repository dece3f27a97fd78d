"""Convert a peft LoRA adapter (safetensors) into llama.cpp's LoRA GGUF, so the native server can load it.

The layout follows llama.cpp's loader (``src/llama-adapter.cpp`` in the vendored source):
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha`` (llama.cpp scales by
alpha / rank, as peft does), and one pair ``blk.N.<tensor>.weight.lora_a`` / ``.lora_b`` per adapted
matrix. peft's ``lora_A.weight`` is ``[r, in]`` and ``lora_B.weight`` is ``[out, r]``; numpy's row-major
shapes are ggml's ``ne`` reversed, so they are written as they are (ggml sees ``a.ne = [in, r]``,
``b.ne = [r, out]``, which is what the loader checks against the base weight ``[in, out]``).
Qwen2 (and Llama-family) weights are not permuted between transformers and GGUF, so no reordering.
The output equals what llama.cpp's own ``convert_lora_to_gguf.py`` (vendored in the pinned sdist) writes
with ``--outtype f32`` (tests/embedded/test_lora_gguf.py checks it); this module is used instead because
it needs neither that source tree nor the base model's config, and converts in ~0.05 s, not ~5 s.

    python -m components.embedded.lora_gguf ADAPTER_DIR [OUT.gguf]
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from components.adapters import adapter_digest
from components.io import atomic_target, build_once

__all__ = ["LoraConversionError", "ensure_lora_gguf", "peft_to_gguf", "random_lora_gguf", "read_lora_gguf"]

# transformers module name -> llama.cpp tensor name (Qwen2 / Llama layout)
TENSOR_NAMES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


class LoraConversionError(ValueError):
    """The adapter uses something llama.cpp's LoRA GGUF cannot express; the message names file and key."""


def _read_config(adapter_dir: Path) -> dict:
    path = adapter_dir / "adapter_config.json"
    if not path.is_file():
        raise LoraConversionError(f"{path}: not found (expected a peft adapter folder)")
    config = json.loads(path.read_text())
    if config.get("bias", "none") != "none":
        raise LoraConversionError(f"{path}: field 'bias' is {config['bias']!r}; only 'none' converts")
    for key, why in (
        ("use_dora", "DoRA does not convert"),
        ("rank_pattern", "per-module ranks do not convert"),
        ("alpha_pattern", "per-module alphas do not convert"),
        ("modules_to_save", "only LoRA matrices convert"),
    ):
        if config.get(key):
            raise LoraConversionError(f"{path}: field {key!r} is set; {why}")
    return config


def _alpha(config: dict, path: Path) -> float:
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or r <= 0 or alpha is None:
        raise LoraConversionError(f"{path}: fields 'r' and 'lora_alpha' must be set (got {r!r}, {alpha!r})")
    # llama.cpp always scales by alpha / r; rsLoRA scales by alpha / sqrt(r)
    return float(alpha) * (math.sqrt(r) if config.get("use_rslora") else 1.0)


def peft_to_gguf(adapter_dir: str | Path, out_path: str | Path, *, arch: str = "qwen2") -> Path:
    """Write ``out_path`` (llama.cpp LoRA GGUF, f32 tensors) from the peft adapter in ``adapter_dir``."""
    import gguf
    from safetensors.numpy import load_file

    adapter_dir, out_path = Path(adapter_dir), Path(out_path)
    config_path = adapter_dir / "adapter_config.json"
    alpha = _alpha(_read_config(adapter_dir), config_path)
    weights_path = adapter_dir / "adapter_model.safetensors"
    if not weights_path.is_file():
        raise LoraConversionError(f"{weights_path}: not found (save the adapter with safe_serialization)")
    tensors = load_file(str(weights_path))
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in TENSOR_NAMES:
            raise LoraConversionError(
                f"{weights_path}: tensor {key!r} is not a LoRA matrix of {sorted(TENSOR_NAMES)}"
            )
        pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = value
    if not pairs:
        raise LoraConversionError(f"{weights_path}: no LoRA tensors")

    with atomic_target(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch=arch)
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)
        for (layer, module), ab in sorted(pairs.items()):
            where = f"{weights_path}: layer {layer} {module}"
            if set(ab) != {"A", "B"}:
                raise LoraConversionError(f"{where}: has lora_{''.join(sorted(ab))} only")
            a, b = ab["A"].astype(np.float32), ab["B"].astype(np.float32)
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
                raise LoraConversionError(f"{where}: shapes A {a.shape}, B {b.shape} are not [r, in], [out, r]")
            name = f"blk.{layer}.{TENSOR_NAMES[module]}.weight"
            writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a))
            writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out_path


def read_lora_gguf(path: str | Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """(metadata, tensors) of a LoRA GGUF, tensors in numpy's row-major shapes (for tests and checks)."""
    from components.embedded.gguf_read import GGUFFile

    reader = GGUFFile(path)
    meta: dict[str, object] = {}
    for name, field in reader.fields.items():
        if name.startswith(("general.", "adapter.")):
            meta[name] = field.contents()
    tensors = {t.name: np.array(t.data).reshape([int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    return meta, tensors


def ensure_lora_gguf(adapter: str | Path, cache_dir: str | Path, *, arch: str = "qwen2") -> Path:
    """A GGUF path for ``adapter``: a ``.gguf`` file is returned as is; a peft folder is converted once into
    ``<cache_dir>/lora/<sha256 of its files>.gguf``."""
    adapter = Path(adapter)
    if adapter.is_file() and adapter.suffix == ".gguf":
        return adapter
    if not adapter.is_dir():
        raise LoraConversionError(f"{adapter}: neither a .gguf file nor a peft adapter folder")
    target = Path(cache_dir) / "lora" / f"{adapter_digest(adapter, arch=arch)[:24]}.gguf"
    return build_once(target, lambda out: peft_to_gguf(adapter, out, arch=arch))


_BLOCKS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def random_lora_gguf(base: str | Path, folder: str | Path, *, r: int = 8, alpha: int = 16, b_std: float = 0.02,
                     seed: int = 0, arch: str = "qwen2") -> Path:
    """A peft adapter folder with random A (std 1/sqrt(in)) and B (std ``b_std``) on every attention and MLP
    matrix of the GGUF model ``base``, converted to a LoRA GGUF (returned): an adapter of a trained one's size
    and effect, for benchmarks and tests of serving without training one."""
    from safetensors.numpy import save_file

    from components.embedded.gguf_read import GGUFFile

    shapes = {t.name: [int(n) for n in t.shape] for t in GGUFFile(base).tensors}  # [in, out]
    rng = np.random.default_rng(seed)
    tensors, layer = {}, 0
    while f"blk.{layer}.attn_q.weight" in shapes:
        for module, block in _BLOCKS.items():
            n_in, n_out = shapes[f"blk.{layer}.{TENSOR_NAMES[module]}.weight"]
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((r, n_in)) / np.sqrt(n_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((n_out, r)) * b_std).astype(np.float32)
        layer += 1
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha, "bias": "none",
                                                            "target_modules": list(_BLOCKS)}))
    return peft_to_gguf(folder, folder / "adapter.gguf", arch=arch)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    source = Path(sys.argv[1])
    print(peft_to_gguf(source, Path(sys.argv[2]) if len(sys.argv) == 3 else source / "adapter.gguf"))
