"""Registers ARCO with the method registry: its ``train_policy`` variants (co-evolved, frozen rubric model,
no decomposition loss) and its params section."""

from components.method_registry import HealthMetric, MethodSpec
from components.methods.arco import bench, variants  # noqa: F401  (their @VARIANTS / bench registrations run on import)

SPEC = MethodSpec(name="arco", sections=("arco",), variants=("arco", "arco_frozen", "arco_no_decomp"),
                  doc="docs/methods/arco.md", health=(
                      HealthMetric("method/policy_dense", "steps on mu's step rewards"),
                      HealthMetric("method/teacher/annotated", "trajectories the teacher annotated", "last"),
                      HealthMetric("method/teacher/failures", "failed teacher calls"),
                      HealthMetric("method/mu/updates", "mu's co-evolution updates", "last"))).register()
