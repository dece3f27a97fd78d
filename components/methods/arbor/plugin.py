"""Registers ARBOR with the method registry: its ``train_policy`` variants (``arbor``, the memory-less
ablation ``arbor_no_memory``, and the RaR baseline ``rar`` it is compared with), its matched baselines (4.1: GRPO
and DAPO, which "discards outcome-homogeneous query-groups from policy updates", both under B.2's settings) and
its params section."""

from components.method_registry import HealthMetric, MatchedBaseline, MethodSpec
from components.methods.arbor import bench, variants  # noqa: F401  (their @VARIANTS / @BENCH registrations run on import)
from components.variants import register_baselines

SPEC = MethodSpec(name="arbor", sections=("arbor",), variants=("arbor", "arbor_no_memory", "rar"),
                  baselines=(MatchedBaseline("grpo_arbor", of="grpo", recipe="grpo"),
                             MatchedBaseline("dapo_arbor", of="dapo", recipe="discard_homogeneous")),
                  mechanism=("reward_fn", "method"),
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
register_baselines(SPEC)  # grpo_arbor / dapo_arbor train the shared recipes under their own names
