"""Policy-gradient engine shared by every method: GRPO / SS-GRPO / ARCO losses, SFT with span masking,
rollout engines, LoRA policies, atomic checkpoints and a small GRPO loop.

Modules (import from them directly; this package imports nothing, so ``import components.training``
stays cheap and never touches vLLM or DeepSpeed):

- ``advantages``: group-relative advantages, broadcast per sequence or per segment onto tokens
  (SS-GRPO stage returns with RubricEM's Lambda belong to ``components.rewards``).
- ``losses``: clipped surrogate, k3 KL, loss aggregation; all per token ``[B, T]`` with a loss mask.
- ``sft``: ``(text, trainable)`` segments -> ids + loss mask; masked cross-entropy.
- ``rollout``: ``RolloutSegment`` / ``assemble`` for multi-turn tool rollouts; ``HFRolloutEngine`` (CPU),
  ``VLLMRolloutEngine`` (GPU, LoRA hot-swap, lazy import).
- ``model``: load a causal LM (folder, GGUF, or object), LoRA via peft or full fine-tuning, frozen reference.
- ``checkpoint``: weights, optimizer, scheduler, RNG, data position, metrics and method state, atomically.
- ``trainer``: ``GRPOTrainer``;  ``prompts``: resumable seeded prompt order.
- ``distributed``: DeepSpeed ZeRO-2/3 config dicts (also as ``deepspeed/zero2.json``, ``zero3.json``);
  ``stepper``: the optimizer step of both trainers, plain torch or ZeRO through accelerate.
- ``tiny``: character tokenizer and a tiny random Qwen2 for tests and benchmarks.

Decision: own the loop rather than build on TRL's ``GRPOTrainer``.
We need three things TRL's trainer does not give cleanly: (1) advantages per token, so SS-GRPO (one value
per stage block) and ARCO (one value per step) use the same loss; TRL computes one scalar advantage per
completion inside ``_generate_and_score_completions``; (2) multi-turn tool rollouts whose observation
tokens are context but get no gradient, assembled from the exact sampled ids; TRL's rollout is one
completion per prompt (tool support and ``rollout_func`` hooks exist in recent versions but are
experimental and change between releases); (3) method state (rubric memories, judge buffers, banks)
saved in the same atomic checkpoint as weights, optimizer, RNG and data position, so a resume continues
exactly; TRL defers to ``transformers.Trainer`` checkpointing, which knows nothing of that state and
whose data-loader position is approximate. Owning the loop costs ~300 lines (``trainer.py``), removes a
fast-moving dependency (TRL is not installed here), and keeps every line of the objective testable against
hand-computed numbers. What we give up: TRL's vLLM server mode, liger kernels and its multi-GPU plumbing;
``VLLMRolloutEngine`` and ``stepper.DeepSpeedStepper`` (ZeRO-2/3 through accelerate) cover the GPU path instead.
"""
