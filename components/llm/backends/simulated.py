"""``simulated`` backend: a judge that answers from the world's oracle, with a quality dial, for the lab only
(``--overlay lab``), never a default. It reads a judgment's prompt as a real judge would: the first registered
:class:`JudgmentKind` whose ``matches`` accepts the messages reads the oracle's verdict from it (a
:class:`Judgment`), the dial acts on it (:func:`dialled`) and the kind writes it in the reply format its caller
parses; a prompt no kind recognises fails permanently (``PermanentLLMError``, a ``call_failed`` judgment: never a
score). The kinds live where the prompts are defined (``components.lab.judges``); the backend imports the module
named by ``kinds_module`` when it is built, the registries' dotted-path escape hatch, so this shared layer never
imports a method.

    judge = SimulatedJudge.from_params(params)          # params.lab.judge is the dial, the lab world the oracle
    judge = SimulatedJudge(oracle, Dial(flip_rate=0.2))
"""

from __future__ import annotations

import hashlib
import importlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.llm.base import BACKENDS, ChatModel, Completion, Message, PermanentLLMError, Sampling
from components.registry import Registry
from components.schemas import Question

__all__ = ["KINDS", "Dial", "Judgment", "JudgmentKind", "Oracle", "Ranking", "Score", "SimulatedJudge", "dialled"]


@dataclass(frozen=True)
class Dial:
    """The judge's quality (``params.lab.judge``; see the module doc)."""

    flip_rate: float = 0.0
    position_bias: float = 0.0
    bias: str = "none"
    bias_rate: float = 0.0
    keyword: str = "certainly"
    seed: int = 0


@dataclass
class Oracle:
    """The questions a judge may be asked about, found by their text in a prompt (longest match first)."""

    questions: list[Question] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_text = {}
        self.add(self.questions)

    def add(self, questions: Iterable[Question]) -> None:
        for q in questions:
            self._by_text.setdefault(" ".join(q.question.split()), q)
        self._order = sorted(self._by_text, key=len, reverse=True)

    def find(self, text: str) -> Question | None:
        text = " ".join(text.split())
        return next((self._by_text[t] for t in self._order if t in text), None)


@dataclass(frozen=True)
class Score:
    """A graded verdict: ``value`` on the scale ``low`` .. ``high`` (a flip mirrors it)."""

    value: float
    low: float
    high: float

    def mirrored(self) -> Score:
        return Score(self.low + self.high - self.value, self.low, self.high)


@dataclass(frozen=True)
class Ranking:
    """A ranking of the shown candidates: tie groups of their shown positions, best first."""

    groups: tuple[tuple[int, ...], ...]

    @classmethod
    def by(cls, values: Sequence[float]) -> Ranking:
        """Shown positions ordered by ``values``, highest first, equal values tied."""
        return cls(tuple(tuple(i for i, v in enumerate(values) if v == level)
                         for level in sorted(set(values), reverse=True)))


Verdict = bool | str | Score | Ranking


@dataclass(frozen=True)
class Judgment:
    """What a kind read from one prompt: the oracle's verdict (a bool for a yes/no or correct/incorrect judgment, and
    for a written one True for the oracle's checklist, rubrics or criteria and False for the worse ones a flip
    writes; "A" / "B" / "TIE" for a pairwise one; a :class:`Score` or a :class:`Ranking`), the reply writer, and
    what the dial's biases need:
    ``attempts`` (the texts shown, in order; one for a single-attempt judgment), ``about`` (the index of the
    attempt a yes/no or a score is about, when several are shown) and ``gold_turns`` (the turns the gold chain
    needs). A reply of several verdicts has ``parts`` (one judgment each, dialled on its own; ``truth`` is then
    the tuple of theirs) and its writer gets the tuple of their dialled verdicts."""

    truth: Verdict | tuple
    write: Callable[[Any], str]
    attempts: Sequence[str] = ()
    about: int | None = None
    gold_turns: int = 0
    parts: Sequence[Judgment] = ()

    @classmethod
    def of(cls, parts: Sequence[Judgment], write: Callable[[tuple], str]) -> Judgment:
        return cls(tuple(p.truth for p in parts), write, parts=tuple(parts))


@dataclass(frozen=True)
class JudgmentKind:
    name: str
    matches: Callable[[list[Message]], bool]
    read: Callable[[list[Message], Oracle], Judgment]


KINDS: Registry[JudgmentKind] = Registry("simulated judgment kind")


def _coin(dial: Dial, key: str, what: str) -> float:
    digest = hashlib.sha256(f"{dial.seed}:{what}:{key}".encode()).digest()
    return random.Random(digest).random()


def _favoured(dial: Dial, text: str) -> float:
    return float(dial.keyword.casefold() in text.casefold()) if dial.bias == "keyword" else float(len(text))


