"""The one way every LLM judgment is made: a :class:`JudgeCall` (messages, sampling, an optional structured-output
schema, a parse function and an optional :class:`Choice` of labels) asked of a model with :func:`ask`, which returns
a :class:`Verdict` or a :class:`Failure` (``call_failed``, ``unparsed``) as a value and counts it in the caller's
:class:`~components.llm.accounting.Tally` (the type the middleware counts each role's calls in). A failure is
never a score: each caller drops, skips or falls back as its method says. A parser raises :class:`Unparsed` with
a one-line reason (or returns None); :func:`reasons` and :func:`model_parser` adapt other parsers. With a
``Choice``, a role that scores from probabilities (``llm.scoring``) gets ``expected``, the probability-weighted
value of the labels read at the label's first token and renormalised over the labels found (so labels must differ
in their first token), else the sampled label's value; ``Choice(every=True)`` reads a score sheet of many labels
into ``expected_each``.

    call = JudgeCall(messages, parse_winner, Sampling(temperature=0.0, max_tokens=32), schema=WINNER_SCHEMA,
                     choice=Choice({"A": 1.0, "B": 0.0, "TIE": 0.5}, field="winner"))
    result = await ask(judge, call, tally)
    if result.ok:
        use(result.value, result.expected)      # "TIE", 0.62 (say) when scored from probabilities
    else:
        log(result.kind, result.describe())     # "call_failed" / "unparsed", and why
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from components.llm.accounting import Tally
from components.llm.base import ChatModel, Message, Sampling, TokenLogprob
from components.llm.json_reply import first_json_object

__all__ = ["FAILURE_KINDS", "Choice", "Failure", "FailureKind", "JudgeCall", "Judgment", "ScoredFrom", "Tally",
           "Unparsed", "Verdict", "ask", "label_probabilities", "label_probabilities_each", "model_parser",
           "read_reply", "reasons", "scored_as"]

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


ScoredFrom = Literal["text", "probability"]


def scored_as(model: ChatModel, scoring: ScoredFrom | None) -> ChatModel:
    """``model`` with its choice judgments scored as a method's own setting says (``arbor.judge_scoring``,
    ``rubric_generator.evaluator_scoring``); None keeps its role's (``llm.scoring``). The pool builds a role's
    model afresh for each caller, so this changes no other user of the role."""
    if scoring is not None:
        model.scoring = scoring
    return model


@dataclass(frozen=True)
class Verdict(Generic[T]):
    """A judgment that gave a verdict: the parsed ``value``, the reply it came from and what the call cost. For a
    call with a :class:`Choice`, ``expected`` is what the answer is worth, ``scored_from`` how it was read and
    ``label_probs`` (probability scoring only) each label's renormalised probability; all None without one. A call
    whose choice has ``every`` gives ``expected_each`` (one value per label, in reply order) instead of ``expected``."""

    ok: ClassVar[bool] = True
    value: T
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    expected: float | None = None
    scored_from: ScoredFrom | None = None
    label_probs: Mapping[str, float] | None = None
    expected_each: tuple[float, ...] | None = None


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


_LEADING = " \t\r\n\"'`*"  # what may precede a label inside its token (blanks, quotes, emphasis)


@dataclass(frozen=True)
class Choice:
    """A judgment answered by one of a few labels: ``values`` maps each label to what it is worth, ``field`` names
    the JSON field whose value is the label (None: the label is the reply's first word), ``label`` gives the label
    of a parsed verdict (default ``str(verdict)``; labels match case-insensitively) and ``top_logprobs`` how many
    alternatives to ask for at each token when scoring from probabilities. With ``every`` the reply holds one
    label at each value (or array element, nested arrays too) of ``field``, and ``label`` returns a verdict's
    labels in reply order.

    Scored from probabilities, a label's probability is the summed probability of the alternatives at its position
    that begin it (case, leading blanks and quotes ignored), renormalised over the labels found; ``expected`` is the
    probability-weighted mean of their values (``scored_from="probability"``, ``label_probs``). A label of several
    tokens is read at its first token, so an alternative that could begin two labels counts for neither. Without
    usable probabilities (none from the backend, the label not found, or the token there not the parsed label)
    ``expected`` is the sampled label's value (``scored_from="text"``); with ``every`` the sheet is scored from
    probabilities only when every label is found where the verdict says."""

    values: Mapping[str, float]
    field: str | None = None
    label: Callable[[Any], Any] | None = None
    top_logprobs: int = 10
    every: bool = False

    def __post_init__(self) -> None:
        if self.every and (self.field is None or self.label is None):
            raise ValueError("a choice with every=True needs the field its labels sit in and a label function")

    def label_of(self, verdict: Any) -> str:
        """The declared label a parsed verdict stands for."""
        return self._declared((self.label or str)(verdict), verdict)

    def labels_of(self, verdict: Any) -> list[str]:
        """The declared labels of a parsed verdict of an ``every`` choice, in reply order."""
        return [self._declared(str(name), verdict) for name in self.label(verdict)]  # type: ignore[misc]

    def _declared(self, name: str, verdict: Any) -> str:
        for label in self.values:
            if label.casefold() == name.casefold():
                return label
        raise ValueError(f"verdict {verdict!r} reads as {name!r}, not one of the choice's labels {list(self.values)}")

    def locate_each(self, text: str) -> list[int]:
        """Where each label of an ``every`` choice begins in ``text``: after every ``"field":`` (inside an
        opening quote), or at each element of the array that follows it."""
        starts = []
        for match in re.finditer(rf'"{re.escape(self.field)}"\s*:\s*', text):  # type: ignore[arg-type]
            at = match.end()
            if text[at : at + 1] == "[":
                starts += _array_elements(text, at)
            elif at < len(text):
                starts.append(at + (text[at] == '"'))
        return starts

    def locate(self, text: str) -> int | None:
        """Where the label begins in ``text``: just inside the value of ``field`` (after an opening quote), or at
        the first letter or digit of the reply; None when there is no such place."""
        if self.field is None:
            match = re.search(r"[^\W_]", text)
            return match.start() if match else None
        match = re.search(rf'"{re.escape(self.field)}"\s*:\s*"?', text)
        return match.end() if match else None

    def match(self, token: str, lead: str = "") -> str | None:
        """The one label ``token`` begins (or is, followed by punctuation), after dropping ``lead`` (what the
        sampled token held before the label) or else leading blanks and quotes; None for none or several."""
        if lead and token.startswith(lead):
            token = token[len(lead):]
        piece = token.lstrip(_LEADING).casefold()
        if not piece:
            return None
        hits = [label for label in self.values if label.casefold().startswith(piece)
                or (piece.startswith(label.casefold()) and not piece[len(label.casefold()):][:1].isalnum())]
        return hits[0] if len(hits) == 1 else None


def _array_elements(text: str, at: int) -> list[int]:
    """Where each scalar element of the JSON array opening at ``text[at]`` begins (inside an opening quote),
    nested arrays included."""
    starts, depth, i, expect = [], 0, at, True
    while i < len(text):
        char = text[i]
        if char == "[":
            depth, expect = depth + 1, True
        elif char == "]":
            depth -= 1
            if depth == 0:
                break
        elif char == ",":
            expect = True
        elif expect and not char.isspace():
            starts.append(i + (char == '"'))
            expect = False
        i += 1
    return starts


def label_probabilities(choice: Choice, tokens: Sequence[TokenLogprob]) -> tuple[str, dict[str, float]] | None:
    """(the label sampled at the label's position, every label's probability renormalised over the labels) read
    from a reply's tokens, or None when the label's position or the sampled label cannot be found there. A label
    missing from the alternatives gets 0; alternatives that begin the same label add up."""
    start = choice.locate("".join(t.token for t in tokens))
    return None if start is None else _read_at(choice, tokens, start)


def label_probabilities_each(choice: Choice, tokens: Sequence[TokenLogprob]) -> list[tuple[str, dict[str, float]] | None]:
    """:func:`label_probabilities` at every label position of an ``every`` choice, in reply order."""
    return [_read_at(choice, tokens, start) for start in choice.locate_each("".join(t.token for t in tokens))]


def _read_at(choice: Choice, tokens: Sequence[TokenLogprob], start: int) -> tuple[str, dict[str, float]] | None:
    offset = 0
    for token in tokens:
        if offset + len(token.token) > start:
            break
        offset += len(token.token)
    else:
        return None
    lead = token.token[: start - offset]
    sampled = choice.match(token.token, lead)
    if sampled is None:
        return None
    alternatives = list(token.top)
    if token.token not in {t for t, _ in alternatives}:
        alternatives.append((token.token, token.logprob))
    mass = dict.fromkeys(choice.values, 0.0)
    for piece, logprob in alternatives:
        label = choice.match(piece, lead)
        if label is not None:
            mass[label] += math.exp(logprob)
    total = sum(mass.values())
    if not total > 0:
        return None
    return sampled, {label: p / total for label, p in mass.items()}


@dataclass(frozen=True)
class JudgeCall(Generic[T]):
    """One judgment to ask for. ``schema``, when given, is sent as ``Sampling.json_schema`` (structured output
    on backends that have it; the others ignore it); None leaves ``sampling`` as it is. ``choice``, when given,
    says which labels the answer picks from and what each is worth (scores from probabilities: :class:`Choice`)."""

    messages: Sequence[Message]
    parse: Callable[[str], T | None]
    sampling: Sampling = field(default_factory=Sampling)
    schema: dict[str, Any] | None = None
    choice: Choice | None = None

    def request_sampling(self, probabilities: bool = False) -> Sampling:
        """The sampling the model is sent (it is part of the response cache's key); with ``probabilities`` (and a
        choice) it also asks for the tokens' log-probabilities."""
        update: dict[str, Any] = {} if self.schema is None else {"json_schema": self.schema}
        if probabilities and self.choice is not None:
            update.update(logprobs=True, top_logprobs=self.choice.top_logprobs)
        return self.sampling.model_copy(update=update) if update else self.sampling


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


def scored(verdict: Verdict, choice: Choice, tokens: Sequence[TokenLogprob] | None) -> Verdict:
    """``verdict`` with its expected value: from ``tokens``' probabilities when they hold the parsed label at the
    label's position, else the sampled label's value."""
    if choice.every:
        return _scored_each(verdict, choice, tokens)
    label = choice.label_of(verdict.value)
    read = label_probabilities(choice, tokens) if tokens is not None else None
    if read is None or read[0] != label:
        return dataclasses.replace(verdict, expected=float(choice.values[label]), scored_from="text")
    probs = read[1]
    expected = sum(choice.values[name] * p for name, p in probs.items())
    return dataclasses.replace(verdict, expected=expected, scored_from="probability", label_probs=probs)


def _scored_each(verdict: Verdict, choice: Choice, tokens: Sequence[TokenLogprob] | None) -> Verdict:
    labels = choice.labels_of(verdict.value)
    reads = label_probabilities_each(choice, tokens) if tokens is not None else []
    if len(reads) != len(labels) or any(r is None or r[0] != label for r, label in zip(reads, labels)):
        return dataclasses.replace(verdict, expected_each=tuple(float(choice.values[x]) for x in labels),
                                   scored_from="text")
    each = tuple(sum(choice.values[name] * p for name, p in probs.items()) for _, probs in reads)  # type: ignore[misc]
    return dataclasses.replace(verdict, expected_each=each, scored_from="probability")


async def ask(model: ChatModel, call: JudgeCall[T], tally: Tally | None = None) -> Judgment:
    """Ask ``model`` for one judgment and count it in ``tally``. Nothing is raised for a failed call: a
    ``ChatFailure`` (after the middleware's retries) or an exception from an unwrapped backend comes back as a
    ``call_failed`` :class:`Failure`, a reply that does not parse as an ``unparsed`` one. A call with a
    :class:`Choice` asks for log-probabilities when ``model.scoring`` is ``"probability"`` and its verdict
    carries ``expected`` (:class:`Choice`); the model is told how each such verdict was scored."""
    probabilities = call.choice is not None and getattr(model, "scoring", "text") == "probability"
    try:
        outcome = await model.chat(list(call.messages), call.request_sampling(probabilities))
    except Exception as exc:  # noqa: BLE001 - a misbehaving backend is one failed judgment, not a crashed step
        result: Judgment = Failure("call_failed", str(exc), error_type=type(exc).__name__)
    else:
        if outcome.ok:
            result = read_reply(outcome.text, call.parse, prompt_tokens=outcome.prompt_tokens,
                                completion_tokens=outcome.completion_tokens, latency_s=outcome.latency_s)
            if result.ok and call.choice is not None:
                tokens = outcome.logprobs[0] if probabilities and outcome.logprobs else None
                result = scored(result, call.choice, tokens)
                if probabilities:
                    model.record_scoring(result.scored_from)
        else:
            result = Failure("call_failed", outcome.message, error_type=outcome.error_type,
                             latency_s=outcome.latency_s)
    if tally is not None:
        tally.record(result, probabilities)
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
