"""Registers RubricEM with the method registry: the scaffold agent and its warm-start format (the oracle's
turns in the scaffold's tags, B.2's rejection checks), its ``train_policy`` variants (the full method and its
ablations) and its params section."""

import random

from components.method_registry import HealthMetric, MethodSpec
from components.methods.rubricem import bench, scaffold_agent, variants  # noqa: F401  (registrations run on import)
from components.methods.rubricem.scaffold_format import scaffold_rejections
from components.methods.rubricem.scaffold_oracle import scaffold_replies
from components.warmstart.formats import FORMATS, WarmStartFormat

SPEC = MethodSpec(name="rubricem", sections=("rubricem",),
                  variants=("scaffold_grpo", "ss_grpo", "meta_policy", "rubricem"), agents=("scaffold",),
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
