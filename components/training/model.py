"""The trainable policy: a causal LM, optionally wrapped with LoRA, plus its frozen reference. The loaders place
weights where ``train_policy.device`` and ``dtype`` say (:func:`load_trainable_policy` for the ``trainable_policy``
role, :func:`load_backend_weights` for any backend's, :func:`load_causal_lm` from a folder, a GGUF file or a model
object); :func:`build_policy` adds a peft LoRA (or leaves every weight trainable) and the speed options;
:class:`Policy` scores per-token log-probabilities for the current weights and the reference (with LoRA, the base
with the adapter disabled; with full fine-tuning, a frozen copy), for the masked positions only when asked, so
neither the logits nor an fp32 log-softmax of the whole ``[B, T, V]`` block is built and a tool observation costs
the body's forward but no LM head.

    policy = build_policy("path/to/model", lora=LoRASettings(r=8, alpha=16))
    logp = policy.token_logprobs(input_ids, attention_mask, positions=loss_mask)
    ref = policy.token_logprobs(input_ids, attention_mask, positions=loss_mask, reference=True)
    logp, hidden = policy.forward_logprobs(input_ids, attention_mask, positions=loss_mask, output_hidden_states=True)
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from components.training.losses import masked_logprobs, token_logprobs

if TYPE_CHECKING:
    from components.run_spec import RunSpec

# peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model, and transformers 5 warns on
# every read: a line in every training log that no user can act on
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

__all__ = ["LoRASettings", "Policy", "activations_kept", "build_policy", "kept_if_short", "load_backend_weights", "load_causal_lm",
           "load_trainable_policy", "lora_execution"]

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoRASettings:
    """peft LoRA hyper-parameters. ``target_modules`` are module-name suffixes (Qwen2/Llama names by
    default; GPT-2 uses ``("c_attn", "c_proj", "c_fc")``)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: Sequence[str] = field(default=DEFAULT_TARGET_MODULES)
    bias: str = "none"


def load_causal_lm(
    source: str | Path | nn.Module,
    *,
    gguf_file: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> nn.Module:
    """Return a causal LM from ``source``: a local folder or a model id (loaded in ``dtype``, float32 by
    default, on ``device``, the CPU by default; with ``gguf_file`` the folder must contain that GGUF file), or a
    model object, returned as is unless ``device`` or ``dtype`` asks to move or cast it."""
    if isinstance(source, nn.Module):
        if device is None and dtype is None:
            return source
        return source.to(**{k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None})
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": dtype or torch.float32}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    return AutoModelForCausalLM.from_pretrained(str(source), **kwargs).to(device or "cpu")


def load_backend_weights(spec: RunSpec, backend: str):
    """(model, tokenizer) of the weights behind the backend named ``backend`` (an embedded model's GGUF,
    dequantized, or a transformers folder or model id), on ``train_policy.device`` in ``train_policy.dtype``."""
    from components.training.device import placement

    cfg = spec.backends[backend]
    where = placement(spec.train_policy)
    if cfg.embedded:
        from components.embedded.models import load_hf_policy

        model, tokenizer = load_hf_policy(cfg.embedded, spec.run.cache_dir, dtype=where.dtype)
        return _placed(model, where.device), tokenizer
    from transformers import AutoModelForCausalLM

    from components.hf_tokenizer import load_tokenizer

    # straight onto a GPU (no full copy in host memory first); on the CPU, as transformers always loaded it
    kwargs = {"device_map": {"": str(where.device)}} if where.device.type == "cuda" else {}
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=where.dtype, **kwargs)
    return _placed(model, where.device), load_tokenizer(cfg.model)


def _placed(model: nn.Module, device: torch.device) -> nn.Module:
    return model if next(model.parameters()).device == device else model.to(device)


def load_trainable_policy(spec: RunSpec):
    """(model, tokenizer) of the role ``trainable_policy``: transformers weights that training updates, placed
    by ``train_policy.device`` and ``train_policy.dtype``. The role may be bound to an ``hf`` backend or to a
    ``vllm`` one (the paper profile): the trainer always updates the transformers copy of the backend's model;
    ``train_policy.engine: vllm`` rolls out from a vLLM copy that takes each update as a LoRA."""
    backend = spec.backend_name("trainable_policy")
    cfg = spec.backends[backend]
    if cfg.type not in ("hf", "vllm"):  # a vllm backend names the same weights by model id (vLLM rolls them out)
        raise ValueError(f"trainable_policy must be bound to an 'hf' or 'vllm' backend, got {cfg.type!r}")
    return load_backend_weights(spec, backend)


