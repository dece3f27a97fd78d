"""ARCO's run setup: the released configuration check (``arco.setup``), the sparse phase in trainer steps,
and the backbone mu is built on (:mod:`components.methods.arco.variants` builds the variants with them).

    check_setup(params)             # ["retrieval.scope=corpus", ...]: where a run differs from ARCO's setup
    setup_overrides(params.arco.setup)   # the --set flags that put a run on it
"""

from __future__ import annotations

import math
from typing import Any

from components.methods.arco.params import ArcoSetup
from components.params import Params
from components.params_section import ParamsError
from components.run_spec import RunSpec

__all__ = ["check_setup", "load_backbone", "setup_overrides", "sparse_steps"]


def sparse_steps(params: Params) -> int:
    """``arco.sparse_epochs`` in trainer steps: epochs x ceil(training questions / prompts per step)."""
    questions = min(params.train_policy.n_questions, params.data.n_train)
    return round(params.arco.sparse_epochs * math.ceil(questions / params.grpo.prompts_per_step))


def setup_overrides(setup: ArcoSetup) -> list[str]:
    """``--set`` flags that put a run on ARCO's released setup."""
    return [f"retrieval.scope={setup.retrieval_scope}", f"retrieval.top_k={setup.top_k}",
            f"agent.max_turns={setup.max_steps}", f"data.n_train={setup.n_train}", f"data.n_dev={setup.n_dev}"]


def check_setup(params: Params) -> list[str]:
    """The keys where the run differs from ``arco.setup`` (``key=run value``)."""
    s = params.arco.setup
    pairs = [("retrieval.scope", params.retrieval.scope, s.retrieval_scope), ("retrieval.top_k", params.retrieval.top_k, s.top_k),
             ("agent.max_turns", params.agent.max_turns, s.max_steps), ("data.n_train", params.data.n_train, s.n_train),
             ("data.n_dev", params.data.n_dev, s.n_dev)]
    return [f"{key}={run}" for key, run, want in pairs if run != want]


def load_backbone(spec: RunSpec, role: str) -> tuple[Any, Any]:
    """(transformers model, tokenizer) of the weights behind ``role`` (an hf or vllm backend), loaded like the
    trainable policy: on ``train_policy.device`` in ``train_policy.dtype``."""
    backend = spec.roles.get(role)
    if not isinstance(backend, str):
        raise ParamsError(f"arco.model_role: role {role!r} must be bound to one backend in llm.roles, got {backend!r}")
    cfg = spec.backends[backend]
    if cfg.type not in ("hf", "vllm"):
        raise ParamsError(f"arco.model_role: role {role!r} is bound to a {cfg.type!r} backend; mu needs weights "
                          "(an hf or vllm backend)")
    from components.training.model import load_backend_weights

    return load_backend_weights(spec, backend)  # where train_policy.device / dtype put the trainable models
