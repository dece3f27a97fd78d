"""Registers Co-ReAct with the method registry: its agents (the inject-verify-retry agent, the four baselines
with the rubric plug-in) and its params sections. Co-ReAct trains a rubric generator, not the policy, so it
registers no ``train_policy`` variant."""

from components.method_registry import MethodSpec
from components.methods.coreact import agent, baselines, bench  # noqa: F401  (their @AGENTS / bench registrations run on import)

SPEC = MethodSpec(name="coreact", sections=("coreact", "rubric_generator", "collect"),
                  agents=("coreact", "self_refine", "step_back", "critic", "best_of_n"),
                  doc="docs/methods/coreact.md").register()
