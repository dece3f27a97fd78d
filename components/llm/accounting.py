"""One count of model calls, tokens and failures, :class:`Tally`: the middleware keeps one per role in the run's
:class:`Accounting` (logged as ``llm.<role>.<count>``) and counts each chat call there (retries, cache hits, cost,
latency, failures by type, log-probabilities asked and missing); :func:`components.judges.call.ask` counts each
judgment in its caller's tally (``unparsed`` replies, how verdicts were scored), which methods log under their own
names (``reward/judge/calls``, ``evaluator/tokens``). Run its tests with
``.venv/bin/python -m pytest -q tests/llm/test_accounting.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Accounting", "Tally"]

# what a role reports as llm.<role>.<name> (metrics.csv columns and MLflow keys: renaming one changes the results)
_ROLE_METRICS = ("calls", "successes", "failures", "retries", "cache_hits", "prompt_tokens", "completion_tokens",
                 "cost", "latency_s")
_LOGPROB_METRICS = ("logprob_calls", "logprob_missing", "scored_from_probability", "scored_from_text")


@dataclass
class Tally:
    """Calls and what they cost. ``failures`` are calls that gave no reply (after the middleware's retries),
    ``unparsed`` judgments whose reply was not a valid verdict. Verdicts of judgments with a choice count as
    ``scored_from_probability`` or ``scored_from_text``; ``probability_asked`` counts the verdicts whose call asked
    for probabilities, ``logprob_calls`` the answered chat calls that asked and ``logprob_missing`` those of them
    answered without."""

    calls: int = 0
    successes: int = 0
    failures: int = 0
    unparsed: int = 0
    retries: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_s: float = 0.0
    failures_by_type: Counter = field(default_factory=Counter)
    logprob_calls: int = 0
    logprob_missing: int = 0
    scored_from_probability: int = 0
    scored_from_text: int = 0
    probability_asked: int = 0

    def answered(self, prompt_tokens: int, completion_tokens: int, *, retries: int = 0, cost: float = 0.0,
                 latency_s: float = 0.0) -> None:
        """A chat call that got its reply (its ``calls`` is counted when it starts)."""
        self.successes += 1
        self.retries += retries
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cost += cost
        self.latency_s += latency_s

    def call_failed(self, error_type: str, *, retries: int = 0, latency_s: float = 0.0) -> None:
        """A chat call that gave no reply after its retries."""
        self.failures += 1
        self.failures_by_type[error_type] += 1
        self.retries += retries
        self.latency_s += latency_s

    def chat(self, outcome: Any) -> None:
        """One chat outcome (``ChatResult`` or ``ChatFailure``) seen by a caller, counted whole."""
        self.calls += 1
        if outcome.ok:
            self.answered(outcome.prompt_tokens, outcome.completion_tokens)
        else:
            self.call_failed(outcome.error_type)

    def record_scoring(self, scored_from: str) -> None:
        """A choice verdict asked for with probabilities, scored from them or from the text."""
        if scored_from == "probability":
            self.scored_from_probability += 1
        else:
            self.scored_from_text += 1

    def record(self, result: Any, probability_asked: bool = False) -> None:
        """One judgment (a ``Verdict`` or a ``Failure`` of :mod:`components.judges.call`)."""
        self.calls += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        if not result.ok:
            if result.kind == "call_failed":
                self.failures += 1
            else:
                self.unparsed += 1
        elif result.scored_from is not None:
            self.probability_asked += probability_asked
            self.record_scoring(result.scored_from)

    def merge(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def scoring(self) -> dict[str, int]:
        """How the verdicts were scored, once any asked for probabilities (empty otherwise, so text-scored runs
        report what they always did): ``scored_from_probability``, ``scored_from_text``."""
        if not self.probability_asked:
            return {}
        return {"scored_from_probability": self.scored_from_probability, "scored_from_text": self.scored_from_text}

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

    @property
    def failure_rate(self) -> float:
        return self.failures / self.calls if self.calls else 0.0

    def as_metrics(self, prefix: str) -> dict[str, float]:
        """A role's counts as ``<prefix>.<name>``; the log-probability counts only for a role that asked for them."""
        out = {f"{prefix}.{k}": float(getattr(self, k)) for k in _ROLE_METRICS}
        out[f"{prefix}.failure_rate"] = self.failure_rate
        if self.logprob_calls:
            out.update({f"{prefix}.{k}": float(getattr(self, k)) for k in _LOGPROB_METRICS})
        return out


class Accounting:
    """Per-role tallies shared by all wrapped models of a run."""

    def __init__(self) -> None:
        self.roles: dict[str, Tally] = {}

    def for_role(self, role: str) -> Tally:
        return self.roles.setdefault(role, Tally())

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, stats in sorted(self.roles.items()):
            out.update(stats.as_metrics(f"llm.{role}"))
        return out
