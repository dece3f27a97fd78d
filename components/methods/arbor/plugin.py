"""Registers ARBOR with the method registry: its ``train_policy`` variants (``arbor``, the memory-less
ablation ``arbor_no_memory``, and the RaR baseline ``rar`` it is compared with) and its params section."""

from components.method_registry import MethodSpec
from components.methods.arbor import bench, variants  # noqa: F401  (their @VARIANTS / @BENCH registrations run on import)

SPEC = MethodSpec(name="arbor", sections=("arbor",), variants=("arbor", "arbor_no_memory", "rar"),
                  doc="docs/methods/arbor.md").register()
