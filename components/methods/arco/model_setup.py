"""ARCO's run setup: the released configuration check (``arco.setup``), the sparse phase in trainer steps,
and the backbone mu is built on (:mod:`components.methods.arco.variants` builds the variants with them).

    check_setup(params.arco.setup, params.retrieval, params.agent, params.data)   # ["retrieval.scope=corpus", ...]
    setup_overrides(params.arco.setup)   # the --set flags that put a run on ARCO's setup
"""

from __future__ import annotations

import math
from typing import Any

from components.agents.params import AgentParams
from components.datasets.params import DataParams
from components.methods.arco.params import ArcoParams, ArcoSetup
from components.params_section import ParamsError
from components.retrieval.params import RetrievalParams
from components.run_spec import RunSpec

__all__ = ["check_setup", "load_backbone", "setup_overrides", "sparse_steps"]


def sparse_steps(settings: ArcoParams, questions: int, prompts_per_step: int) -> int:
    """``arco.sparse_epochs`` in trainer steps: epochs x ceil(training questions / prompts per step)."""
    return round(settings.sparse_epochs * math.ceil(questions / prompts_per_step))


def setup_overrides(setup: ArcoSetup) -> list[str]:
    """``--set`` flags that put a run on ARCO's released setup."""
    return [f"retrieval.scope={setup.retrieval_scope}", f"retrieval.top_k={setup.top_k}",
            f"agent.max_turns={setup.max_steps}", f"data.n_train={setup.n_train}", f"data.n_dev={setup.n_dev}"]


def check_setup(s: ArcoSetup, retrieval: RetrievalParams, agent: AgentParams, data: DataParams) -> list[str]:
    """The keys where the run (its retrieval, agent and data sections) differs from ``arco.setup`` (``key=run
    value``)."""
    pairs = [("retrieval.scope", retrieval.scope, s.retrieval_scope), ("retrieval.top_k", retrieval.top_k, s.top_k),
             ("agent.max_turns", agent.max_turns, s.max_steps), ("data.n_train", data.n_train, s.n_train),
             ("data.n_dev", data.n_dev, s.n_dev)]
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
