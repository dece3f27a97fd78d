"""The judge bench's seam: a registry of *bench judgments*, each one judgment a method (or the shared answer
judge) makes, described well enough for ``scripts/judge_bench.py`` to ask it of the oracle-labelled trajectory
set and score it, without the bench importing any method package.

A :class:`BenchJudgment` says which role answers it, how to cut the trajectory set into units (one unit is one
judgment: one prompt, or the few calls that make one verdict), how to ask one unit of a model, and how to
summarise the rows against the oracle. It also says which modes it has:

- ``text``: the judge's sampled answer, params as given;
- ``probability``: the same call with the role scoring from token probabilities (``llm.scoring``), only for a
  judgment whose answer is a label choice (``choice=True``);
- ``reference``: text scoring with the gold answer and gold facts shown to the judge, only for a judgment whose
  method's judge may see them (``reference="mode"``); ``reference_note`` says why, or why not, per judgment.

Each method registers its own from ``components/methods/<m>/bench.py``, imported by its ``plugin.py``; the
shared answer judge registers from :mod:`components.judges.bench.answer`. :func:`load_judgments` imports both.
A judgment a method makes that the bench cannot ask registers a :class:`BenchGap` with the reason instead.

    from components.judges.bench.registry import BENCH, load_judgments
    load_judgments()
    BENCH.get("arbor_pairwise").modes(["text", "probability", "reference"])   # the modes it is asked in
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from components.judges.call import Tally
from components.llm.base import ChatModel
from components.registry import Registry

__all__ = ["BENCH", "GAPS", "MODES", "BenchGap", "BenchJudgment", "Context", "Unit", "load_gaps", "load_judgments"]

MODES = ("text", "probability", "reference")
Reference = Literal["mode", "always", "never"]


@dataclass(frozen=True)
class Unit:
    """One judgment to ask: ``id`` (unique within the judgment), ``slate`` (the question it belongs to),
    ``data`` (what the judgment's ``ask`` needs) and ``label`` (the oracle's fields, copied into its rows)."""

    id: str
    slate: str
    data: Any
    label: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What one ask gets besides the model and the unit: whether the reference is shown, the tally to count its
    calls in, the params, and a cache the judgment may keep per (mode) across units (RaR's checklist per
    question)."""

    reference: bool
    tally: Tally
    params: Any
    cache: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchJudgment:
    """One judgment the bench can ask (module doc). ``ask(model, unit, context)`` returns the row's verdict
    fields (a failed judgment says so in them; it never raises for a bad reply); ``summary(rows, seed)`` gives
    the metrics of one mode's rows; ``per_variant(rows)``, when given, one cell per perturbation."""

    name: str
    method: str  # the method it belongs to ("shared" for the answer judge)
    role: Callable[[Any], str]  # params -> the llm role that answers it
    units: Callable[[Sequence[Any], Any], list[Unit]]  # (trajectory set items, params) -> units
    ask: Callable[[ChatModel, Unit, Context], Awaitable[dict[str, Any]]]
    summary: Callable[[Sequence[dict[str, Any]], int], dict[str, Any]]
    choice: bool = False
    reference: Reference = "never"
    reference_note: str = ""
    doc: str = ""
    per_variant: Callable[[Sequence[dict[str, Any]]], dict[str, str]] | None = None
    only_modes: tuple[str, ...] | None = None  # a run's narrowing of the modes (None: every mode it has)
    scoring_key: str | None = None  # the method's own params key for text/probability (None: llm.scoring, by role)

    def modes(self, asked: Sequence[str]) -> list[str]:
        """The modes of ``asked`` this judgment has (text always; probability with a choice; reference when its
        method's judge may see the reference)."""
        unknown = [m for m in asked if m not in MODES]
        if unknown:
            raise ValueError(f"unknown bench mode {unknown[0]!r}; known: {', '.join(MODES)}")
        return [m for m in asked if (m == "text" or (m == "probability" and self.choice)
                                     or (m == "reference" and self.reference == "mode"))
                and (self.only_modes is None or m in self.only_modes)]

    def register(self) -> BenchJudgment:
        return BENCH.register(self.name)(self)


BENCH: Registry[BenchJudgment] = Registry("bench judgment")


@dataclass(frozen=True)
class BenchGap:
    """A judgment a method makes that the bench does not ask, and why (the results page lists them)."""

    name: str
    method: str
    reason: str

    def register(self) -> BenchGap:
        return GAPS.register(self.name)(self)


GAPS: Registry[BenchGap] = Registry("bench gap")


def load_judgments() -> list[BenchJudgment]:
    """Register every bench judgment: the shared answer judge's and each shipped method's (their plugins import
    their ``bench`` modules); returns them in registration-name order."""
    from components.method_registry import load_methods

    importlib.import_module("components.judges.bench.answer")
    load_methods()
    return [BENCH.get(name) for name in BENCH.names()]


def load_gaps() -> list[BenchGap]:
    """The judgments the methods declare the bench does not ask (after :func:`load_judgments`' imports)."""
    load_judgments()
    return [GAPS.get(name) for name in GAPS.names()]
