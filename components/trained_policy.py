"""A training variant's final policy as a method ``evaluate`` can run, so trained and inference-time methods are
measured on one harness: the same test questions, agent prompts, budgets and answer judge. The generated method is
the warm start's entry as it is (``methods.sft``, or ``methods.sft_scaffold`` for RubricEM's scaffold variants:
:func:`variant_agent`) with ``policy`` rebound to a backend serving the warm start's and the RL adapter together
(:func:`trained_policy_method`); only the policy's weights differ from ``evaluate@<warm start>``.

    params = with_trained_policy(params, "arbor")   # adds methods.arbor and the backend that serves its policy
    params, spec = for_method(params, "arbor")      # what `evaluate --method arbor` runs
"""

from __future__ import annotations

from pathlib import Path

from components.adapters import is_whole_model
from components.agents.params import MethodParams
from components.llm.params import BackendParams
from components.params import Params
from components.params_section import ParamsError
from components.run_spec import RunSpec, run_spec
from components.training.engines.registry import ENGINES

__all__ = ["trained_adapter", "trained_policy_method", "variant_agent", "with_trained_policy"]

REACT = "react"


def variant_agent(spec: RunSpec, variant: str) -> str:
    """The agent ``variant`` trains (and is evaluated with): its owning method's agent when that agent has a warm
    start in ``train_policy.warm_start``, else ReAct."""
    from components.method_registry import variant_method

    owner = variant_method(variant)
    own = [a for a in (owner.agents if owner is not None else ()) if a in spec.train_policy.warm_start]
    return own[0] if len(own) == 1 else REACT


def trained_adapter(spec: RunSpec, variant: str) -> Path:
    """The adapter ``train_policy@<variant>`` writes under ``run.out_dir``."""
    return Path(spec.run.out_dir) / "train" / variant / "adapter"


def _variants() -> list[str]:
    from components.method_registry import load_methods
    from components.variants import VARIANTS

    load_methods()
    return VARIANTS.names()


def trained_policy_method(spec: RunSpec, variant: str) -> tuple[str, BackendParams, MethodParams]:
    """(backend name, backend, method entry) that evaluate ``variant``'s final policy. Raises ParamsError when the
    variant's agent has no warm start or its warm start is not served by a backend that takes LoRA adapters.

    ``train_policy@<variant>`` trains a fresh LoRA over its warm start merged into the base
    (:mod:`components.training.warm_started`), so the backend is a copy of the warm start's policy backend whose
    ``lora`` lists both adapters (applied together; merged when the warm start's backend merges, and always by an
    in-process ``hf`` backend). A policy trained with vLLM rollouts (``train_policy.engine: vllm``) is served as it
    was rolled out (its engine's ``served``, :mod:`components.training.engines.registry`): an in-process
    ``vllm`` backend over the exported warm-started base with the RL adapter as its one LoRA, since vLLM
    applies one LoRA per request."""
    agent = variant_agent(spec, variant)
    warm = spec.train_policy.warm_start.get(agent)
    if warm is None or warm not in spec.methods:
        raise ParamsError(f"evaluate@{variant}: train_policy.warm_start.{agent} is {warm!r}; a trained policy is served "
                          f"as its warm start's backend plus the RL adapter, so set it to a params.methods entry, or "
                          f"define methods.{variant} yourself")
    entry = spec.methods[warm]
    served_by = ENGINES.get(spec.engine).served  # how a policy rolled out on that engine is served
    if served_by is not None:
        return served_by(spec, variant, agent, warm, entry, trained_adapter(spec, variant))
    served = entry.roles.get("policy", spec.roles["policy"])
    backend = spec.backends[served]
    folder = trained_adapter(spec, variant)
    if is_whole_model(folder) and backend.type == "hf":  # full fine-tuning over no adapter: the folder is the policy
        name = f"{served}-{variant}"
        trained = backend.model_copy(update={"model": str(folder), "lora": None})
        method = MethodParams(agent=entry.agent, roles={**entry.roles, "policy": name}, options=dict(entry.options),
                              description=f"The final policy of train_policy@{variant} (full fine-tuning): {warm}'s "
                                          f"agent, prompts and options, served from {folder}.")
        return name, trained, method
    if not ((backend.server == "native" and backend.type == "openai") or backend.type == "hf"):
        raise ParamsError(f"evaluate@{variant}: the warm start {warm!r} is served by backend {served!r}, which takes no "
                          f"LoRA adapters (only the native llama.cpp server and the in-process hf backend do); define "
                          f"methods.{variant} with a policy backend that serves the trained adapter")
    name = f"{served}-{variant}"
    trained = backend.model_copy(update={
        "lora": [*backend.adapters, str(trained_adapter(spec, variant))],
        "model": f"{backend.model or backend.embedded}-{variant}",
    })
    method = MethodParams(
        agent=entry.agent, roles={**entry.roles, "policy": name}, options=dict(entry.options),
        description=f"The final policy of train_policy@{variant}: {warm}'s agent, prompts and options, served as "
                    f"{served} plus the variant's RL adapter.")
    return name, trained, method


def with_trained_policy(params: Params, name: str) -> Params:
    """``params`` with ``methods.<name>`` (and its backend) added when ``name`` is a training variant that
    params.methods does not define; otherwise ``params`` unchanged. Raises FileNotFoundError when the variant's
    adapter is missing (the train_policy stage has not run under this ``run.out_dir``), ParamsError for a name
    that is neither. A ``params.methods`` entry named like a variant is taken as written; training-time helpers of a
    variant (RubricEM's rubric bank, ARBOR's memory) are not part of the evaluated agent."""
    if name in params.methods:
        return params
    variants = _variants()
    if name not in variants:
        raise ParamsError(f"unknown method {name!r}: params.methods defines {sorted(params.methods)}; training "
                          f"variants (their trained policies): {sorted(variants)}")
    spec = run_spec(params)
    adapter = trained_adapter(spec, name)
    if not (adapter / "adapter_config.json").is_file() and not is_whole_model(adapter):
        raise FileNotFoundError(f"evaluate@{name}: {adapter} holds no adapter; run train_policy@{name} first")
    backend_name, backend, method = trained_policy_method(spec, name)
    raw = params.model_dump()
    raw["llm"]["backends"][backend_name] = backend.model_dump()
    raw["methods"][name] = method.model_dump()
    return Params.model_validate(raw)
