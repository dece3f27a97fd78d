"""Where the trainable models live and in which precision: ``train_policy.device`` and ``train_policy.dtype``
turned into a torch device and dtype, once, for every loader of weights that training updates (the policy of
train_policy and sft, Co-ReAct's rubric generator, ARCO's rubric model).

``auto`` follows the machine: the first CUDA device in bfloat16 when torch sees one, else the CPU in float32
(so a CPU run loads exactly what it always loaded). A named device the machine does not have is refused with
the key in the message, rather than silently training on the CPU.

    where = placement(params.train_policy)     # Placement(device=device('cpu'), dtype=torch.float32) here
    resolve_device("cuda:1", cuda_count=2)     # device('cuda:1')
    resolve_dtype("auto", torch.device("cuda"))  # torch.bfloat16
    where.keyed()                              # None for float32, else "bfloat16": the run key's entry
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from components.params_section import ParamsError

if TYPE_CHECKING:
    from components.training.params import TrainPolicyParams

__all__ = ["DTYPES", "Placement", "placement", "resolve_device", "resolve_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The names ``train_policy.dtype`` accepts besides ``auto``."""

_DEVICE = re.compile(r"^(auto|cpu|cuda(?::(\d+))?)$")


@dataclass(frozen=True)
class Placement:
    """A resolved (device, dtype) pair."""

    device: torch.device
    dtype: torch.dtype

    def keyed(self) -> str | None:
        """What the run key records: nothing for float32 (every run before these settings existed), else the
        dtype's name, so a bfloat16 run never resumes from a float32 one's checkpoints or the reverse."""
        if self.dtype == torch.float32:
            return None
        return next(name for name, dtype in DTYPES.items() if dtype == self.dtype)


def resolve_device(setting: str, *, cuda_count: int | None = None, key: str = "train_policy.device") -> torch.device:
    """The torch device ``setting`` names: ``auto`` is ``cuda`` when a CUDA device is visible, else ``cpu``.

    ``cuda_count`` stands for ``torch.cuda.device_count()`` (0 when CUDA is unavailable), so callers and tests
    can ask what a machine of another shape would get. ``cuda`` or ``cuda:N`` beyond what is visible raises
    :class:`ParamsError` naming ``key``."""
    match = _DEVICE.match(setting)
    if match is None:
        raise ParamsError(f"{key}={setting}: expected auto, cpu, cuda or cuda:N")
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if setting == "auto":
        return torch.device("cuda" if cuda_count > 0 else "cpu")
    if setting == "cpu":
        return torch.device("cpu")
    if cuda_count == 0:
        raise ParamsError(f"{key}={setting}: this machine has no CUDA device visible to torch "
                          "(torch.cuda.is_available() is False); set it to auto or cpu, or run on a GPU worker")
    index = int(match.group(2)) if match.group(2) is not None else None
    if index is not None and index >= cuda_count:
        raise ParamsError(f"{key}={setting}: only {cuda_count} CUDA device(s) visible (cuda:0..cuda:{cuda_count - 1}; "
                          "CUDA_VISIBLE_DEVICES renumbers them from 0)")
    return torch.device(setting)


def resolve_dtype(setting: str, device: torch.device, *, key: str = "train_policy.dtype") -> torch.dtype:
    """The torch dtype ``setting`` names: ``auto`` is bfloat16 on CUDA and float32 anywhere else."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if setting not in DTYPES:
        raise ParamsError(f"{key}={setting}: expected auto, {', '.join(DTYPES)}")
    return DTYPES[setting]


def placement(train_policy: TrainPolicyParams, *, cuda_count: int | None = None) -> Placement:
    """The device and dtype of this run's trainable models (``train_policy.device`` / ``.dtype``)."""
    device = resolve_device(train_policy.device, cuda_count=cuda_count)
    return Placement(device, resolve_dtype(train_policy.dtype, device))
