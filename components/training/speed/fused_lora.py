"""A leaner forward for peft's LoRA linears: the scaling on the rank side, the adapter's add inside its matmul.

peft computes a LoRA linear as ``base(x) + lora_B(lora_A(x)) * scaling``: the adapter's output, its scaled copy and
the sum are three tensors the width of the layer's output (4,864 wide for the 0.5B's MLP), each a pass over memory
in the forward and again in the backward. The same value is ``addmm(base(x), (x @ A.T) * scaling, B.T)``: the
scaling touches the rank-``r`` activations and the add happens inside the matmul, so only the result is
written. In exact arithmetic the two are equal. In floating point they round alike when the scaling is a power of two
(params.yaml's ``lora``: 16 / 8): peft's numbers to the bit (a whole warm start retrained with it gave the same
adapter, byte for byte); with another scaling they differ by float rounding. ``perf/bench_int8_base.py --modes fp32
fused`` measures a GRPO update with each.

Only the plain case is taken over: adapters enabled and not merged, one active adapter, no dropout, no DoRA or
other variant, no bias on ``lora_B``, the input in the adapter's dtype, no extra arguments, weights that are not
ZeRO-3 shards. Anything else runs peft's own forward, so ``disable_adapter()`` (the KL reference) and merging
work as before.

    n = fuse_lora_forward(peft_model)   # its LoRA linears now run the fused forward
    unfuse_lora_forward(peft_model)     # peft's forward again
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["fuse_lora_forward", "unfuse_lora_forward"]


def _plain(layer: nn.Module, x: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
    """The active adapter's name when ``layer`` is in the plain case for input ``x``, else None."""
    if args or kwargs or layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if name not in layer.lora_A or name in getattr(layer, "lora_variant", {}):
        return None
    if not isinstance(layer.lora_dropout[name], nn.Identity) or layer.lora_B[name].bias is not None:
        return None
    weight = layer.lora_A[name].weight
    if hasattr(weight, "ds_id"):  # a DeepSpeed ZeRO-3 shard: gathered only when its module is called
        return None
    return name if x.dtype == weight.dtype else None


def _fused_forward(self: nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    name = _plain(self, x, args, kwargs)
    if name is None:
        return type(self).forward(self, x, *args, **kwargs)
    result = self.base_layer(x)
    low = F.linear(x, self.lora_A[name].weight) * self.scaling[name]
    width = result.shape[-1]
    out = torch.addmm(result.reshape(-1, width), low.reshape(-1, low.shape[-1]), self.lora_B[name].weight.t())
    return out.view(*result.shape)


def _lora_linears(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.lora import Linear

    return [m for m in model.modules() if isinstance(m, Linear)]


def fuse_lora_forward(model: nn.Module) -> int:
    """The fused forward for every peft LoRA linear of ``model``; how many. The layers keep their adapters, and
    any case but the plain one still runs peft's forward."""
    layers = _lora_linears(model)
    if not layers:
        raise ValueError("fuse_lora_forward needs a LoRA model: no peft LoRA linear was found")
    for layer in layers:
        layer.forward = types.MethodType(_fused_forward, layer)
    return len(layers)


def unfuse_lora_forward(model: nn.Module) -> int:
    """Undo :func:`fuse_lora_forward`: peft's own forward again; how many layers."""
    n = 0
    for layer in _lora_linears(model):
        if "forward" in layer.__dict__:
            del layer.forward
            n += 1
    return n
