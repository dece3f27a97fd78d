"""DeepSpeed ZeRO configurations for policy training.

DeepSpeed lives in the optional ``[gpu]`` extra and is never imported here: this module only builds the
config dicts. :class:`components.training.stepper.DeepSpeedStepper` hands one to accelerate's ``DeepSpeedPlugin``
when ``train_policy.deepspeed.zero_stage`` is set. The JSON files in ``components/training/deepspeed/`` are the
same dicts with their default arguments (a test keeps them in sync) for tools that want a file, e.g.
``accelerate launch --deepspeed_config_file``.

Usage::

    cfg = deepspeed_config(2, micro_batch_size=4, grad_accum=8, grad_clip=1.0)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_DIR", "deepspeed_config"]

CONFIG_DIR = Path(__file__).with_name("deepspeed")


def deepspeed_config(
    stage: int,
    *,
    micro_batch_size: int = 1,
    grad_accum: int = 1,
    grad_clip: float = 1.0,
    bf16: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> dict[str, Any]:
    """ZeRO stage 2 (optimizer states and gradients sharded) or 3 (parameters sharded too).

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
                "stage3_param_persistence_threshold": 100_000,
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