class Policy:
    """A trainable causal LM with a frozen reference for the KL term.

    ``model`` is a peft ``PeftModel`` when ``is_lora`` and a plain transformers model otherwise.
    """

    def __init__(self, model: nn.Module, *, is_lora: bool, reference_model: nn.Module | None = None):
        if not is_lora and reference_model is None:
            raise ValueError("full fine-tuning needs a reference_model (a frozen copy of the start weights)")
        self.model = model
        self.is_lora = is_lora
        self._reference_model = reference_model

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """Yield the frozen reference model (the base with the adapter disabled, for LoRA)."""
        if self.is_lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self._reference_model

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        reference: bool = False,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token log-probabilities ``[B, T]``: ``logp[b, t]`` scores ``input_ids[b, t]`` given the
        tokens before it at ``temperature``; position 0 is 0.

        ``positions`` (a ``[B, T]`` mask) computes the masked positions only and leaves zeros (without
        gradient) elsewhere: a trainer passes its micro-batch's loss mask for every forward (policy, old and
        reference log-probs), so each position with loss has the full computation's value and gradient;
        code that reads ``logp`` outside the mask must not pass one. Position 0 is never scored. None means
        every position. Gradient flows for the current policy when grad mode is on; the reference is always
        no-grad. Batches are right-padded, so the default position ids are correct.
        """
        return self.forward_logprobs(
            input_ids, attention_mask, temperature=temperature, reference=reference, positions=positions
        )[0]

    def forward_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        reference: bool = False,
        positions: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(logp, hidden)`` from one forward pass: ``logp`` as :meth:`token_logprobs`; ``hidden`` is
        the last hidden state ``[B, T, H]`` at every position (the final norm's output, which the LM head
        reads) when ``output_hidden_states``, else None. ``hidden`` carries gradient like ``logp``, so a
        loss hook can add a term from it (a score head) and backpropagate both through one graph.

        ``attention_mask`` is the usual ``[B, T]`` padding mask, or a ``[B, 1, T, T]`` mask taken as given
        with its ``position_ids`` (a shared-prefix pack: :mod:`components.training.speed.prefix_pack`); the
        log-prob at ``t`` is then still read from the output at ``t - 1``, so each position's predecessor must
        be the token before it in the sequence.
        """
        if positions is not None:
            if positions.shape != input_ids.shape:
                raise ValueError(f"positions {tuple(positions.shape)} must match input_ids {tuple(input_ids.shape)}")
            positions = positions.to(device=input_ids.device, dtype=torch.bool).clone()
            positions[:, 0] = False
        if reference:
            with torch.no_grad(), self.reference() as ref:
                return self._forward(ref, input_ids, attention_mask, temperature, positions, output_hidden_states,
                                     position_ids)
        return self._forward(self.model, input_ids, attention_mask, temperature, positions, output_hidden_states,
                             position_ids)

    @staticmethod
    def _forward(
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: float,
        positions: torch.Tensor | None,
        output_hidden_states: bool,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        keep: torch.Tensor | None = None  # every position
        if positions is not None:
            # The output at position t-1 predicts the token at t.
            keep = torch.zeros_like(positions)
            keep[:, :-1] = positions[:, 1:]
        captured: list[torch.Tensor] = []
        hook = None
        if output_hidden_states or keep is not None:
            hook = _decoder(model).register_forward_hook(
                lambda _module, _args, out: captured.append(
                    out[0] if isinstance(out, tuple) else out.last_hidden_state
                )
            )
        try:
            extra = {} if position_ids is None else {"position_ids": position_ids}
            # With positions, the LM head runs on the kept rows of the hidden states below (the model computes the
            # logits of one position only): transformers releases differ in what logits_to_keep may be (5.19 takes
            # an index list, not a [B, T] mask), the head on the kept rows is the same on all of them.
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                        logits_to_keep=0 if keep is None else 1, **extra)
        finally:
            if hook is not None:
                hook.remove()
        hidden = captured[-1] if captured else None
        if keep is None:
            return token_logprobs(out.logits, input_ids, temperature), hidden
        logits = _output_head(model)(hidden[keep.bool()])
        return masked_logprobs(logits, input_ids, positions, temperature), hidden if output_hidden_states else None


