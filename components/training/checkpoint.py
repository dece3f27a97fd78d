"""Atomic, complete training checkpoints: weights, optimizer, scheduler, RNG, data position, metrics and method state
(rubric memories, banks), so a resumed run continues exactly. Everything is written into a ``.tmp-*`` folder in the
same root and renamed into place in one ``os.replace``, with ``manifest.json`` (every file's size and sha256)
written last and ``latest`` replaced atomically: a crash mid-save leaves the previous checkpoint current, and a
folder without a manifest is never loaded. The layout: :func:`save_checkpoint`.

    path = save_checkpoint(root, step, model=policy.model, optimizer=opt, scheduler=sched,
                           trainer_state={"step": step, "data": sampler.state_dict(), "history": history})
    ckpt = load_checkpoint(root, model=policy.model, optimizer=opt, scheduler=sched)  # root or a step dir
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from components.adapters import save_adapter
from components.training.distributed import Ranks

__all__ = [
    "LoadedCheckpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "rng_state",
    "save_checkpoint",
    "seed_rngs",
    "set_rng_state",
]

FORMAT_VERSION = 1
LATEST = "latest"
MANIFEST = "manifest.json"


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` restored besides the objects it was handed."""

    path: Path
    step: int
    trainer_state: dict[str, Any]
    method_state: dict[str, Any] | None
    method_dir: Path | None


def _is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, allow_nan=True))


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Python and numpy generator states (JSON) and torch CPU/CUDA states (tensors)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return py, tensors


def seed_rngs(seed: int) -> None:
    """Seed every generator a checkpoint saves (python, numpy, torch CPU and CUDA): two runs with one seed then
    hold the same states, and a run resumed from a checkpoint continues with the state an uninterrupted run has
    (unseeded, python's generator starts from the OS's entropy and differs between processes)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_rng_state(py: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
    version, internal, gauss = py["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = py["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _save_weights(model: nn.Module, folder: Path) -> None:
    folder.mkdir()
    if _is_peft(model):
        save_adapter(model, folder)
    else:
        save_file(_full_weights(model), str(folder / "model.safetensors"))


def _load_weights(model: nn.Module, folder: Path) -> None:
    if _is_peft(model):
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        file = folder / "adapter_model.safetensors"
        if not file.exists():
            raise FileNotFoundError(
                f"{folder} holds no adapter_model.safetensors but the model is a peft model"
            )
        weights = load_file(str(file))
        expected = set(get_peft_model_state_dict(model))
        if set(weights) != expected:
            raise ValueError(
                f"adapter in {folder} does not fit the model: missing {sorted(expected - set(weights))[:3]}, "
                f"unexpected {sorted(set(weights) - expected)[:3]}"
            )
        set_peft_model_state_dict(model, weights)
    else:
        _load_full_weights(model, folder / "model.safetensors")


def _tied_groups(model: nn.Module) -> list[list[str]]:
    """The model's tensors by identity: a tied weight (the input embedding and the LM head) is one group of
    several names."""
    groups: dict[int, list[str]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False),
                         *model.named_buffers(remove_duplicate=False)]:
        groups.setdefault(id(tensor), []).append(name)
    return list(groups.values())


def _gathered(model: nn.Module, modifier_rank: int | None):
    """ZeRO-3 holds each parameter in shards (DeepSpeed marks them with ``ds_id``): gather them for the span
    (and, with ``modifier_rank``, re-shard what that rank wrote). Nothing to do for any other model."""
    sharded = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not sharded:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(sharded, modifier_rank=modifier_rank)


def _full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every persistent tensor of a fully trained model once, under its first name, each in storage of its own
    (DeepSpeed ZeRO keeps parameters as views of one flat buffer, which safetensors will not write)."""
    with _gathered(model, None):
        state = model.state_dict()
        return {names[0]: state[names[0]].detach().clone().contiguous()
                for names in _tied_groups(model) if names[0] in state}


