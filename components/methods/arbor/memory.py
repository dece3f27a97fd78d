"""ARBOR's rubric memory M = (D, P) and its lifecycle (paper 3.3, Table 4): admission of judged drafts into the
candidate pool D, consolidation into the common pool P with embedding de-duplication, activation statistics,
retirement, capacity replacement, active selection and snapshots, as :class:`RubricMemory` describes. A plain state
machine fed with judged scores: it makes no LLM call (the consolidation text comes from
:func:`components.methods.arbor.induction.consolidate`) and embeds only through the injected ``embed`` callable.

    memory = RubricMemory(params.arbor, embed=my_embed)
    active = memory.choose_active()
    events = memory.apply_step(step, [r.id for r in active], records)
    if memory.needs_consolidation():
        memory.consolidate(new_rubrics, step)
    json.dumps(memory.state_dict())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.methods.arbor.params import ArborParams
from components.schemas import Criterion, Rubric

__all__ = [
    "AdmissionResult",
    "CommonRubric",
    "ConsolidationEvents",
    "Draft",
    "GroupRecord",
    "PearsonStats",
    "RubricMemory",
    "RubricText",
    "StepEvents",
    "admission",
    "pearson",
    "variance",
]

Embed = Callable[[list[str]], np.ndarray]
FORMAT_VERSION = 1


class RubricText(BaseModel):
    """A natural-language process rubric: what a strong trajectory does and what a weak one does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(min_length=1, description="Short label.")
    description: str = Field(min_length=1, description="What a high-scoring trajectory does.")
    counter_description: str = Field(min_length=1, description="What a low-scoring trajectory does.")

    def embedding_text(self) -> str:
        return f"{self.title}. {self.description}"

    def as_criterion(self) -> Criterion:
        """This rubric in the shared type: its two ends in one checkable sentence, a process criterion."""
        return Criterion(text=f"{self.title}: {self.description} (weak: {self.counter_description})",
                         kind="process")