def _output_head(model: nn.Module) -> nn.Module:
    """The LM head over the decoder (through a peft wrapper, so an adapter on it applies)."""
    head = model.get_output_embeddings()
    if head is None:
        raise TypeError(f"{type(model).__name__} has no output embeddings to score the kept positions with")
    return head


def _decoder(model: nn.Module) -> nn.Module:
    """The transformer body under the LM head (through a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


@contextmanager
def activations_kept(model: nn.Module) -> Iterator[None]:
    """Inside, the layers that gradient checkpointing made recompute their activations keep them instead (the
    same gradients, faster, more memory); outside, they recompute again."""
    flagged = _recomputing_layers(model)
    for module in flagged:
        module.gradient_checkpointing = False
    try:
        yield
    finally:
        for module in flagged:
            module.gradient_checkpointing = True


def _recomputing_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]


def recomputes_activations(model: nn.Module) -> bool:
    """Whether gradient checkpointing is on in ``model``'s layers (their own flag, which every transformers release
    keeps; the model-level property was renamed, is_gradient_checkpointing -> is_activation_checkpointing)."""
    return bool(_recomputing_layers(model))


def kept_if_short(model: nn.Module, padded_tokens: int, min_tokens: int) -> AbstractContextManager[None]:
    """:func:`activations_kept` for a micro-batch of fewer than ``min_tokens`` padded tokens (``checkpoint_min_tokens``
    of SFT and GRPO), else a block that changes nothing."""
    return activations_kept(model) if padded_tokens < min_tokens else nullcontext()


def recompute_activations(model: nn.Module) -> None:
    """Make ``model``'s decoder layers recompute their activations in backward (the same gradients, less
    memory); its input embeddings require grad, so adapters inside recomputed layers get gradients under
    reentrant checkpointing too. Call before wrapping it with peft."""
    _checkpointing_on(model)
    model.enable_input_require_grads()


def _checkpointing_on(model: nn.Module) -> None:
    # transformers 5 renamed gradient_checkpointing_enable (which now warns on every call) to this
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def build_policy(
    source: str | Path | nn.Module,
    *,
    lora: LoRASettings | None = LoRASettings(),
    gguf_file: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    gradient_checkpointing: bool = False,
    int8_base: bool = False,
    fused_lora: bool = False,
) -> Policy:
    """Load ``source`` and make it trainable: LoRA adapter when ``lora`` is given, else full fine-tuning. A path
    loads as :func:`load_causal_lm` says (float32 on the CPU unless told otherwise); a model object stays on
    its device and in its dtype unless ``device`` or ``dtype`` is given. ``int8_base`` runs the frozen base's
    matmuls in int8 (LoRA only; :mod:`components.training.speed.int8_base`); ``fused_lora`` gives the LoRA
    linears a leaner forward (:mod:`components.training.speed.fused_lora`; nothing to do under full
    fine-tuning)."""
    if int8_base and lora is None:
        raise ValueError("int8_base needs LoRA (lora.r > 0): full fine-tuning trains the base weights it would quantize")
    model = load_causal_lm(source, gguf_file=gguf_file, dtype=dtype, device=device)
    if gradient_checkpointing:
        model.config.use_cache = False
    if lora is None:
        if gradient_checkpointing:
            _checkpointing_on(model)
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        return Policy(model, is_lora=False, reference_model=reference)

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias=lora.bias,
        task_type="CAUSAL_LM",
    )
    if gradient_checkpointing:
        recompute_activations(model)
    peft_model = get_peft_model(model, config)
    lora_execution(peft_model, int8_base=int8_base, fused_lora=fused_lora)
    return Policy(peft_model, is_lora=True)


def lora_execution(peft_model: nn.Module, *, int8_base: bool = False, fused_lora: bool = False) -> None:
    """The CPU speed options of a LoRA model, applied after its adapters exist: ``int8_base`` runs the frozen
    base's matmuls in int8 (:mod:`components.training.speed.int8_base`), ``fused_lora`` gives the LoRA linears
    a leaner forward (:mod:`components.training.speed.fused_lora`). Every LoRA model a run trains takes them
    from here (the policy through :func:`build_policy`, ARCO's rubric model on its own base)."""
    if int8_base:
        from components.training.speed.int8_base import quantize_frozen_base

        quantize_frozen_base(peft_model)
    if fused_lora:
        from components.training.speed.fused_lora import fuse_lora_forward

        fuse_lora_forward(peft_model)
