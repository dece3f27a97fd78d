"""LLM access for every role: the ``ChatModel`` interface (base), backends, reliability middleware and the
role factory. See ``components.llm.factory.LLMPool`` for the entry point."""

from components.llm.base import (  # noqa: F401
    BACKENDS, ChatFailure, ChatModel, ChatOutcome, ChatResult, Message, PermanentLLMError, Sampling,
    TransientLLMError, assistant, system, user,
)