def _load_full_weights(model: nn.Module, file: Path) -> None:
    """Copy ``file``'s tensors into the model in place (so DeepSpeed's views stay views); a tied group may be
    stored under any of its names. A missing or unexpected tensor is an error naming it."""
    weights = load_file(str(file))
    state = model.state_dict()
    params = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    used: set[str] = set()
    with _gathered(model, 0), torch.no_grad():
        for names in _tied_groups(model):
            if names[0] not in state:
                continue  # a non-persistent buffer
            found = [n for n in names if n in weights]
            if not found:
                raise ValueError(f"{file} holds no weights for {names[0]}: the checkpoint is of another model")
            params[names[0]].copy_(weights[found[0]])
            used.update(found)
    unexpected = sorted(set(weights) - used)
    if unexpected:
        raise ValueError(f"{file} holds tensors the model does not have: {unexpected[:3]}")


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    trainer_state: Mapping[str, Any] | None = None,
    method_state: Mapping[str, Any] | None = None,
    method_files: Callable[[Path], None] | None = None,
    extra_modules: Mapping[str, nn.Module] | None = None,
    keep_last: int | None = None,
    ranks: Ranks | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically and point ``latest`` at it.

    ``trainer_state`` and ``method_state`` must be JSON-serialisable. ``method_files`` is called with an
    empty folder to write any other method files into (rubric banks, memories). ``keep_last`` deletes
    older checkpoints beyond that many (the new one always stays). ``extra_modules`` (name -> module) are
    trainable modules beside the model, saved as ``extra/<name>.safetensors``. ``ranks``: every rank of a
    data-parallel group calls this; rank 0 writes everything but the other ranks' optimizer and RNG files, all
    into rank 0's temporary folder, and renames it once all have (two barriers); ``trainer_state.json`` then
    records ``world_size`` and a resume on another number of ranks is refused. The layout::

        latest                  text file naming the newest complete checkpoint (replaced atomically)
        step_000010/
          weights/              peft adapter (adapter_model.safetensors + adapter_config.json) or model.safetensors
          extra/<name>.safetensors  extra trainable modules of a method (e.g. ARCO's score head)
          optimizer.pt, scheduler.pt  (loaded with weights_only=True)
          rng.json, rng.safetensors   python / numpy / torch (CPU and CUDA) generator states
          trainer_state.json    step, data position, metrics history, config
          method/state.json     the method's JSON state;  method/files/  files its writer put there
          ranks/rank_00001/     on N ranks: rank r's optimizer.pt and rng.* (the files above are rank 0's)
          manifest.json         written last: file list with sizes and sha256
    """
    root = Path(root)
    ranks = ranks or Ranks()
    name = f"step_{step:06d}"
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    if ranks.main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    tmp = ranks.broadcast(tmp)
    try:
        if not ranks.main:
            with _gathered(model, None):
                pass  # ZeRO-3: rank 0 writes the weights, every rank takes part in gathering them
            own = tmp / "ranks" / f"rank_{ranks.rank:05d}"
            own.mkdir(parents=True)
            if optimizer is not None:
                torch.save(optimizer.state_dict(), own / "optimizer.pt")
            py_rng, torch_rng = rng_state()
            _write_json(own / "rng.json", py_rng)
            save_file(torch_rng, str(own / "rng.safetensors"))
            for p in own.iterdir():
                _fsync(p)
            ranks.barrier()  # this rank's files are written
            ranks.barrier()  # rank 0 has renamed the checkpoint into place
            return root / name
        _save_weights(model, tmp / "weights")
        if extra_modules:
            (tmp / "extra").mkdir()
            for extra_name, module in extra_modules.items():
                save_model(module, str(tmp / "extra" / f"{extra_name}.safetensors"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        py_rng, torch_rng = rng_state()
        _write_json(tmp / "rng.json", py_rng)
        save_file(torch_rng, str(tmp / "rng.safetensors"))
        world = {"world_size": ranks.world_size} if ranks.parallel else {}
        _write_json(
            tmp / "trainer_state.json", {"format": FORMAT_VERSION, "step": step, **world, **(trainer_state or {})}
        )
        if method_state is not None or method_files is not None:
            (tmp / "method").mkdir()
            if method_state is not None:
                _write_json(tmp / "method" / "state.json", dict(method_state))
            if method_files is not None:
                (tmp / "method" / "files").mkdir()
                method_files(tmp / "method" / "files")
        ranks.barrier()  # every other rank's files are in tmp/ranks/
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        for p in files:
            _fsync(p)
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "files": {
                str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files
            },
        }
        _write_json(tmp / MANIFEST, manifest)
        _fsync(tmp / MANIFEST)
        _fsync(tmp)

        final = root / name
        if final.exists():
            old = root / f".tmp-old-{name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _point_latest(root, name)
        ranks.barrier()
    except BaseException:
        if ranks.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last is not None:
        _prune(root, keep=max(keep_last, 1), current=name)
    return final


def _point_latest(root: Path, name: str) -> None:
    tmp = root / f".tmp-latest-{uuid.uuid4().hex[:8]}"
    tmp.write_text(name + "\n")
    _fsync(tmp)
    os.replace(tmp, root / LATEST)
    _fsync(root)


def _prune(root: Path, keep: int, current: str) -> None:
    complete = sorted(p for p in root.glob("step_*") if (p / MANIFEST).exists())
    for old in complete[:-keep]:
        if old.name == current:
            continue
        trash = root / f".tmp-trash-{old.name}-{uuid.uuid4().hex[:8]}"
        os.replace(old, trash)
        shutil.rmtree(trash, ignore_errors=True)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when the root holds no complete checkpoint yet."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    path = root / pointer.read_text().strip()
    if not (path / MANIFEST).exists():
        raise FileNotFoundError(f"{pointer} names {path}, which is not a complete checkpoint (no {MANIFEST})")
    return path


def _resolve(path: Path) -> Path:
    if (path / MANIFEST).exists():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(
            f"{path} is neither a complete checkpoint nor a root with a '{LATEST}' pointer"
        )
    return latest


def load_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
    verify: bool = True,
    extra_modules: Mapping[str, nn.Module] | None = None,
    optimizer_globals: Sequence[Any] = (),
    ranks: Ranks | None = None,
) -> LoadedCheckpoint:
    """Restore weights, optimizer, scheduler and RNG states in place from a checkpoint folder, or from
    the one ``latest`` names when ``path`` is a root. ``verify`` checks every file against the manifest.
    ``ranks``: this rank's optimizer and RNG files are read; a checkpoint of another number of ranks is refused."""
    ranks = ranks or Ranks()
    path = _resolve(Path(path))
    manifest = json.loads((path / MANIFEST).read_text())
    state = json.loads((path / "trainer_state.json").read_text())
    saved_world = int(state.get("world_size", 1))
    if saved_world != ranks.world_size:
        raise ValueError(
            f"checkpoint {path} was written by {saved_world} data-parallel rank(s) and this run has "
            f"{ranks.world_size}: each rank's optimizer and RNG state is its own, so resume it with "
            f"{saved_world} process(es) (or train in a fresh folder)")
    own = path if ranks.main else path / "ranks" / f"rank_{ranks.rank:05d}"
    if verify:
        for rel, meta in manifest["files"].items():
            f = path / rel
            if not f.exists() or f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
                raise ValueError(f"checkpoint file {f} is missing or differs from {path / MANIFEST}")
    _load_weights(model, path / "weights")
    for extra_name, module in (extra_modules or {}).items():
        file = path / "extra" / f"{extra_name}.safetensors"
        if not file.exists():
            raise FileNotFoundError(f"checkpoint {path} has no extra module {extra_name!r} ({file})")
        load_model(module, str(file))
    # Tensors are read onto the CPU: a checkpoint written on a GPU machine must resume on a CPU-only one, and
    # the optimizer's load_state_dict moves each state tensor to its parameter's device either way.
    if optimizer is not None:
        # optimizer_globals: the classes an optimizer's state may hold besides tensors (DeepSpeed's ZeRO state)
        with torch.serialization.safe_globals(list(optimizer_globals)):
            optimizer_state = torch.load(own / "optimizer.pt", map_location="cpu", weights_only=True)
        optimizer.load_state_dict(optimizer_state)
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    if restore_rng:
        set_rng_state(json.loads((own / "rng.json").read_text()), load_file(str(own / "rng.safetensors")))
    method_state_file = path / "method" / "state.json"
    method_dir = path / "method" / "files"
    return LoadedCheckpoint(
        path=path,
        step=int(state["step"]),
        trainer_state=state,
        method_state=json.loads(method_state_file.read_text()) if method_state_file.exists() else None,
        method_dir=method_dir if method_dir.exists() else None,
    )
