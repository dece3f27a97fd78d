"""The rollout engines a policy in training samples through: HF and vLLM (``rollout``, with the segment
record a batch is assembled from), llama.cpp (``llamacpp``), the base folder vLLM loads (``vllm_base``), and
the registry of the engines ``train_policy.engine`` names (``registry``)."""
