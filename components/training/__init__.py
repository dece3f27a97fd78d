"""The training engine every method shares, grouped by job: ``grpo/`` (the GRPO trainer, its advantages,
episodes and agent rollouts, a ``train_policy`` run's key), ``sft/`` (SFT examples, the SFT trainer, rows from
agent trajectories), ``engines/`` (the rollout engines: HF and vLLM, llama.cpp, their registry), ``speed/``
(int8 base, fused LoRA, prefix packing, memory release), and at the top what both trainers share: the LoRA
policy (``model``, ``device``, ``warm_started``, ``tiny``), token losses, the optimizer step, data
parallelism, checkpoints, prompt order and the sections of params.yaml. The package imports nothing, so
``import components.training`` never touches vLLM or DeepSpeed: import the modules directly. Why the loop is
ours rather than TRL's: the Training section of docs/architecture.md.
"""
