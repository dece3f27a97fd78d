"""The policy-training variants of ``train_policy@<variant>``: each method is a builder registered here that
returns the parts it plugs into the one GRPO trainer, never a fork of the loop or the trainer.

    @VARIANTS.register("arbor")
    def build_arbor(ctx: VariantContext) -> VariantParts:
        return VariantParts(reward_fn=ArborReward(...), method=RubricMemory(...))

    parts = VARIANTS.get("grpo")(ctx)

A builder receives a :class:`VariantContext` (params, a role lookup for judges, the toolbox, an output
folder) and returns :class:`VariantParts`. Built in here: ``grpo`` (outcome reward: token F1 when the
episode is format-valid, else -1) and ``dapo`` (the same with DAPO's dynamic sampling: outcome-homogeneous
groups are dropped and counted, and the trainer draws more prompts, up to :data:`DAPO_REFILL_ROUNDS` extra
rounds, until the step holds ``grpo.prompts_per_step`` groups whose outcomes differ).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.method_registry import load_methods
from components.params import GRPOParams, Params
from components.registry import Registry
from components.rewards.outcome import OutcomeReward
from components.training.episodes import Episode, MethodState, RewardFn, RewardOutput, StepContext

__all__ = ["DAPO_REFILL_ROUNDS", "VARIANTS", "VariantContext", "VariantParts", "drop_homogeneous_groups",
           "get_variant", "variant_grpo"]

# DAPO (Yu et al. 2025, Algorithm 1) samples until the batch is full and gives no cap; its released recipe stops
# after 10 generation batches of 3x the training batch. A refill round here draws only the missing groups, so
# 3 rounds bound a step at 4 rollouts (an embedded CPU run stays usable); grpo.dynamic_sampling_max_rounds
# overrides it.
DAPO_REFILL_ROUNDS = 3

@dataclass
class VariantContext:
    params: Params
    roles: Callable[[str], Any]  # role name -> ChatModel (judges, consolidators, ...)
    toolbox: Any
    out_dir: Path
    embedder: Any = None  # sentence embedder, loaded on demand by variants that need one


@dataclass
class VariantParts:
    reward_fn: RewardFn
    advantage_fn: Callable | None = None
    method: MethodState | None = None
    loss_fn: Callable | None = None
    extra_modules: dict[str, Any] = field(default_factory=dict)
    agent: str = "react"  # the agent (registry name) that rolls out episodes
    agent_options: dict[str, Any] = field(default_factory=dict)
    # a curriculum: the prompt order the trainer follows as given (no shuffle), e.g. RubricEM's windows
    order_prompts: Callable[[list[Any]], list[Any]] | None = None
    # DAPO's dynamic sampling: extra rounds of prompts the trainer may draw per step to replace groups without
    # signal (0: none); used when grpo.dynamic_sampling_max_rounds is None (unset)
    dynamic_sampling_max_rounds: int = 0


VARIANTS: Registry[Callable[[VariantContext], VariantParts]] = Registry("training variant")


def drop_homogeneous_groups(reward_fn: RewardFn) -> RewardFn:
    """Wrap a scalar reward: every episode of a group whose scores are all equal gets no score (dropped and
    counted by the trainer), since such a group carries no learning signal (DAPO's dynamic sampling)."""

    def wrapped(episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        out = reward_fn(episodes, ctx)
        out = out if isinstance(out, RewardOutput) else RewardOutput(list(out))
        by_group: dict[int, list[int]] = {}
        for i, e in enumerate(episodes):
            by_group.setdefault(e.group, []).append(i)
        scores, dropped = list(out.scores), 0
        for members in by_group.values():
            values = {scores[i] for i in members}
            if len(values) == 1:
                dropped += 1
                for i in members:
                    scores[i] = None
        return RewardOutput(scores, {**out.metrics, "homogeneous_groups": float(dropped),
                                     "homogeneous_fraction": dropped / max(len(by_group), 1)})

    return wrapped


@VARIANTS.register("grpo")
def build_grpo(ctx: VariantContext) -> VariantParts:
    return VariantParts(reward_fn=OutcomeReward())


@VARIANTS.register("dapo")
def build_dapo(ctx: VariantContext) -> VariantParts:
    return VariantParts(reward_fn=drop_homogeneous_groups(OutcomeReward()),
                        dynamic_sampling_max_rounds=DAPO_REFILL_ROUNDS)


def variant_grpo(config: GRPOParams, parts: VariantParts) -> GRPOParams:
    """The GRPO configuration a variant's run trains with: ``config`` with the variant's dynamic-sampling rounds
    where ``dynamic_sampling_max_rounds`` is unset (None); a value set in params.yaml or by --set wins."""
    if config.dynamic_sampling_max_rounds is not None:
        return config
    return config.model_copy(update={"dynamic_sampling_max_rounds": parts.dynamic_sampling_max_rounds})


def get_variant(name: str) -> Callable[[VariantContext], VariantParts]:
    """The builder registered as ``name``, after every method has registered its variants."""
    if name not in VARIANTS:
        load_methods()
    return VARIANTS.get(name)
