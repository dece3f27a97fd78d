"""Data-parallel ranks and DeepSpeed ZeRO configurations for policy training.

Under ``torchrun --nproc_per_node N`` or ``accelerate launch --num_processes N`` every process is one rank of a
data-parallel group: :func:`current_ranks` reads the launcher's ``RANK``/``WORLD_SIZE`` and opens the default
process group (gloo on the CPU, NCCL with CUDA; collectives that wait longer than ``RUBRICFLOW_RANK_TIMEOUT_S``,
600 s by default, raise instead of hanging: a rank that died stops the others). :class:`Ranks` holds the few
collectives the trainers need: a rank's contiguous share of a list (whole GRPO groups), sums and maxima of a
few numbers, gathering picklable objects, and summing gradients (DDP's all-reduce, done once per optimizer step
on the accumulated gradients, as DDP does under ``no_sync``). A single process is rank 0 of 1 and runs none of
them. DeepSpeed lives in the optional ``[gpu]`` extra and is never imported here: :func:`deepspeed_config` only
builds the config dicts :class:`components.training.stepper.DeepSpeedStepper` hands to accelerate's
``DeepSpeedPlugin`` when ``train_policy.deepspeed.zero_stage`` is set. The JSON files in
``components/training/deepspeed/`` are the same dicts with their default arguments (a test keeps them in sync)
for tools that want a file, e.g. ``accelerate launch --deepspeed_config_file``.

Usage::

    ranks = current_ranks()                       # Ranks(rank=0, world_size=1) without a launcher
    mine = ranks.share(prompts)                   # this rank's contiguous slice
    cfg = deepspeed_config(2, micro_batch_size=4, grad_accum=8, grad_clip=1.0)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch

__all__ = ["CONFIG_DIR", "RANK_TIMEOUT_ENV", "Ranks", "current_ranks", "deepspeed_config"]

CONFIG_DIR = Path(__file__).with_name("deepspeed")
RANK_TIMEOUT_ENV = "RUBRICFLOW_RANK_TIMEOUT_S"
T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the data-parallel group and the collectives the trainers run over it."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"  # where the small collectives' tensors live: "cuda" under NCCL

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes outputs, checkpoints' shared files and logs."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world_size > 1

    def bounds(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of ``n`` items: the first ``n % world_size`` ranks take one
        more (numpy's ``array_split``), so the ranks' shares in rank order are the items in order."""
        size, extra = divmod(n, self.world_size)
        lo = self.rank * size + min(self.rank, extra)
        return lo, lo + size + (self.rank < extra)

    def share(self, items: Sequence[T]) -> list[T]:
        lo, hi = self.bounds(len(items))
        return list(items[lo:hi])

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the ranks (float64)."""
        if not self.parallel:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def max(self, value: int) -> int:
        if not self.parallel:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.parallel:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.parallel:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def sum_fields(self, stats: dict[str, T]) -> dict[str, T]:
        """Dataclasses of counts by name (a pool's per-role call statistics), each field summed over the ranks; a
        name some rank lacks counts as zeros there."""
        if not self.parallel:
            return stats
        out: dict[str, Any] = {}
        for part in self.gather(stats):
            for name, value in part.items():
                if name not in out:
                    out[name] = copy.deepcopy(value)
                else:
                    for f in dataclasses.fields(value):
                        setattr(out[name], f.name, getattr(out[name], f.name) + getattr(value, f.name))
        return out

    def barrier(self) -> None:
        if self.parallel:
            torch.distributed.barrier()

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the ranks, in one flat all-reduce (a rank whose share
        gave no gradient adds zeros). A parameter that got no gradient on any rank keeps ``grad=None``, so the
        optimizer skips it there as a single process does."""
        if not self.parallel or not params:
            return
        device = params[0].device
        flat = torch.cat([torch.ones(len(params), device=device, dtype=torch.float32),
                          *[(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                            for p in params]])
        flat[: len(params)] = torch.tensor([float(p.grad is not None) for p in params], device=device)
        torch.distributed.all_reduce(flat)
        offset = len(params)
        for i, p in enumerate(params):
            n = p.numel()
            if float(flat[i]) == 0:
                p.grad = None
            else:
                p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone()
            offset += n


def current_ranks() -> Ranks:
    """This process's ranks: those of the open default process group; else, when a launcher set ``WORLD_SIZE``
    above 1, the group it describes, opened now (gloo on the CPU, NCCL when CUDA is there, with
    ``RUBRICFLOW_RANK_TIMEOUT_S`` as the collectives' timeout); else rank 0 of 1."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return Ranks()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=float(os.environ.get(RANK_TIMEOUT_ENV, "600"))))
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    return Ranks(dist.get_rank(), dist.get_world_size(), device)


def deepspeed_config(
    stage: int,
    *,
    micro_batch_size: int = 1,
    grad_accum: int = 1,
    grad_clip: float = 1.0,
    bf16: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_persistence_threshold: int = 100_000,
) -> dict[str, Any]:
    """ZeRO stage 2 (optimizer states and gradients sharded) or 3 (parameters sharded too; those of at most
    ``param_persistence_threshold`` elements stay whole after their first use).

    The optimizer and scheduler are created by the trainer, so the config names none. ``grad_clip`` is the
    Co-ReAct value (1.0) by default.
    """
    if stage not in (2, 3):
        raise ValueError(f"stage must be 2 or 3, got {stage}")
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 500_000_000,
    }
    if stage == 2:
        zero.update(
            {"allgather_partitions": True, "allgather_bucket_size": 500_000_000, "reduce_scatter": True}
        )
    else:
        zero.update(
            {
                "stage3_prefetch_bucket_size": 50_000_000,
                "stage3_param_persistence_threshold": param_persistence_threshold,
                "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 1_000_000_000,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        if offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": grad_clip,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def load_config_file(stage: int) -> dict[str, Any]:
    """Read ``deepspeed/zero{stage}.json``."""
    return json.loads((CONFIG_DIR / f"zero{stage}.json").read_text())
