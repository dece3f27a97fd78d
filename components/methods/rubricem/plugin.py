"""Registers RubricEM with the method registry: the scaffold agent, its warm start (sft_data_scaffold ->
sft_scaffold) and its format (the oracle's turns in the scaffold's tags, B.2's rejection checks), its
``train_policy`` variants (the full method and its ablations), its matched baseline (5's Baseline-RL, "standard
answer-only GRPO" from the same SFT checkpoint under the same 600-step configuration: ``scaffold_grpo``,
answer-only GRPO through the scaffold) and its params section."""

import random

from components.method_registry import HealthMetric, MatchedBaseline, MethodSpec
from components.methods.rubricem import bench, scaffold_agent, variants  # noqa: F401  (registrations run on import)
from components.methods.rubricem.scaffold_format import scaffold_rejections
from components.methods.rubricem.scaffold_oracle import scaffold_replies
from components.warmstart.formats import FORMATS, WarmStartFormat

SPEC = MethodSpec(name="rubricem", sections=("rubricem",),
                  variants=("ss_grpo", "meta_policy", "rubricem"), agents=("scaffold",), warm_start="sft_scaffold",
                  baselines=(MatchedBaseline("scaffold_grpo", of="grpo", reads=("scaffold_max_tokens",)),),
                  mechanism=("reward_fn", "advantage_fn", "method", "agent_options", "order_prompts"),
                  doc="docs/methods/rubricem.md", health=(
                      HealthMetric("reward/judge/scoring_calls", "stage-judge calls"),
                      HealthMetric("reward/judge/flat_groups", "flat groups"),
                      HealthMetric("reward/judge/position_spread", "position spread", "mean"),
                      HealthMetric("reward/judge/attempt_spread", "attempt spread", "mean"),
                      HealthMetric("reward/judge/scoring_failures", "failed stage-judge calls"),
                      HealthMetric("method/reflection/valid_fraction", "valid reflections (fraction)", "mean"),
                      HealthMetric("method/bank/size", "rubric bank size at the end", "last"))).register()

FORMATS.register("scaffold")(WarmStartFormat(
    replies=lambda question, turns: scaffold_replies(question, turns, random.Random(f"scaffold:{question.id}")),
    problems=scaffold_rejections))
