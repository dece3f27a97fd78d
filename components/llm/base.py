"""The one interface every LLM role goes through: ``ChatModel``.

A backend implements ``_complete`` for a single request (one conversation, ``n`` samples) and raises
``TransientLLMError`` (worth retrying: 429, 5xx, timeouts, dropped connections, malformed bodies) or
``PermanentLLMError`` (not worth retrying: 400, 401, 403, 404, bad configuration). Callers never see
exceptions from ``chat``: the middleware (``components.llm.middleware``) returns either a
``ChatResult`` or a ``ChatFailure``. A failure is data, counted per role; it is never a score.

    model = build_role(params, "answer_judge")            # components.llm.factory
    out = await model.chat([Message(role="user", content="Hi")], Sampling(max_tokens=16))
    if out.ok: print(out.text)
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.registry import Registry


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant", "tool"] = Field(description="Chat role.")
    content: str = Field(description="Message text.")


class Sampling(BaseModel):
    """Decoding parameters of one request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=0.0, ge=0, le=2, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling.")
    max_tokens: int = Field(default=256, ge=1, description="Completion token limit.")
    stop: tuple[str, ...] = Field(default=(), description="Stop strings.")
    seed: int | None = Field(default=None, description="Sampling seed; makes a sampled call reproducible.")
    n: int = Field(default=1, ge=1, description="Samples for the same conversation.")
    json_schema: dict[str, Any] | None = Field(
        default=None, description="JSON schema the output must follow (structured output) where supported."
    )
    logprobs: bool = Field(
        default=False, description="Ask for each generated token's log-probability (backends that have them; "
        "the others answer without). Part of the cache key only when set.")
    top_logprobs: int = Field(
        default=0, ge=0, le=20, description="With logprobs: how many of the most likely tokens to report at each "
        "position. Part of the cache key only when set.")

    @property
    def deterministic(self) -> bool:
        """Whether the same request must give the same answer (so a cached answer is valid)."""
        return self.temperature == 0 or self.seed is not None


class TokenLogprob(BaseModel):
    """One generated token as the server reported it: its text, its log-probability, and the most likely tokens
    at its position as (text, log-probability) pairs, most likely first (the chosen token is usually among them).
    Probabilities are the model's before sampling (llama.cpp's server and vLLM report them so by default)."""

    model_config = ConfigDict(frozen=True)

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


Logprobs = list[list[TokenLogprob]]
"""Per sample, its tokens in order."""


class ChatResult(BaseModel):
    """A successful call: ``n`` completions plus accounting."""

    ok: Literal[True] = True
    texts: list[str] = Field(description="One completion per sample.")
    model: str = Field(description="Model that answered.")
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    finish_reasons: list[str] = Field(default_factory=list)
    latency_s: float = Field(default=0.0, ge=0)
    attempts: int = Field(default=1, ge=1, description="Tries it took, retries included.")
    cached: bool = Field(default=False, description="Served from the response cache.")
    logprobs: Logprobs | None = Field(
        default=None, description="Per sample, its tokens with their log-probabilities; None when they were not "
        "asked for or the backend has none.")

    @property
    def text(self) -> str:
        return self.texts[0]


class ChatFailure(BaseModel):
    """A call that failed after its retries; callers skip, drop or fall back, never score it 0."""

    ok: Literal[False] = False
    error_type: str = Field(description="Exception class name of the last error.")
    message: str = Field(description="Last error message.")
    status_code: int | None = Field(default=None, description="HTTP status when there was one.")
    transient: bool = Field(description="Whether the last error was of a retryable kind.")
    attempts: int = Field(ge=1, description="Tries made.")
    latency_s: float = Field(default=0.0, ge=0)


ChatOutcome = ChatResult | ChatFailure


class LLMError(Exception):
    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class TransientLLMError(LLMError):
    """Retry may help: rate limits, server errors, timeouts, connection problems, malformed bodies."""


class PermanentLLMError(LLMError):
    """Retry will not help: bad request, authentication, unknown model, misconfiguration."""


