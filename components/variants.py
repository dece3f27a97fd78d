"""The policy-training variants of ``train_policy@<variant>``: each method is a builder registered here that returns
the parts it plugs into the one GRPO trainer (:class:`VariantParts`, from a :class:`VariantContext`: params, a role
lookup for judges, the toolbox, an output folder), never a fork of the loop. Built in here are the shared
baselines' recipes (``BASELINE_RECIPES``): ``grpo`` (the outcome reward: token F1 when format-valid, else -1),
``dapo`` (:func:`build_dapo`, its settings in the ``dapo`` section) and ``discard_homogeneous`` (ARBOR 4.1's DAPO
baseline: :func:`build_discard_homogeneous`); a method's matched baselines run one of them under the method's
settings, its ``shared`` block applied by :func:`variant_params` as to its own variants.

    @VARIANTS.register("arbor")
    def build_arbor(ctx: VariantContext) -> VariantParts:
        return VariantParts(reward_fn=ArborReward(...), method=RubricMemory(...))

    params = variant_params(params, "dapo")   # what train_policy@dapo trains with (its method's or dapo's settings)
    parts = VARIANTS.get("dapo")(VariantContext(params, roles, toolbox, out_dir))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.agents.params import AgentParams
from components.method_registry import (
    SHARED_RECIPES,
    MethodSpec,
    load_methods,
    method_section,
    variant_method,
    variant_recipe,
)
from components.params import Params, with_method_settings
from components.registry import Registry
from components.rewards.outcome import outcome_reward
from components.rewards.overlong import OverlongShaping
from components.training.grpo.episodes import Episode, MethodState, RewardFn, RewardOutput, StepContext
from components.training.params import DAPOParams, GRPOParams

__all__ = ["BASELINE_RECIPES", "VARIANTS", "VariantContext", "VariantParts", "dapo_grpo", "drop_homogeneous_groups",
           "get_variant", "register_baselines", "variant_grpo", "variant_params"]

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
    return VariantParts(reward_fn=outcome_reward(ctx.params.grpo))


@VARIANTS.register("dapo")
def build_dapo(ctx: VariantContext) -> VariantParts:
    """DAPO (Yu et al. 2025), applied over ``grpo`` for this variant only: clip-higher (eps_low / eps_high), no KL
    term, token-mean loss, dynamic sampling (the trainer refills the step with fresh prompts until it holds
    ``grpo.prompts_per_step`` groups whose outcomes differ, at most ``dapo.max_num_gen_batches`` rounds) and overlong
    shaping (:mod:`components.rewards.overlong`). The builder: the outcome reward, homogeneous groups dropped by
    their outcome (verl's filter metric is the accuracy before the length penalty), then overlong shaping on the
    rest; the trainer refills the step.
    Its clipping, KL and loss aggregation are the grpo block :func:`variant_params` gave the run. The refill counts
    a group by its shaped scores, so a group whose outcomes differ but whose shaped scores tie (no advantage left)
    is refilled here, where verl keeps it in the batch with advantage 0."""
    d = ctx.params.dapo
    reward: RewardFn = drop_homogeneous_groups(outcome_reward(ctx.params.grpo))
    if d.overlong_buffer_tokens is not None:
        budget = dapo_max_response_tokens(ctx.params.dapo, ctx.params.agent)
        if d.overlong_buffer_tokens > budget:
            raise ValueError(f"dapo.overlong_buffer_tokens ({d.overlong_buffer_tokens}) exceeds the episode's budget "
                             f"L_max = {budget} (dapo.max_response_tokens, else agent.max_tokens x agent.max_turns)")
        reward = OverlongShaping(reward, max_tokens=budget, buffer_tokens=d.overlong_buffer_tokens,
                                 penalty_factor=d.overlong_penalty_factor)
    return VariantParts(reward_fn=reward, dynamic_sampling_max_rounds=d.max_num_gen_batches - 1)


def build_discard_homogeneous(ctx: VariantContext) -> VariantParts:
    """DAPO as ARBOR 4.1 describes its baseline (ARBOR's matched ``dapo_arbor``): outcome-homogeneous groups are
    discarded from the update, nothing else (no refill, no clip-higher, no length shaping; its clipping and KL are
    ARBOR's own, B.2: symmetric 0.2, KL 0)."""
    return VariantParts(reward_fn=drop_homogeneous_groups(outcome_reward(ctx.params.grpo)))


BASELINE_RECIPES: dict[str, Callable[[VariantContext], VariantParts]] = {
    "grpo": build_grpo, "dapo": build_dapo, "discard_homogeneous": build_discard_homogeneous}
"""The builders of :data:`components.method_registry.SHARED_RECIPES`: ``grpo`` and ``dapo`` train under these names,
and a method's matched baseline (:class:`components.method_registry.MatchedBaseline`) under its own."""
assert set(BASELINE_RECIPES) == set(SHARED_RECIPES)


def register_baselines(spec: MethodSpec) -> MethodSpec:
    """Register each matched baseline of ``spec`` that runs a shared recipe under its own name (a method's plugin
    calls this once, after registering its spec)."""
    for baseline in spec.baselines:
        if baseline.recipe is not None:
            VARIANTS.register(baseline.variant)(BASELINE_RECIPES[baseline.recipe])
    return spec


def dapo_grpo(grpo: GRPOParams, d: DAPOParams) -> GRPOParams:
    """``grpo`` with the ``dapo`` section's clipping, KL and loss aggregation (DAPO's objective, Eq. 8) and the
    released recipe's dual clip."""
    return GRPOParams.model_validate({**grpo.model_dump(), "clip_eps": d.clip_eps_low,
                                      "clip_eps_high": d.clip_eps_high, "kl_coef": d.kl_coef, "loss_agg": d.loss_agg,
                                      "dual_clip_c": d.dual_clip_c})


def dapo_max_response_tokens(d: DAPOParams, agent: AgentParams) -> int:
    """L_max of the overlong shaping: ``dapo.max_response_tokens``, else the most tokens the ReAct agent's turns
    can generate in an episode (``agent.max_tokens`` x ``agent.max_turns``: the rollout's cap, as DAPO's is)."""
    return d.max_response_tokens if d.max_response_tokens is not None else agent.max_tokens * agent.max_turns


def variant_params(params: Params, variant: str) -> Params:
    """The params ``train_policy@<variant>`` trains with: the ``shared`` block of the method whose settings it runs
    under (its own variants and its matched baselines alike: :func:`components.method_registry.variant_method`),
    then, for a variant of the ``dapo`` recipe, the ``dapo`` section over ``grpo``. ``grpo`` itself is untouched."""
    params = with_method_settings(params, method_section(variant_method(variant)))
    if SHARED_RECIPES.get(variant_recipe(variant) or "") == "dapo":
        params = params.model_copy(update={"grpo": dapo_grpo(params.grpo, params.dapo)})
    return params


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
