"""Speed options of a training step: an int8 frozen base, a fused LoRA forward, shared-prefix packing, and
releasing freed memory between phases."""
