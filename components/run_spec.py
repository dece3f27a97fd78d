"""What a training or evaluation run reads, resolved once from ``Params`` by :func:`run_spec`: each role's backend,
the run's folders (``run``), the trained policy's LoRA, the trainer's section (``grpo``), the rollout engine and
device/dtype placement (``train_policy``), the warm starts' method entries (``methods``) and the seed. Components
that load, place or roll out the trained policy take this (or their own section), never the whole ``Params``;
``tests/test_run_spec_contract.py`` fails when a new component function takes ``Params``.

    spec = run_spec(params)                  # in a task, once
    spec.backend("trainable_policy")         # params.llm.backends[params.llm.roles["trainable_policy"]]
    spec.warm_start_folder("sft", "sft")     # outputs/sft
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from components.agents.params import MethodParams
from components.llm.params import BackendParams
from components.params import Params, RunParams
from components.params_section import ParamsError
from components.training.params import GRPOParams, LoRAParams, TrainPolicyParams

__all__ = ["RunSpec", "run_spec"]


@dataclass(frozen=True)
class RunSpec:
    """The settings of one run, as :func:`run_spec` resolves them (the sections are the params' own objects)."""

    seed: int
    run: RunParams
    roles: Mapping[str, str | list[str]]
    backends: Mapping[str, BackendParams]
    lora: LoRAParams
    grpo: GRPOParams
    train_policy: TrainPolicyParams
    methods: Mapping[str, MethodParams]

    @property
    def engine(self) -> str:
        """The rollout engine's registry name (``train_policy.engine``)."""
        return self.train_policy.engine

    def backend_name(self, role: str) -> str:
        """The one backend ``role`` is bound to in ``llm.roles``."""
        bound = self.roles.get(role)
        if not isinstance(bound, str):
            raise ParamsError(f"llm.roles.{role}: a run's {role} must be bound to one backend, got {bound!r}")
        return bound

    def backend(self, role: str) -> BackendParams:
        """The settings of the backend ``role`` is bound to."""
        return self.backends[self.backend_name(role)]

    def warm_start_folder(self, stage: str, method: str) -> Path:
        """The folder the warm-start stage ``stage`` writes for ``method`` (:func:`components.run_files.warm_start_stage`)."""
        from components.run_files import warm_start_stage

        return Path(self.run.out_dir) / warm_start_stage(stage, method, self.methods)


def run_spec(params: Params) -> RunSpec:
    """The run spec of ``params`` (after any method's role rebindings and shared overrides were applied)."""
    return RunSpec(seed=params.seed, run=params.run, roles=params.llm.roles, backends=params.llm.backends,
                   lora=params.lora, grpo=params.grpo, train_policy=params.train_policy, methods=params.methods)
