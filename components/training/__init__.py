"""The training engine every method shares: the GRPO trainer (``trainer``) with its losses and advantages, SFT
(``sft_trainer``, ``trajectory_sft``), the rollout engines (``rollout``: HF and vLLM; ``llamacpp_engine``) and agent
rollouts, LoRA models and their speed options (``model``, ``int8_base``, ``fused_lora``, ``prefix_pack``),
checkpoints and a run's key. The package imports nothing, so ``import components.training`` stays cheap and never
touches vLLM or DeepSpeed: import its modules directly. Why the loop is ours rather than TRL's: the Training section
of docs/architecture.md.
"""
