"""Fold LoRA adapters into a GGUF model, for serving a fixed adapter without llama.cpp's runtime LoRA.

llama.cpp applies a ``--lora`` adapter at run time: every adapted matrix costs two extra small matmuls
and graph nodes per decoded batch, which on a 2-core CPU is a large share of a 0.5B model's step
(``perf/bench_lora_serving.py`` measures it). An evaluation serves one adapter for its whole run, so the
adapter can be merged once instead: each adapted weight is dequantized, ``W + (alpha / r) * B @ A`` is
added in float32 (exactly what the trained weights compute), and the sum is written as Q8_0, whose
rounding error is far below that of the base's Q4_K_M blocks. Every other tensor and all metadata are
copied byte for byte. RL keeps the runtime adapter, which it swaps after every update.

    python -m components.embedded.lora_merge BASE.gguf ADAPTER.gguf [ADAPTER2.gguf ...] -o MERGED.gguf
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from components.adapters import adapter_digest
from components.embedded.lora_gguf import read_lora_gguf
from components.io import atomic_target, build_once

__all__ = ["LoraMergeError", "ensure_merged_gguf", "merge_lora_into_gguf"]

MERGED_TYPE = "Q8_0"


class LoraMergeError(ValueError):
    """An adapter does not fit the base model; the message names the adapter file and tensor."""


def _deltas(adapters: Sequence[Path]) -> dict[str, list[tuple[Path, float, np.ndarray, np.ndarray]]]:
    """base tensor name -> [(adapter, scale, A [r, in], B [out, r]), ...] over all adapters (deltas add)."""
    deltas: dict[str, list[tuple[Path, float, np.ndarray, np.ndarray]]] = {}
    for path in adapters:
        meta, tensors = read_lora_gguf(path)
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            raise LoraMergeError(f"{path}: not a LoRA adapter GGUF (general.type={meta.get('general.type')!r})")
        alpha = float(meta["adapter.lora.alpha"])
        for name, a in tensors.items():
            if not name.endswith(".lora_a"):
                continue
            base = name.removesuffix(".lora_a")
            b = tensors.get(f"{base}.lora_b")
            if b is None:
                raise LoraMergeError(f"{path}: tensor {name} has no matching {base}.lora_b")
            deltas.setdefault(base, []).append((path, alpha / a.shape[0], a.astype(np.float32), b.astype(np.float32)))
    return deltas


def _copy_metadata(reader, writer) -> None:
    import gguf

    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def merge_lora_into_gguf(base: str | Path, adapters: Sequence[str | Path], out: str | Path) -> Path:
    """Write ``out``: ``base`` with every adapter in ``adapters`` (llama.cpp LoRA GGUFs) folded in.
    Written to a temporary name and renamed, so a crash never leaves a half-written model at ``out``."""
    import gguf

    from components.embedded.gguf_read import GGUFFile

    base, out = Path(base), Path(out)
    adapters = [Path(a) for a in adapters]
    deltas = _deltas(adapters)
    reader = GGUFFile(base)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    by_name = {t.name: t for t in reader.tensors}
    for name, terms in deltas.items():
        if name not in by_name:
            raise LoraMergeError(f"{terms[0][0]}: adapts {name}, which {base} does not have")
        n_in, n_out = (int(n) for n in by_name[name].shape)  # ggml order
        for path, _, a, b in terms:
            if b.shape[0] != n_out or a.shape[1] != n_in:
                raise LoraMergeError(f"{path}: {name}: LoRA B {b.shape} @ A {a.shape} does not fit the weight "
                                     f"[{n_out}, {n_in}] of {base}")

    with atomic_target(out) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch=arch)
        _copy_metadata(reader, writer)
        q8 = gguf.GGMLQuantizationType[MERGED_TYPE]
        for tensor in reader.tensors:
            if tensor.name not in deltas:
                writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape,
                                  raw_dtype=tensor.tensor_type)
                continue
            weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)  # [out, in]
            for _, scale, a, b in deltas[tensor.name]:
                weight += scale * (b @ a)
            packed = gguf.quants.quantize(weight, q8)
            writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=q8)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out


def ensure_merged_gguf(base: str | Path, adapters: Sequence[str | Path], cache_dir: str | Path) -> Path:
    """The merged model for (``base``, ``adapters``), built once into ``<cache_dir>/merged/`` under a name
    derived from the base file's name and every adapter's content."""
    digest = hashlib.sha256(Path(base).name.encode())
    for adapter in adapters:
        digest.update(adapter_digest(adapter).encode())
    target = Path(cache_dir) / "merged" / f"{Path(base).stem}-{digest.hexdigest()[:20]}.gguf"
    return build_once(target, lambda out: merge_lora_into_gguf(base, adapters, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("adapters", type=Path, nargs="+")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    print(merge_lora_into_gguf(args.base, args.adapters, args.out))


if __name__ == "__main__":
    main()
