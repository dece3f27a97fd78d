"""How a trainer turns micro-batch losses into one optimizer step: plain torch (:class:`TorchStepper`, the embedded
CPU path, ``train_policy.deepspeed.zero_stage: null``) or DeepSpeed ZeRO by way of accelerate
(:class:`DeepSpeedStepper`), so full fine-tuning of a policy too large for one device's optimizer state changes a
setting, not the loop. Both trainers run every update through one; on N data-parallel ranks each makes the summed
gradient the single-process one. A multi-GPU run: ``accelerate launch --num_processes N -m tasks.train_policy ...``;
DeepSpeed is in the ``[gpu]`` extra, and on a CPU (tests) runs with ``DS_ACCELERATOR=cpu``, set here.

    stepper = make_stepper(model, optimizer, zero, max_grad_norm=1.0)   # zero: DeepSpeedParams or None
    stepper.zero_grad()
    for i, loss in enumerate(losses):
        stepper.backward(loss, boundary=i == len(losses) - 1)
    grad_norm = stepper.step(params)
    with stepper.full_weights():                # ZeRO-3: the whole weights on every rank, e.g. for a rollout
        engine.generate(prompts, sampling)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from components.training.distributed import Ranks, deepspeed_config

if TYPE_CHECKING:
    from components.training.params import DeepSpeedParams

__all__ = ["DeepSpeedStepper", "Stepper", "TorchStepper", "make_stepper"]


class Stepper(Protocol):
    """One optimizer step from micro-batch losses."""

    optimizer: torch.optim.Optimizer
    checkpoint_globals: tuple[type, ...]
    forward_in_lockstep: bool  # every forward pass is a collective (ZeRO-3): the ranks must run as many

    @property
    def checkpointable(self) -> Any:
        """What a checkpoint saves and restores as the optimizer (``state_dict`` / ``load_state_dict``)."""
        ...

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor, *, boundary: bool) -> None: ...

    def full_weights(self) -> Any:
        """A context in which the model holds its whole weights on this process and its forward passes are no
        collectives: every rank enters and leaves it together, and may run its own number of passes inside."""
        ...

    def step(self, params: Sequence[nn.Parameter], max_norm: float) -> float:
        """Clip, step, and return the gradient norm before clipping."""
        ...


class TorchStepper:
    """``loss.backward()`` per micro-batch, then ``clip_grad_norm_`` and ``optimizer.step()``. On N ranks
    (:class:`components.training.distributed.Ranks`) it sums the accumulated gradients over the ranks before
    clipping (DDP's all-reduce; the trainers divide each rank's loss by the whole step's token or sequence count,
    so the sum is the single-process gradient), and every rank steps alike."""

    checkpoint_globals: tuple[type, ...] = ()  # what a checkpoint of its optimizer holds besides tensors
    forward_in_lockstep = False

    def __init__(self, optimizer: torch.optim.Optimizer, ranks: Ranks | None = None):
        self.optimizer = optimizer
        self.ranks = ranks or Ranks()

    @property
    def checkpointable(self) -> torch.optim.Optimizer:
        return self.optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, boundary: bool) -> None:
        loss.backward()

    def full_weights(self) -> Any:
        return nullcontext()

    def step(self, params: Sequence[nn.Parameter], max_norm: float) -> float:
        self.ranks.sum_gradients(params)
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.optimizer.step()
        return norm


class DeepSpeedStepper:
    """A model and optimizer prepared by accelerate under a DeepSpeed ZeRO plugin
    (:func:`components.training.distributed.deepspeed_config`; ZeRO-2 shards optimizer state and gradients, ZeRO-3
    parameters too). Each micro-batch goes through accelerate's wrapper with the accumulation boundary on the last;
    DeepSpeed clips to ``max_grad_norm`` and steps. The trainers' loss is already divided by the mini-batch's
    token or sequence count, so DeepSpeed is told not to divide by its accumulation steps; ZeRO averages over its N
    ranks, so each loss is multiplied by N to make that the sum. The trainers' schedulers keep driving the
    learning rate (ZeRO's optimizer steps the parameter groups they hold).

    ``optimizer`` is DeepSpeed's ZeRO optimizer (its ``state_dict`` holds the fp32 master partitions, so a
    checkpoint of it resumes a bf16 run exactly); ``engine`` the DeepSpeed engine around the model, whose
    ``module`` is the model the trainer keeps calling."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, zero: DeepSpeedParams, *,
                 max_grad_norm: float, ranks: Ranks | None = None):
        self.ranks = ranks or Ranks()
        on_cpu = next(model.parameters()).device.type == "cpu"
        if on_cpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511"), ("RANK", "0"),
                           ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)  # a single process without a launcher is rank 0 of 1
        try:
            import deepspeed  # noqa: F401  (accelerate imports it lazily; fail here with the extra's name)
            from accelerate import Accelerator, DeepSpeedPlugin
        except ImportError as exc:
            raise RuntimeError("train_policy.deepspeed.zero_stage is set but DeepSpeed is not installed: "
                               "pip install -e '.[gpu]' (or pip install deepspeed)") from exc
        dtype = next(model.parameters()).dtype
        config = deepspeed_config(zero.zero_stage, micro_batch_size=1, grad_accum=1, grad_clip=max_grad_norm,
                                  bf16=dtype == torch.bfloat16, offload_optimizer=zero.offload_optimizer,
                                  offload_params=zero.offload_params,
                                  param_persistence_threshold=zero.param_persistence_threshold)
        if on_cpu:  # communication overlap needs a device stream
            config["zero_optimization"]["overlap_comm"] = False
        self.accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
        self.engine, _ = self.accelerator.prepare(model, optimizer)
        self.optimizer = self.engine.optimizer
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        # the non-tensor objects ZeRO's optimizer state holds, allowed when a checkpoint of it is read back
        self.checkpoint_globals = (LossScaler, ZeroStageEnum, fragment_address)
        self.max_grad_norm = max_grad_norm
        self.forward_in_lockstep = self.ranks.parallel and zero.zero_stage == 3
        self._sharded = zero.zero_stage == 3

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor, *, boundary: bool) -> None:
        if self.ranks.parallel:  # ZeRO averages over the ranks what the trainers' losses make a sum
            loss = loss * self.ranks.world_size
        # accelerate's wrapper sets DeepSpeed's accumulation boundary and, on it, lets the engine clip and step
        self.accelerator.deepspeed_engine_wrapped.backward(loss, sync_gradients=boundary, scale_wrt_gas=False)
        # The trainers call the model itself, not the engine, whose forward would first tell ZeRO that the
        # previous backward ended; without it ZeRO-3 overwrites the accumulated gradient with the next one's
        clear = getattr(self.optimizer, "clear_backward_seen_flag", None)
        if clear is not None and not boundary:
            clear()

    @contextmanager
    def full_weights(self) -> Iterator[None]:
        """ZeRO-3: every parameter gathered once for the span and ZeRO's module hooks taken off, so each rank's
        rollouts run their own number of forward passes on the whole weights, none of them a collective; on
        leaving the hooks are put back and the weights re-sharded. TRL's ``unwrap_model_for_generation`` (and
        DeepSpeed's copy of it) leaves on the hook that starts each forward pass, which, until ZeRO's trace of the
        modules is complete, checks that trace against the other ranks' (a collective): a rank with no rollout of
        its own in the span (a dev evaluation's last questions) then leaves the others waiting. It is taken off
        too. ZeRO-2 holds whole weights: nothing to do."""
        if not self._sharded:
            yield
            return
        import deepspeed

        offload = getattr(self.optimizer, "parameter_offload", self.optimizer)
        with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters())):
            start = offload.fwd_pre_hook
            start_of_forward = start.hooks_dict_ref()[start.id]
            for p in self.engine.module.parameters():
                p.ds_active_sub_modules.clear()  # as TRL's remove_hooks: none is left in use by a module
            for hook in (*offload.forward_hooks, *offload.backward_hooks, start):
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                offload._register_deepspeed_module(offload.module)  # invalidates the trace: re-recorded next pass
                offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start_of_forward, prepend=True)

    @property
    def checkpointable(self) -> _ZeroState:
        return _ZeroState(self.optimizer, self.ranks.world_size)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on this process (ZeRO-3 gathers its shards; DeepSpeed's 16-bit copies when
        the model trains in bf16)."""
        return self.accelerator.get_state_dict(self.engine)

    def step(self, params: Sequence[nn.Parameter], max_norm: float) -> float:
        if max_norm != self.max_grad_norm:
            raise ValueError(f"DeepSpeed clips to the max_grad_norm it was built with ({self.max_grad_norm}), "
                             f"not {max_norm}")
        norm = self.engine.get_global_grad_norm()
        return float("nan") if norm is None else float(norm)


class _ZeroState:
    """ZeRO's optimizer state as a checkpoint reads and writes an optimizer's: one process's partition (with its
    fp32 master weights). DeepSpeed restores a list of partitions, one per data-parallel rank."""

    def __init__(self, optimizer: Any, world_size: int):
        self.optimizer, self.world_size = optimizer, world_size

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()  # this rank's partition: a checkpoint keeps one file per rank

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # ZeRO (not elastic) reads the entry of its own data-parallel rank only: this rank's file, at every index
        self.optimizer.load_state_dict([state] * self.world_size, load_from_fp32_weights=True)


def make_stepper(model: nn.Module, optimizer: torch.optim.Optimizer, zero: DeepSpeedParams | None, *,
                 max_grad_norm: float, ranks: Ranks | None = None) -> Stepper:
    """The plain stepper, or DeepSpeed's when ``zero`` names a ZeRO stage; ``ranks``: the data-parallel group
    (default: a single process)."""
    if zero is None or zero.zero_stage is None:
        return TorchStepper(optimizer, ranks)
    return DeepSpeedStepper(model, optimizer, zero, max_grad_norm=max_grad_norm, ranks=ranks)
