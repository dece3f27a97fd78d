"""The policy a trained agent starts from: the adapter the ``sft`` stage trained for the agent's warm-start method
(``train_policy.warm_start``: react -> ``sft``, scaffold -> ``sft_scaffold``; null: the base model), merged into
the base under a fresh RL LoRA, and the agent options that warm start was trained under. Each reads the run spec
(:mod:`components.run_spec`).

    spec = run_spec(params)
    policy, tokenizer = warm_started_policy(spec, "scaffold")   # KL reference: the warm-started weights
    adapter = warm_start_adapter(spec, "scaffold")              # outputs/sft_scaffold/adapter, or None
    options = warm_start_options(spec, "react")                 # e.g. {"system_prompt": "compact"}
"""

from __future__ import annotations

from pathlib import Path

from components.run_spec import RunSpec
from components.training.model import LoRASettings, build_policy, load_trainable_policy


def warm_start_method(spec: RunSpec, agent: str) -> str | None:
    """The warm-start method (``train_policy.warm_start``) of ``agent``; None: the base model."""
    return spec.train_policy.warm_start.get(agent)


def warm_start_adapter(spec: RunSpec, agent: str) -> Path | None:
    """The adapter the sft stage trained for ``agent``'s warm-start method; None for the base model, or when the
    base already is the warm start (``train_policy.merge_warm_start`` false)."""
    method = warm_start_method(spec, agent)
    return None if method is None or not spec.train_policy.merge_warm_start else spec.warm_start_folder("sft", method) / "adapter"


def warm_start_options(spec: RunSpec, agent: str) -> dict:
    """The agent options ``agent``'s warm start was trained under (e.g. ``methods.sft``'s compact system prompt);
    a variant's own options override them."""
    method = warm_start_method(spec, agent)
    warm = spec.methods.get(method) if method else None
    if warm is None or warm.agent != agent:
        return {}
    return dict(warm.options)


def warm_started_policy(spec: RunSpec, agent: str = "react"):
    """(Policy with a fresh RL LoRA over base + merged warm-start adapter of ``agent``, tokenizer)."""
    model, tokenizer = load_trainable_policy(spec)
    adapter = warm_start_adapter(spec, agent)
    if adapter is not None:
        if not (adapter / "adapter_config.json").exists():
            method = warm_start_method(spec, agent)
            raise FileNotFoundError(f"train_policy.warm_start.{agent}={method}: {adapter} holds no adapter (run "
                                    f"the {adapter.parent.name} stage, or set train_policy.warm_start.{agent}=null "
                                    "to start from the base)")
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    lora = spec.lora
    policy = build_policy(model, lora=LoRASettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout) if lora.r else None,
                          gradient_checkpointing=spec.grpo.gradient_checkpointing, int8_base=spec.grpo.int8_base,
                          fused_lora=spec.grpo.fused_lora)
    return policy, tokenizer