def classify_status(status: int) -> type[LLMError]:
    return TransientLLMError if status == 429 or status == 408 or status >= 500 else PermanentLLMError


class Completion(BaseModel):
    """What a backend returns for one request, before middleware adds timing and attempts."""

    texts: list[str]
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: list[str] = Field(default_factory=list)
    logprobs: Logprobs | None = None  # per sample; None: not asked for, or the backend has none


@dataclass
class PolicyCall:
    """How one policy call of an agent episode counts for training; backends that do not train ignore it.

    The agent creates it, passes it to ``chat(..., call=...)`` and may change it after the reply, since a
    draft is known to be rejected only once it has been verified. ``kind`` names the call (``turn``,
    ``draft``, ``forced_answer``, ``verify``...); ``trainable`` False keeps the reply as context only (no
    loss); ``segment`` is the stage/step id of the whole reply (None: the episode's turn index);
    ``spans`` splits the reply by character offset into segments, ``[(0, 0), (57, 1)]`` = the first 57
    characters belong to segment 0, the rest to segment 1 (one reply may close a stage and open the next).
    """

    kind: str = "turn"
    trainable: bool = True
    segment: int | None = None
    spans: list[tuple[int, int]] | None = None


class ChatModel(abc.ABC):
    """A backend. Subclasses implement ``_complete``; everyone else calls ``chat`` / ``chat_batch``."""

    name: str = "model"
    identity: str | None = None  # overrides the cache identity, e.g. name plus weights checksum
    # how a judgment that declares a choice (components.judges.call.Choice) is scored when asked of this model:
    # from the sampled text, or from its answer tokens' probabilities; LLMPool sets it per role (llm.scoring)
    scoring: Literal["text", "probability"] = "text"

    @abc.abstractmethod
    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        """One request; raise TransientLLMError / PermanentLLMError on failure."""

    def cache_identity(self) -> str:
        """What identifies this model in the response-cache key (model name plus anything that
        changes its output, such as a weights checksum)."""
        return self.identity or self.name

    async def _complete_call(self, messages: list[Message], sampling: Sampling, call: PolicyCall | None) -> Completion:
        """``_complete`` with the call's training tag; only models that train (an episode's policy) read it."""
        return await self._complete(messages, sampling)

    async def chat(self, messages: list[Message], sampling: Sampling | None = None, *,
                   call: PolicyCall | None = None) -> ChatOutcome:
        """Unwrapped call (no retries): a failure is still returned, not raised."""
        sampling = sampling or Sampling()
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            c = await self._complete_call(list(messages), sampling, call)
        except LLMError as exc:
            return ChatFailure(
                error_type=type(exc).__name__, message=str(exc), status_code=exc.status_code,
                transient=isinstance(exc, TransientLLMError), attempts=1, latency_s=loop.time() - start,
            )
        return ChatResult(
            texts=c.texts, model=c.model, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
            finish_reasons=c.finish_reasons, latency_s=loop.time() - start, logprobs=c.logprobs,
        )

    async def chat_batch(
        self, conversations: list[list[Message]], sampling: Sampling | None = None
    ) -> list[ChatOutcome]:
        """Many conversations concurrently (the middleware bounds the concurrency)."""
        return list(await asyncio.gather(*(self.chat(c, sampling) for c in conversations)))

    def record_scoring(self, scored_from: str) -> None:
        """Told by the judge interface how a judgment asked for with probabilities was scored ("probability" or
        "text"); the middleware counts it per role, a bare backend ignores it."""

    def chat_sync(self, messages: list[Message], sampling: Sampling | None = None) -> ChatOutcome:
        return asyncio.run(self.chat(messages, sampling))

    async def aclose(self) -> None:
        """Release connections or processes."""


BACKENDS: Registry[type[ChatModel]] = Registry("llm backend")


def user(content: str) -> Message:
    return Message(role="user", content=content)


def system(content: str) -> Message:
    return Message(role="system", content=content)


def assistant(content: str) -> Message:
    return Message(role="assistant", content=content)
