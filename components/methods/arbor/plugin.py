"""Registers ARBOR with the method registry: its ``train_policy`` variants (``arbor``, the memory-less
ablation ``arbor_no_memory``, and the RaR baseline ``rar`` it is compared with) and its params section."""

from components.method_registry import HealthMetric, MethodSpec
from components.methods.arbor import bench, variants  # noqa: F401  (their @VARIANTS / @BENCH registrations run on import)

SPEC = MethodSpec(name="arbor", sections=("arbor",), variants=("arbor", "arbor_no_memory", "rar"),
                  doc="docs/methods/arbor.md", health=(
                      HealthMetric("reward/groups", "groups"),
                      HealthMetric("reward/zero_var/base/all", "share of groups with zero outcome variance", "mean"),
                      HealthMetric("reward/rubric/drafts", "drafts induced"),
                      HealthMetric("method/admitted", "rubrics admitted"),
                      HealthMetric("method/rejected_low_variance", "drafts rejected for low variance"),
                      HealthMetric("reward/rubric/active", "active rubrics at the end", "last"),
                      HealthMetric("reward/zero_var/rescued_fraction", "rescued fraction", "mean"),
                      HealthMetric("reward/judge/calls", "judge calls"),
                      HealthMetric("reward/judge/failures", "failed judge calls"))).register()
