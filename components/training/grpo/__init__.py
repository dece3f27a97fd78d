"""GRPO: the trainer every method trains through, its group advantages, the episode contract between a
rollout, a reward and a method, multi-turn agent rollouts, and what a ``train_policy@<variant>`` run is (its
key)."""
