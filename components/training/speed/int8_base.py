"""Int8 matmuls for the frozen base of a LoRA policy: a speed option for training on CPUs.

With LoRA the base weights never change, so each base linear can be quantized once, per output channel to int8,
and its matmuls run as int8 x int8 -> int32 (``torch._int_mm``) with each row of the input quantized on the fly
(symmetric, its own absmax scale). On two AVX2 cores that matmul is 3-4 times the fp32 one at a 1,500-token
row of the 0.5B's shapes; the LoRA branch, attention, norms and the LM head stay in fp32. The backward pass
does the same for the input's gradient (``grad @ W``, ``W`` quantized per input channel), so the reference
forward, the policy's forward and its backward all gain. What it costs: every base matmul carries int8
rounding (on the warm-started 0.5B's agent rows, the trained tokens' log-probabilities move by 0.012 nat on average,
0.17 at the 99th percentile, and the LoRA gradient keeps a cosine of 0.98 with the fp32 one;
``perf/bench_int8_base.py``), and two int8 copies of each base weight (half the fp32 weight's memory) beside it.

Turned on by ``build_policy(..., int8_base=True)`` (the ``grpo.int8_base`` and ``sft.int8_base`` switches).
The base must stay frozen while it is on: merging an adapter into the weights afterwards (``merge_and_unload``)
leaves the int8 copies stale, so :func:`restore_fp32` first.

    n = quantize_frozen_base(peft_model)   # the base linears under LoRA layers now run int8 matmuls
    restore_fp32(peft_model)               # back to their fp32 forward
"""

from __future__ import annotations

import types

import torch
from torch import nn

__all__ = ["int8_linear", "quantize_frozen_base", "quantize_rows", "restore_fp32"]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` with ``q`` int8 and ``q * scale`` close to ``x``: each row scaled by its own absmax / 127."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny) / 127.0
    return torch.round(x / scale).to(torch.int8), scale


class _Int8Matmul(torch.autograd.Function):
    """``x @ W.T`` from int8 copies of ``W``: ``w_t`` (``[K, N]``, per output channel ``w_scale``) for the
    forward, ``w_in`` (``[N, K]``, per input channel ``w_in_scale``) for the input's gradient. No gradient for
    the weights: they are frozen."""

    @staticmethod
    def forward(ctx, x, w_t, w_scale, w_in, w_in_scale):
        rows = x.reshape(-1, x.shape[-1])
        q, scale = quantize_rows(rows)
        y = torch._int_mm(q, w_t).to(x.dtype) * scale * w_scale
        ctx.save_for_backward(w_in, w_in_scale)
        return y.reshape(*x.shape[:-1], w_t.shape[1])

    @staticmethod
    def backward(ctx, grad):
        w_in, w_in_scale = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        q, scale = quantize_rows(rows)
        gx = torch._int_mm(q, w_in).to(grad.dtype) * scale * w_in_scale
        return gx.reshape(*grad.shape[:-1], w_in.shape[1]), None, None, None, None


def _int8_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = _Int8Matmul.apply(x, self._int8_w_t, self._int8_w_scale, self._int8_w_in, self._int8_w_in_scale)
    return y if self.bias is None else y + self.bias


def int8_linear(linear: nn.Linear) -> nn.Linear:
    """Make ``linear`` (frozen, float32) run its matmuls in int8; returns it."""
    if linear.weight.requires_grad:
        raise ValueError("int8 matmuls are for frozen weights: this linear's weight requires grad")
    if linear.weight.device.type != "cpu":
        raise ValueError("int8 matmuls are a CPU option (int8 on AVX2); on a GPU train in bf16 (train_policy.dtype)")
    if linear.weight.dtype != torch.float32:
        raise ValueError(f"int8 matmuls replace float32 ones; this linear is {linear.weight.dtype}")
    w = linear.weight.detach()  # [N, K]
    out_scale = w.abs().amax(dim=1).clamp_min(torch.finfo(w.dtype).tiny) / 127.0
    in_scale = w.abs().amax(dim=0).clamp_min(torch.finfo(w.dtype).tiny) / 127.0
    # [K, N] as the transpose of a contiguous [N, K]: the layout _int_mm runs fastest on the CPU
    linear._int8_w_t = torch.round(w / out_scale[:, None]).to(torch.int8).t()
    linear._int8_w_scale = out_scale
    linear._int8_w_in = torch.round(w / in_scale[None, :]).to(torch.int8).t().contiguous().t()
    linear._int8_w_in_scale = in_scale
    linear.forward = types.MethodType(_int8_forward, linear)
    return linear


def _base_linears(model: nn.Module) -> list[nn.Linear]:
    """The frozen base linears under peft's LoRA layers."""
    from peft.tuners.lora import LoraLayer

    out = []
    for module in model.modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            if type(base) is nn.Linear:
                out.append(base)
    return out


def quantize_frozen_base(model: nn.Module) -> int:
    """Int8 matmuls for every frozen base linear under a LoRA layer of ``model`` (a peft model); how many."""
    linears = _base_linears(model)
    if not linears:
        raise ValueError("int8_base needs a LoRA model: no base linear under a LoRA layer was found")
    for linear in linears:
        int8_linear(linear)
    return len(linears)


def restore_fp32(model: nn.Module) -> int:
    """Undo :func:`quantize_frozen_base`: the base linears' own fp32 forward again, int8 copies dropped."""
    n = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and "forward" in module.__dict__ and hasattr(module, "_int8_w_t"):
            del module.forward
            for name in ("_int8_w_t", "_int8_w_scale", "_int8_w_in", "_int8_w_in_scale"):
                delattr(module, name)
            n += 1
    return n
