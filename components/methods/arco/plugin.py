"""Registers ARCO with the method registry: its ``train_policy`` variants (co-evolved, frozen rubric model,
no decomposition loss), its matched baseline (the outcome-reward GRPO it is compared with, under its settings)
and its params section."""

from components.method_registry import HealthMetric, MatchedBaseline, MethodSpec
from components.methods.arco import bench, variants  # noqa: F401  (their @VARIANTS / bench registrations run on import)
from components.variants import register_baselines

SPEC = MethodSpec(name="arco", sections=("arco",), variants=("arco", "arco_frozen", "arco_no_decomp"),
                  baselines=(MatchedBaseline("grpo_arco", of="grpo", recipe="grpo"),),
                  mechanism=("reward_fn", "advantage_fn", "method"),
                  doc="docs/methods/arco.md", health=(
                      HealthMetric("method/policy_dense", "steps on mu's step rewards"),
                      HealthMetric("method/teacher/annotated", "trajectories the teacher annotated", "last"),
                      HealthMetric("method/teacher/failures", "failed teacher calls"),
                      HealthMetric("method/mu/updates", "mu's co-evolution updates", "last"))).register()
register_baselines(SPEC)  # grpo_arco trains the shared grpo recipe under its own name
