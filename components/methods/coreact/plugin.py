"""Registers Co-ReAct with the method registry: its agents (the inject-verify-retry agent, the four baselines
with the rubric plug-in) and its params sections. Co-ReAct trains a rubric generator, not the policy, so it
registers no ``train_policy`` variant; its health figures are those of the generator's training runs
(``train_rubric_generator@<reward>``: metrics.csv a step, metrics.json at the end), which the head-to-head report
shows beside every method that serves that generator."""

from components.method_registry import HealthMetric, MethodSpec
from components.methods.coreact import agent, baselines, bench  # noqa: F401  (their @AGENTS / bench registrations run on import)

SPEC = MethodSpec(name="coreact", sections=("coreact", "rubric_generator", "collect"),
                  agents=("coreact", "self_refine", "step_back", "critic", "best_of_n"),
                  doc="docs/methods/coreact.md",
                  health=(HealthMetric("points_train", "training points", "final"),
                          HealthMetric("points_held_out", "held-out points", "final"),
                          HealthMetric("reward/rho_mean", "training rho", "mean"),
                          HealthMetric("reward/flat_rate", "training flat rate", "mean"),
                          HealthMetric("reward/evaluator/failures", "failed evaluator calls"),
                          HealthMetric("heldout_before.spearman_with_unparsed", "held-out rho before (greedy)", "final"),
                          HealthMetric("heldout_after.spearman_with_unparsed", "held-out rho after (greedy)", "final"),
                          HealthMetric("heldout_change_unparsed_as_chance.delta_mean", "held-out rho change (per point, greedy and sampled)", "final"),
                          HealthMetric("heldout_after.flat_rate", "held-out flat rate after (greedy)", "final"))).register()
