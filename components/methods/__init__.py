"""Policy-training variants: what each method plugs into the one GRPO trainer (reward, advantages, method
state, loss hook, rollout agent). See :mod:`components.methods.variants`."""
