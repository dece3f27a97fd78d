"""The rollout engines ``train_policy.engine`` names, in a registry (verl's idiom, as for backends and judges): each
says how it rolls out the trained policy (``policy``), how it writes for another role's frozen-base model such as
ARCO's mu (``role``; None: transformers' generate on that model itself) and how ``evaluate`` serves a policy rolled
out on it (``served``; None: the warm start's backend plus the RL adapter, components/trained_policy.py). Every
engine's heavy imports happen when it is built; each reads the run spec (:mod:`components.run_spec`).

    engine = ENGINES.get(spec.engine).policy(spec, policy, tokenizer, base_adapters)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.agents.params import MethodParams
from components.llm.params import BackendParams
from components.registry import Registry
from components.run_spec import RunSpec

__all__ = ["ENGINES", "RolloutEngineSpec", "role_engine", "vllm_engine_for_policy", "vllm_trained_policy"]


@dataclass(frozen=True)
class RolloutEngineSpec:
    policy: Callable[[RunSpec, Any, Any, list], Any]  # (spec, policy, tokenizer, base adapters) -> the engine
    role: Callable[..., Any] | None = None  # (spec, role, tokenizer, **options) -> an engine for the role's model
    # (spec, variant, its agent, warm start, its entry, the RL adapter) -> (backend name, backend, method entry)
    served: Callable[..., tuple[str, BackendParams, MethodParams]] | None = None


ENGINES: Registry[RolloutEngineSpec] = Registry("rollout engine")


def _hf_policy(spec: RunSpec, policy, tokenizer, base_adapters: list):
    from components.training.engines.rollout import HFRolloutEngine

    return HFRolloutEngine(policy.model, tokenizer)


def _llamacpp_policy(spec: RunSpec, policy, tokenizer, base_adapters: list):
    from components.training.engines.llamacpp import engine_for_policy

    return engine_for_policy(spec, policy, tokenizer, base_adapters)


def _llamacpp_role(spec: RunSpec, role: str, tokenizer, **options):
    from components.training.engines.llamacpp import engine_for_role

    return engine_for_role(spec, role, tokenizer, **options)


def vllm_engine_for_policy(spec: RunSpec, policy, tokenizer, base_adapters: list):
    """A vLLM rollout engine for ``policy`` (a LoRA policy): vLLM serves one LoRA per request, so a base that
    holds merged adapters (the warm start) is written once as a transformers folder under ``run.cache_dir``
    (keyed by the base model and the adapters' digests) and vLLM loads that; each update publishes the RL LoRA."""
    from components.training.engines.rollout import VLLMRolloutEngine
    from components.training.engines.vllm_base import export_base, warm_started_base

    if not policy.is_lora:
        raise ValueError("train_policy.engine: vllm serves LoRA policies only (lora.r > 0): full fine-tuning "
                         "would need the weights reloaded into the engine after every update")
    backend = spec.backend("trainable_policy")
    model_path = backend.model
    if base_adapters or backend.embedded:  # an embedded model's weights exist in process only: vLLM reads a folder
        model_path = str(export_base(policy.model, tokenizer, *warm_started_base(spec, base_adapters)))
    return VLLMRolloutEngine(model_path, tokenizer=tokenizer, max_lora_rank=max(spec.lora.r, 1),
                             seed=spec.seed, **spec.train_policy.vllm_options)


def vllm_trained_policy(spec: RunSpec, variant: str, agent: str, warm: str, entry: MethodParams, adapter: Path
                        ) -> tuple[str, BackendParams, MethodParams]:
    """How ``evaluate`` serves a policy trained with vLLM rollouts (the paper profile): as it was rolled out, vLLM in
    process over the warm-started base that train_policy exported (the base with ``agent``'s warm start merged in),
    with the RL ``adapter`` as its one LoRA. vLLM applies one LoRA per request, so the warm start's own served
    entry (a LoRA module of the base model's server) cannot take a second one."""
    from components.training.engines.vllm_base import base_folder, warm_started_base
    from components.training.warm_started import warm_start_adapter

    folder = base_folder(*warm_started_base(spec, [warm_start_adapter(spec, agent)]))
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"evaluate@{variant}: {folder} holds no warm-started base; train_policy@{variant} "
                                f"exports it there (train_policy.engine: vllm) under this run.cache_dir")
    name = f"{spec.backend_name('trainable_policy')}-{variant}"
    options = dict(spec.train_policy.vllm_options)
    options.update(max_lora_rank=max(spec.lora.r, 1), seed=spec.seed)
    trained = BackendParams(type="vllm", model=str(folder), lora=str(adapter), options=options)
    method = MethodParams(
        agent=entry.agent, roles={**entry.roles, "policy": name}, options=dict(entry.options),
        description=f"The final policy of train_policy@{variant}: {warm}'s agent, prompts and options, served by vLLM "
                    f"over the warm-started base it was rolled out from, with the variant's RL adapter.")
    return name, trained, method


ENGINES.register("hf")(RolloutEngineSpec(policy=_hf_policy))
ENGINES.register("llamacpp")(RolloutEngineSpec(policy=_llamacpp_policy, role=_llamacpp_role))
ENGINES.register("vllm")(RolloutEngineSpec(policy=vllm_engine_for_policy, served=vllm_trained_policy))


def role_engine(spec: RunSpec, name: str | None, role: str, tokenizer, **options):
    """The engine that writes for ``role``'s model under engine ``name`` (None: ``train_policy.engine``'s when it
    has one for a role, else transformers' generate); None when that is transformers' generate on the model."""
    if name is None:
        name = spec.engine if ENGINES.get(spec.engine).role is not None else "hf"
    build = ENGINES.get(name).role
    return build(spec, role, tokenizer, **options) if build is not None else None