def _biased(j: Judgment, dial: Dial) -> Verdict:
    """The systematic bias's verdict."""
    if isinstance(j.truth, Ranking):
        return Ranking.by([_favoured(dial, t) for t in j.attempts])
    if isinstance(j.truth, str):  # pairwise: the favoured attempt wins
        a, b = (_favoured(dial, t) for t in j.attempts[:2])
        return "A" if a > b else "B" if b > a else "TIE"
    text = j.attempts[0 if j.about is None else j.about] if j.attempts else ""
    if dial.bias == "keyword":
        passes = dial.keyword.casefold() in text.casefold()
    else:
        passes = text.count("\nTurn ") + text.startswith("Turn ") > j.gold_turns if j.gold_turns else len(text) > 400
    return _top_or_bottom(j.truth, passes)


def _top_or_bottom(truth: Verdict, passes: bool) -> Verdict:
    return (Score(truth.high if passes else truth.low, truth.low, truth.high) if isinstance(truth, Score)
            else passes)


def _first_shown(j: Judgment, verdict: Verdict) -> Verdict:
    if isinstance(verdict, Ranking):
        return Ranking(tuple((i,) for i in range(len(j.attempts))))
    return "A" if isinstance(verdict, str) else _top_or_bottom(verdict, j.about == 0)


def _flipped(verdict: Verdict) -> Verdict:
    if isinstance(verdict, Ranking):
        return Ranking(verdict.groups[::-1])
    if isinstance(verdict, Score):
        return verdict.mirrored()
    return {"A": "B", "B": "A", "TIE": "TIE"}[verdict] if isinstance(verdict, str) else not verdict


def dialled(j: Judgment, dial: Dial, key: str) -> Verdict | tuple:
    """The verdict after the dial; a judgment of parts gives the tuple of its parts' verdicts, each dialled on its
    own. The dial acts in this order, each with its own coin (a function of the dial's seed, the prompt's ``key``
    and the part, so the same prompt gets the same verdict, as from a cached temperature-0 judge):

    - ``bias_rate``: the systematic ``bias`` decides instead of the oracle (``length``: the longer attempt wins, one
      attempt alone passes when it is longer than its gold chain needs; ``keyword``: the attempt or answer that
      writes ``keyword`` wins and passes; a ranking orders by it, a passing score is the scale's top, a failing one
      its bottom; a judgment that shows no attempt, such as a checklist written from the question alone, has none
      to favour);
    - ``position_bias``: a judgment that shows two attempts or more picks the first one shown ("A"; a yes/no or a
      score about the first is yes or the top, about another no or the bottom; a ranking is the order shown);
    - ``flip_rate``: the verdict is inverted (yes <-> no, A <-> B, a TIE stays a TIE; a score mirrored on its
      scale; a ranking reversed).
    """
    if isinstance(j.truth, tuple):  # a judgment of parts (perhaps none: a checklist of no criteria)
        return tuple(dialled(p, dial, f"{key}:{i}") for i, p in enumerate(j.parts))
    verdict = j.truth
    if dial.bias != "none" and j.attempts and _coin(dial, key, "bias") < dial.bias_rate:
        verdict = _biased(j, dial)  # a bias needs attempts to favour one of
    if len(j.attempts) >= 2 and _coin(dial, key, "position") < dial.position_bias:
        verdict = _first_shown(j, verdict)
    if _coin(dial, key, "flip") < dial.flip_rate:
        verdict = _flipped(verdict)
    return verdict


@BACKENDS.register("simulated")
class SimulatedJudge(ChatModel):
    def __init__(self, oracle: Oracle, dial: Dial | None = None, name: str = "simulated",
                 kinds_module: str | None = "components.lab.judges"):
        if kinds_module:
            importlib.import_module(kinds_module)  # registers the kinds it defines
        self.oracle, self.dial, self.name = oracle, dial or Dial(), name
        self.identity = f"{name}@{hashlib.sha256(repr(self.dial).encode()).hexdigest()[:12]}"
        self.asked: dict[str, int] = {}

    @classmethod
    def from_params(cls, params: Any, name: str = "simulated", options: dict | None = None) -> SimulatedJudge:
        """The judge of a run: ``params.lab.judge`` is the dial; the oracle knows the lab world's questions and the
        run's own prepared splits (``components.lab.judges.run_questions``)."""
        module = (options or {}).get("kinds_module", "components.lab.judges")
        kinds = importlib.import_module(module)
        return cls(Oracle(kinds.run_questions(params)), Dial(**params.lab.judge.model_dump()), name=name,
                   kinds_module=None)

    def judgment(self, messages: list[Message]) -> tuple[str, Judgment]:
        for kind_name in KINDS.names():
            kind = KINDS.get(kind_name)
            if kind.matches(messages):
                return kind_name, kind.read(messages, self.oracle)
        raise PermanentLLMError("simulated judge: no oracle for this judgment (a kind not simulated yet)")

    def reply(self, messages: list[Message]) -> str:
        kind, j = self.judgment(messages)
        self.asked[kind] = self.asked.get(kind, 0) + 1
        key = hashlib.sha256("\x00".join(f"{m.role}:{m.content}" for m in messages).encode()).hexdigest()
        return j.write(dialled(j, self.dial, key))

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        text = self.reply(messages)
        return Completion(texts=[text] * sampling.n, model=self.name, finish_reasons=["stop"] * sampling.n,
                          prompt_tokens=sum(len(m.content.split()) for m in messages),
                          completion_tokens=len(text.split()) * sampling.n)
