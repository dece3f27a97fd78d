"""Backend implementations; importing this package registers the ones whose imports are light.
gemini, hf, llamacpp and vllm import their heavy libraries only when a model is built."""

from components.llm.backends import gemini, hf, llamacpp, openai_http, scripted, simulated, vllm_engine  # noqa: F401
