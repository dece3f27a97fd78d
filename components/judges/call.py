"""The one way every LLM judgment is made: a :class:`JudgeCall` (prompt messages, sampling, an optional
structured-output schema, a parse function) asked of a model with :func:`ask`, which returns either a
:class:`Verdict` (the parsed value) or a :class:`Failure` (why there is none) as a value. A failure is never a
score: each caller drops, skips or falls back as its method says.

A parse function takes the reply text and returns the verdict. When the reply is not a valid verdict it raises
:class:`Unparsed` with a one-line reason (or returns None, for parsers with nothing to say about why).
:func:`reasons` adapts a parser that returns its reason as a string instead, and :func:`model_parser` makes one
from a pydantic model.

A :class:`Tally` counts one caller's (or role's) calls, tokens and failures by kind; :func:`ask` adds to it.

    call = JudgeCall(messages, parse_winner, Sampling(temperature=0.0, max_tokens=32), schema=WINNER_SCHEMA)
    result = await ask(judge, call, tally)
    if result.ok:
        use(result.value)
    else:
        log(result.kind, result.describe())     # "call_failed" / "unparsed", and why
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from components.llm.base import ChatModel, Message, Sampling
from components.llm.json_reply import first_json_object

__all__ = ["FAILURE_KINDS", "Failure", "FailureKind", "JudgeCall", "Judgment", "Tally", "Unparsed", "Verdict",
           "ask", "model_parser", "read_reply", "reasons"]

T = TypeVar("T")

FailureKind = Literal["call_failed", "unparsed"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("call_failed", "unparsed")
"""``call_failed``: the model gave no reply (it failed after the middleware's retries, or the backend raised);
``unparsed``: it replied, but the reply is not a valid verdict."""


class Unparsed(ValueError):
    """Raised by a parse function for a reply that is not a valid verdict. ``reason`` says why in one line;
    ``partial`` keeps whatever the caller still wants from the reply (the council keeps a judge's rationale)."""

    def __init__(self, reason: str, partial: Any = None):
        super().__init__(reason)
        self.reason, self.partial = reason, partial


@dataclass(frozen=True)
class Verdict(Generic[T]):
    """A judgment that gave a verdict: the parsed ``value``, the reply it came from and what the call cost."""

    ok: ClassVar[bool] = True
    value: T
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


@dataclass(frozen=True)
class Failure:
    """A judgment that gave no verdict. For ``call_failed``, ``reason`` is the last error's message and
    ``error_type`` its class name; for ``unparsed``, ``reason`` is what the parser found wrong, ``reply`` the
    reply and ``partial`` what the parser kept of it. Tokens are those of the reply (0 when the call failed)."""

    ok: ClassVar[bool] = False
    kind: FailureKind
    reason: str
    error_type: str | None = None
    reply: str | None = None
    partial: Any = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    def describe(self) -> str:
        """``<ErrorType>: <message>`` for a failed call, the parser's reason for an unparsed reply."""
        return f"{self.error_type}: {self.reason}" if self.kind == "call_failed" else self.reason


Judgment = Verdict[T] | Failure


@dataclass(frozen=True)
class JudgeCall(Generic[T]):
    """One judgment to ask for. ``schema``, when given, is sent as ``Sampling.json_schema`` (structured output
    on backends that have it; the others ignore it); None leaves ``sampling`` as it is."""

    messages: Sequence[Message]
    parse: Callable[[str], T | None]
    sampling: Sampling = field(default_factory=Sampling)
    schema: dict[str, Any] | None = None

    def request_sampling(self) -> Sampling:
        """The sampling the model is sent (it is part of the response cache's key)."""
        return self.sampling if self.schema is None else self.sampling.model_copy(update={"json_schema": self.schema})


@dataclass
class Tally:
    """One caller's (or role's) count of its judgment calls; the middleware keeps its own count per role.
    ``failures`` are calls that failed, ``unparsed`` replies that were not a valid verdict."""

    calls: int = 0
    failures: int = 0
    unparsed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def record(self, result: Judgment) -> None:
        self.calls += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        if not result.ok:
            if result.kind == "call_failed":
                self.failures += 1
            else:
                self.unparsed += 1

    def merge(self, other: Tally) -> None:
        for name in ("calls", "failures", "unparsed", "prompt_tokens", "completion_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def by_kind(self) -> dict[str, int]:
        """Failed judgments by kind (every kind listed, zeros included)."""
        return {"call_failed": self.failures, "unparsed": self.unparsed}

    @property
    def failed(self) -> int:
        """Judgments without a verdict, of any kind."""
        return self.failures + self.unparsed

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def read_reply(text: str, parse: Callable[[str], T | None], *, prompt_tokens: int = 0, completion_tokens: int = 0,
               latency_s: float = 0.0) -> Judgment:
    """A reply text judged by ``parse``: its :class:`Verdict`, or an ``unparsed`` :class:`Failure`."""
    cost = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "latency_s": latency_s}
    try:
        value = parse(text)
    except Unparsed as exc:
        return Failure("unparsed", exc.reason, reply=text, partial=exc.partial, **cost)
    if value is None:
        return Failure("unparsed", "the reply is not a valid verdict", reply=text, **cost)
    return Verdict(value, text, **cost)


async def ask(model: ChatModel, call: JudgeCall[T], tally: Tally | None = None) -> Judgment:
    """Ask ``model`` for one judgment and count it in ``tally``. Nothing is raised for a failed call: a
    ``ChatFailure`` (after the middleware's retries) or an exception from an unwrapped backend comes back as a
    ``call_failed`` :class:`Failure`, a reply that does not parse as an ``unparsed`` one."""
    try:
        outcome = await model.chat(list(call.messages), call.request_sampling())
    except Exception as exc:  # noqa: BLE001 - a misbehaving backend is one failed judgment, not a crashed step
        result: Judgment = Failure("call_failed", str(exc), error_type=type(exc).__name__)
    else:
        if outcome.ok:
            result = read_reply(outcome.text, call.parse, prompt_tokens=outcome.prompt_tokens,
                                completion_tokens=outcome.completion_tokens, latency_s=outcome.latency_s)
        else:
            result = Failure("call_failed", outcome.message, error_type=outcome.error_type,
                             latency_s=outcome.latency_s)
    if tally is not None:
        tally.record(result)
    return result


def reasons(parse: Callable[[str], T | str]) -> Callable[[str], T]:
    """A parse function from one that returns a one-line reason (a ``str``) for a reply it cannot use."""
    def strict(text: str) -> T:
        value = parse(text)
        if isinstance(value, str):
            raise Unparsed(value)
        return value

    return strict


def model_parser(model: type[BaseModel]) -> Callable[[str], BaseModel]:
    """A parse function for a reply that is one JSON object of ``model``'s shape: the first JSON object of the
    reply, validated. Reasons: ``no JSON object in the reply``, or ``<field path>: <pydantic's message>`` for
    the first field that breaks the schema."""
    def parse(text: str) -> BaseModel:
        obj = first_json_object(text)
        if obj is None:
            raise Unparsed("no JSON object in the reply")
        try:
            return model.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise Unparsed(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None

    return parse