class PearsonStats(BaseModel):
    """Running sums of (x = rubric score, y = F1) pairs, enough for their Pearson correlation."""

    model_config = ConfigDict(extra="forbid")

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    syy: float = 0.0
    sxy: float = 0.0

    def add(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        for x, y in zip(xs, ys, strict=True):
            self.n += 1
            self.sx += x
            self.sy += y
            self.sxx += x * x
            self.syy += y * y
            self.sxy += x * y

    @property
    def value(self) -> float | None:
        if self.n < 2:
            return None
        vx = self.sxx / self.n - (self.sx / self.n) ** 2
        vy = self.syy / self.n - (self.sy / self.n) ** 2
        if vx <= 1e-12 or vy <= 1e-12:
            return None
        cov = self.sxy / self.n - (self.sx / self.n) * (self.sy / self.n)
        return max(-1.0, min(1.0, cov / math.sqrt(vx * vy)))


def variance(values: Sequence[float]) -> float:
    """Population variance (0 for fewer than two values)."""
    return float(np.var(values)) if len(values) >= 2 else 0.0


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation, ``None`` when either side is constant or has fewer than two values."""
    stats = PearsonStats()
    stats.add(xs, ys)
    return stats.value


def _scored(scores: Sequence[float | None], f1: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(s, y) for s, y in zip(scores, f1, strict=True) if s is not None]
    return [s for s, _ in pairs], [y for _, y in pairs]


def admission(scores: Sequence[float | None], f1: Sequence[float], delta_v: float, rho_min: float) -> AdmissionResult:
    """Whether a draft with these scores on its source group passes the admission conditions."""
    xs, ys = _scored(scores, f1)
    if len(xs) < 2:
        return AdmissionResult(False, "unscored", 0.0, None)
    var, rho = variance(xs), pearson(xs, ys)
    if var < delta_v:
        return AdmissionResult(False, "low_variance", var, rho)
    if rho is not None and rho < rho_min:
        return AdmissionResult(False, "low_correlation", var, rho)
    return AdmissionResult(True, "admitted", var, rho)


class Draft(BaseModel):
    """A query-local rubric admitted to the candidate pool D."""

    model_config = ConfigDict(extra="forbid")

    id: str
    rubric: RubricText
    question_id: str
    question: str
    step: int
    variance: float
    pearson: float | None


class CommonRubric(BaseModel):
    """A rubric of the common pool P with its activation statistics."""

    model_config = ConfigDict(extra="forbid")

    id: str
    rubric: RubricText
    created_step: int
    sources: list[str] = Field(default_factory=list, description="Draft ids the consolidation saw.")
    uses: int = Field(default=0, description="Activations: query-groups scored under it.")
    last_used_step: int = Field(default=0, description="Last step it was active (0: never).")
    low_var_streak: int = Field(default=0, description="n_r: consecutive steps whose groups' mean within-group "
                                "variance under it was < delta_v.")
    variance_sum: float = Field(default=0.0, description="Cumulative within-group variance: the sum over its "
                                "activations, which the capacity rule ranks on (3.3).")
    corr: PearsonStats = Field(default_factory=PearsonStats, description="Cumulative (score, F1) sums.")
    retired_step: int | None = None
    retired_reason: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_missing_variance_sum(cls, data: Any) -> Any:
        """An entry without ``variance_sum`` (see the module's snapshot rule): ``uses`` x pooled score variance."""
        if not isinstance(data, dict) or "variance_sum" in data:
            return data
        corr = PearsonStats.model_validate(data.get("corr") or {})
        pooled = max(0.0, corr.sxx / corr.n - (corr.sx / corr.n) ** 2) if corr.n >= 2 else 0.0
        return {**data, "variance_sum": int(data.get("uses", 0)) * pooled}

    @property
    def rho(self) -> float | None:
        return self.corr.value

    @property
    def cumulative_variance(self) -> float:
        return self.variance_sum

    @property
    def mean_variance(self) -> float:
        return self.variance_sum / self.uses if self.uses else 0.0


@dataclass
class GroupRecord:
    """What one query-group of a step contributes to the memory."""

    question_id: str
    question: str
    f1: list[float]  # format-gated F1 per trajectory
    activations: dict[str, list[float | None]] = field(default_factory=dict)  # common rubric id -> scores
    drafts: list[tuple[RubricText, list[float | None]]] = field(default_factory=list)  # induced, judged


@dataclass
class AdmissionResult:
    admitted: bool
    reason: str  # admitted, unscored, low_variance, low_correlation
    variance: float
    pearson: float | None


@dataclass
class StepEvents:
    admitted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    activations: int = 0
    retired: list[tuple[str, str]] = field(default_factory=list)  # (id, reason)


@dataclass
class ConsolidationEvents:
    added: list[str] = field(default_factory=list)
    duplicates: int = 0
    replaced: list[str] = field(default_factory=list)
    dropped_full: int = 0


class RubricMemory:
    """M = (D, P) plus the retired rubrics (kept for audit and reuse statistics).

    - Admission: a draft scored on its group enters D when its within-group population variance >= ``delta_v``
      and its Pearson correlation with F1 >= ``rho_min`` (fewer than two scored trajectories: rejected; F1
      constant over the group: judged on variance alone).
    - Consolidation: once |D| >= ``k_consol`` the caller asks the consolidator; :meth:`consolidate` drops each
      new rubric whose embedding has cosine >= ``dedup_threshold`` with one in P (or accepted earlier in the
      batch), writes the rest into P and clears D.
    - Activation statistics (an activation: one group scored under a common rubric): uses, the cumulative
      within-group variance (``variance_sum``) and the cumulative Pearson rho_r over every (score, F1) pair.
      The consecutive low-variance count n_r counts steps (ARBOR activates two rubrics a step, and kappa = 5
      tolerates five of them): a step adds one when the mean within-group variance of the groups it scored under
      the rubric is below ``delta_v``, and a step at or above resets it. Counted per group, a 32-prompt batch (the
      paper's) would retire any rubric that leaves six groups in a row flat, inside its first step.
    - Retirement: n_r > ``kappa`` (the (kappa+1)-th consecutive low-variance step), or rho_r < ``rho_min`` once
      defined.
    - Capacity: with |P| = ``max_common`` a new rubric replaces the mature rubric (at least
      ``maturity_activations`` activations, default kappa) with the lowest cumulative variance, the older on a
      tie, as 3.3 specifies; with none mature the new rubric is dropped and counted.
    - Snapshots keep ``variance_sum``; an entry without it is loaded with ``uses`` x the pooled variance of its
      scores, never below the true sum with equal group sizes (so replaced later, if anything).
    - Active selection (``active_rubrics`` a step): the highest rho_r (undefined last, then the oldest), then the
      least recently used (never used first; equal recency: higher rho_r)."""

    def __init__(self, settings: ArborParams, embed: Embed | None = None):
        self.settings = settings
        self.embed = embed
        self.drafts: list[Draft] = []
        self.common: list[CommonRubric] = []
        self.retired: list[CommonRubric] = []
        self.next_id = 1
        self.totals = {"admitted": 0, "consolidations": 0, "retired": 0, "replaced": 0, "duplicates": 0}

    def _new_id(self, prefix: str) -> str:
        out = f"{prefix}{self.next_id}"
        self.next_id += 1
        return out

    def get(self, rubric_id: str) -> CommonRubric:
        for r in self.common:
            if r.id == rubric_id:
                return r
        raise KeyError(f"no common rubric {rubric_id!r} in P (have {[r.id for r in self.common]})")

    # ---------------------------------------------------------------- selection
    def _by_strength(self) -> list[CommonRubric]:
        order = {r.id: i for i, r in enumerate(self.common)}
        return sorted(self.common, key=lambda r: (r.rho is None, -(r.rho or 0.0), order[r.id]))

    def choose_active(self) -> list[CommonRubric]:
        """The rubrics to activate this step (empty P: none, the step keeps the base reward)."""
        ranked = self._by_strength()
        if not ranked:
            return []
        rank = {r.id: i for i, r in enumerate(ranked)}
        rest = sorted(ranked[1:], key=lambda r: (r.last_used_step, rank[r.id]))
        return [ranked[0]] + rest[: self.settings.active_rubrics - 1]

    # ---------------------------------------------------------------- admission and activations
    def admission(self, scores: Sequence[float | None], f1: Sequence[float]) -> AdmissionResult:
        return admission(scores, f1, self.settings.delta_v, self.settings.rho_min)

    def record_activation(self, rubric_id: str, scores: Sequence[float | None], f1: Sequence[float]) -> float | None:
        """Add one group's scores under a common rubric to its statistics: their within-group variance, None when
        nothing was scored (the low-variance count is the step's: :meth:`record_step`)."""
        rubric = self.get(rubric_id)
        xs, ys = _scored(scores, f1)
        if not xs:
            return None
        var = variance(xs)
        rubric.uses += 1
        rubric.variance_sum += var
        rubric.corr.add(xs, ys)
        return var

    def record_step(self, rubric_id: str, variances: Sequence[float]) -> None:
        """One step's low-variance count for a rubric from the variances of the groups it scored (none: no change)."""
        if variances:
            rubric = self.get(rubric_id)
            low = sum(variances) / len(variances) < self.settings.delta_v
            rubric.low_var_streak = rubric.low_var_streak + 1 if low else 0

    def retirement_reason(self, rubric: CommonRubric) -> str | None:
        if rubric.low_var_streak > self.settings.kappa:
            return "low_variance"
        rho = rubric.rho
        if rho is not None and rho < self.settings.rho_min:
            return "low_correlation"
        return None

    def _retire(self, rubric: CommonRubric, step: int, reason: str) -> None:
        self.common = [r for r in self.common if r.id != rubric.id]
        rubric.retired_step, rubric.retired_reason = step, reason
        self.retired.append(rubric)

    def apply_step(self, step: int, active_ids: Sequence[str], records: Sequence[GroupRecord]) -> StepEvents:
        """One step's lifecycle: mark the active rubrics used, record their activations, retire, admit drafts."""
        events = StepEvents()
        for rubric_id in active_ids:
            self.get(rubric_id).last_used_step = step
        variances: dict[str, list[float]] = {}
        for record in records:
            for rubric_id, scores in record.activations.items():
                var = self.record_activation(rubric_id, scores, record.f1)
                if var is not None:
                    variances.setdefault(rubric_id, []).append(var)
                    events.activations += 1
        for rubric_id, found in variances.items():
            self.record_step(rubric_id, found)
        for rubric in list(self.common):
            reason = self.retirement_reason(rubric)
            if reason is not None:
                self._retire(rubric, step, reason)
                events.retired.append((rubric.id, reason))
        for record in records:
            for text, scores in record.drafts:
                result = self.admission(scores, record.f1)
                if result.admitted:
                    self.drafts.append(Draft(id=self._new_id("d"), rubric=text, question_id=record.question_id,
                                             question=record.question, step=step, variance=result.variance,
                                             pearson=result.pearson))
                    events.admitted += 1
                else:
                    events.rejected[result.reason] = events.rejected.get(result.reason, 0) + 1
        self.totals["admitted"] += events.admitted
        self.totals["retired"] += len(events.retired)
        return events

    # ---------------------------------------------------------------- consolidation
    def needs_consolidation(self) -> bool:
        return len(self.drafts) >= self.settings.k_consol

    def _duplicates(self, new: Sequence[RubricText]) -> list[bool]:
        """Per new rubric: cosine >= threshold with one in P or with an earlier new one that is kept."""
        if not new:
            return []
        if self.embed is None:
            raise ValueError("RubricMemory.embed is not set: consolidation needs an embedder for de-duplication")
        existing = [r.rubric.embedding_text() for r in self.common]
        vecs = np.asarray(self.embed(existing + [r.embedding_text() for r in new]), dtype=np.float64)
        vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        kept = list(range(len(existing)))
        out = []
        for k in range(len(new)):
            row = len(existing) + k
            dup = bool(kept) and float(np.max(vecs[kept] @ vecs[row])) >= self.settings.dedup_threshold
            out.append(dup)
            if not dup:
                kept.append(row)
        return out

    def consolidate(self, new: Sequence[RubricText], step: int) -> ConsolidationEvents:
        """Write the consolidator's rubrics into P (de-duplicated, within capacity) and clear D."""
        events = ConsolidationEvents()
        sources = [d.id for d in self.drafts]
        for text, dup in zip(new, self._duplicates(new), strict=True):
            if dup:
                events.duplicates += 1
                continue
            if len(self.common) >= self.settings.max_common:
                mature = [r for r in self.common if r.uses >= self.settings.maturity_activations]
                if not mature:
                    events.dropped_full += 1
                    continue
                victim = min(mature, key=lambda r: (r.cumulative_variance, r.created_step))
                self._retire(victim, step, "replaced")
                events.replaced.append(victim.id)
            rubric = CommonRubric(id=self._new_id("c"), rubric=text, created_step=step, sources=sources)
            self.common.append(rubric)
            events.added.append(rubric.id)
        self.drafts = []
        self.totals["consolidations"] += 1
        self.totals["replaced"] += len(events.replaced)
        self.totals["duplicates"] += events.duplicates
        return events

    # ---------------------------------------------------------------- metrics and state
    def rubrics(self) -> list[Rubric]:
        """The memory in the shared rubric type: the common pool P (strongest first, each rubric
        one criterion) and the candidate pool D."""
        pools = [Rubric(id=f"P:{r.id}", criteria=[r.rubric.as_criterion()],
                        source=f"arbor common pool P (uses {r.uses}, created at step {r.created_step})")
                 for r in self._by_strength()]
        pools += [Rubric(id=f"D:{d.id}", criteria=[d.rubric.as_criterion()],
                         source=f"arbor candidate pool D (question {d.question_id})") for d in self.drafts]
        return pools

    def metrics(self) -> dict[str, float]:
        """Sizes, lifetime totals and reuse concentration (share of activations held by the top 20%)."""
        uses = sorted((r.uses for r in self.common + self.retired), reverse=True)
        total = sum(uses)
        top = max(1, math.ceil(0.2 * len(uses))) if uses else 0
        out = {"memory/drafts": float(len(self.drafts)), "memory/common": float(len(self.common)),
               "memory/retired": float(len(self.retired)), "memory/uses_total": float(total),
               "memory/uses_max": float(uses[0]) if uses else 0.0,
               "memory/top20_use_share": sum(uses[:top]) / total if total else 0.0}
        out.update({f"memory/total_{k}": float(v) for k, v in self.totals.items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "next_id": self.next_id, "totals": dict(self.totals),
                "drafts": [d.model_dump(mode="json") for d in self.drafts],
                "common": [r.model_dump(mode="json") for r in self.common],
                "retired": [r.model_dump(mode="json") for r in self.retired]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if state.get("version") != FORMAT_VERSION:
            raise ValueError(f"rubric memory state: version {state.get('version')!r}, expected {FORMAT_VERSION}")
        self.next_id = int(state["next_id"])
        self.totals = {**self.totals, **state["totals"]}
        self.drafts = [Draft.model_validate(d) for d in state["drafts"]]
        self.common = [CommonRubric.model_validate(r) for r in state["common"]]
        self.retired = [CommonRubric.model_validate(r) for r in state["retired"]]
