"""RubricEM's stagewise evolving-rubric judge (paper 3.3, appendix C): per-question rubric buffers (persistent
rubrics, here the answer stage's reference check scored as token F1 without an LLM, and active rubrics per stage
proposed online), adaptive rubric generation by contrasting a rollout group, 0/1/2 scoring into per-stage
weighted scores, and pruning (:meth:`StagewiseJudge.judge_groups` gives the order; why the embedded default scores
a group side by side: docs/methods/rubricem.md).

    judge = StagewiseJudge(generator=pool.role("rubric_evaluator"), evaluator=pool.role("rubric_evaluator"))
    results, metrics = asyncio.run(judge.judge_groups([(question, [traj1, traj2, ...])], step=3))
    results[0][1].scores        # [R_plan, R_research, R_review, R_answer], any of them None
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from components.clipping import clip_middle
from components.evaluation.metrics import f1_score
from components.judges.call import Choice, Failure, JudgeCall, Tally, Unparsed, ask, model_parser
from components.judges.orders import balanced_orders, letter
from components.judges.render import scaffold_text, untrusted
from components.llm.base import ChatModel, Message, Sampling
from components.llm.json_schema import json_schema_of, one_item_per_key
from components.methods.rubricem.scaffold_format import ANSWER, STAGES, self_rubrics, split_stages
from components.schemas import Criterion, Question, Rubric, Trajectory

__all__ = ["SCORING_MODES", "JudgeResult", "QuestionBuffer", "StageRubric", "StagewiseJudge"]

SCORING_MODES = ("trajectory", "group")

STAGE_NAMES = ("Plan", "Research", "Review", "Answer")
STAGE_PURPOSE = (
    ("did the agent understand the question: its hops, hidden constraints, a specific checklist, a plan in "
     "proportion to the task?"),
    ("did it search well and adapt: specific queries, following the new names results give, pivoting on "
     "evidence, stopping once the facts are settled, no repeated lookups?"),
    "did it audit honestly: each fact mapped to a document, gaps admitted, the answer derived from the evidence?",
    "is the final answer right, precise and backed by the evidence found? Judge it on its own.",
)


# ------------------------------------------------------------------------------ records and buffers


class StageRubric(BaseModel):
    """One judge-side rubric of one stage."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Stable id within the question's buffer.")
    stage: int = Field(ge=0, le=3, description="0 plan, 1 research, 2 review, 3 answer.")
    title: str = Field(description="Short name.")
    description: str = Field(description="What the scorer checks.")
    weight: float = Field(gt=0, description="1 minor, 2 important, 3 critical (persistent rubrics may differ).")
    negative: bool = Field(default=False, description="A flaw: scored like a positive one, inverted when aggregated.")
    persistent: bool = Field(default=False, description="From the training data; never pruned.")
    kind: Literal["judge", "answer_f1"] = Field(default="judge", description="Scored by the LLM, or as token F1.")
    created_step: int = Field(default=0, ge=0, description="Training step that added it.")

    def value(self, score: float) -> float:
        """A 0-2 score (an expectation when read from probabilities) as a value in [0, 1], negatives inverted."""
        return 1.0 - score / 2 if self.negative else score / 2

    def as_criterion(self) -> Criterion:
        """This rubric in the shared type, keeping its stage, weight and polarity."""
        kind = "answer_f1" if self.kind == "answer_f1" else "negative" if self.negative else "judge"
        return Criterion(text=f"{self.title}: {self.description}", weight=self.weight, kind=kind, stage=self.stage)


class QuestionBuffer(BaseModel):
    """A question's persistent rubrics and its active rubrics per stage."""

    question_id: str
    persistent: list[StageRubric] = Field(default_factory=list)
    active: list[list[StageRubric]] = Field(default_factory=lambda: [[] for _ in STAGES])
    counter: int = 0

    def as_rubric(self) -> Rubric:
        """The question's buffer in the shared rubric type: every persistent and active rubric, by stage."""
        return Rubric(id=self.question_id, criteria=[r.as_criterion() for r in self.rubrics()],
                      source=f"rubricem stagewise judge buffer (question {self.question_id})")

    def rubrics(self, stage: int | None = None) -> list[StageRubric]:
        every = self.persistent + [r for per_stage in self.active for r in per_stage]
        return every if stage is None else [r for r in every if r.stage == stage]

    def add(self, stage: int, title: str, description: str, weight: int, negative: bool, step: int) -> StageRubric | None:
        """Add an active rubric unless the stage already has one of that title (case and spacing ignored)."""
        key = " ".join(title.split()).casefold()
        if not key or any(" ".join(r.title.split()).casefold() == key for r in self.rubrics(stage)):
            return None
        self.counter += 1
        rubric = StageRubric(id=f"s{stage}-{self.counter}", stage=stage, title=title.strip(),
                             description=description.strip(), weight=weight, negative=negative, created_step=step)
        self.active[stage].append(rubric)
        return rubric

    def prune(self, stage: int, cap: int, variance: dict[str, float | None]) -> list[StageRubric]:
        """Drop active rubrics of ``stage`` beyond ``cap``: lowest variance first, unscored ones last, older
        before newer. Persistent rubrics are not in ``active`` and so are never dropped."""
        pool = self.active[stage]
        if len(pool) <= cap:
            return []
        order = sorted(range(len(pool)), key=lambda i: (variance.get(pool[i].id) is None,
                                                        variance.get(pool[i].id) or 0.0, pool[i].created_step, i))
        drop = set(order[: len(pool) - cap])
        self.active[stage] = [r for i, r in enumerate(pool) if i not in drop]
        return [pool[i] for i in sorted(drop)]


# ------------------------------------------------------------------------------ structured output


class RubricDraft(BaseModel):
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    weight: int = Field(ge=1, le=3)


class StageDrafts(BaseModel):
    positive_rubrics: list[RubricDraft]
    negative_rubrics: list[RubricDraft]


class GeneratedRubrics(BaseModel):
    stage_1: StageDrafts
    stage_2: StageDrafts
    stage_3: StageDrafts
    stage_4: StageDrafts


class RubricScore(BaseModel):
    index: int = Field(ge=0)
    justification: str
    score: int = Field(ge=0, le=2)


class ScoreSheet(BaseModel):
    scores: list[RubricScore]


class GroupSheet(BaseModel):
    scores: list[list[Annotated[int, Field(ge=0, le=2)]]]


SCORE_LABELS = {"0": 0.0, "1": 1.0, "2": 2.0}
SHEET_CHOICE = Choice(SCORE_LABELS, field="score", every=True, label=lambda sheet: [s.score for s in sheet.scores])
"""A :class:`ScoreSheet`'s scores, one label at each ``"score":``, in the sheet's order."""
GROUP_CHOICE = Choice(SCORE_LABELS, field="scores", every=True,
                      label=lambda sheet: [x for row in sheet.scores for x in row])
"""A :class:`GroupSheet`'s scores, one label at each element of ``"scores"``, row by row."""


def group_sheet_schema(n_rubrics: int, n_attempts: int) -> dict[str, Any]:
    """``{"scores": [[s, ...], ...]}``: one row per rubric, one 0/1/2 per attempt."""
    row = {"type": "array", "minItems": n_attempts, "maxItems": n_attempts, "items": {"type": "integer", "enum": [0, 1, 2]}}
    return {"type": "object", "required": ["scores"], "additionalProperties": False,
            "properties": {"scores": {"type": "array", "minItems": n_rubrics, "maxItems": n_rubrics, "items": row}}}


log = logging.getLogger(__name__)


def failure_kind(why: str) -> str:
    """A metric-name-sized class of a judge failure reason (:func:`failure_reason`): ``call_<ErrorType>``,
    ``no_json``, ``schema`` (:func:`components.judges.call.model_parser`) or ``coverage`` (a parsed reply that
    skips or repeats an item)."""
    if why.startswith("call failed: "):
        return "call_" + why.removeprefix("call failed: ").split(":", 1)[0].strip()
    if why.startswith("rated "):  # valid JSON that skips or repeats an item it was asked to score
        return "coverage"
    return "no_json" if why.startswith("no JSON object") else "schema"


def failure_reason(failure: Failure) -> str:
    """A failed judgment as the results and logs record it: ``call failed: <ErrorType>: <message>``, or why the
    reply was unusable."""
    return f"call failed: {failure.describe()}" if failure.kind == "call_failed" else failure.reason


def covering_sheet(n: int) -> Callable[[str], ScoreSheet]:
    """Parse a :class:`ScoreSheet` that rates each index 0..n-1 exactly once."""
    read = model_parser(ScoreSheet)

    def parse(text: str) -> ScoreSheet:
        sheet = read(text)
        indices = sorted(s.index for s in sheet.scores)
        if indices != list(range(n)):
            raise Unparsed(f"rated indices {indices}, expected each of 0..{n - 1} once")
        return sheet

    return parse


def group_sheet(n_rubrics: int, n_attempts: int) -> Callable[[str], GroupSheet]:
    """Parse a :class:`GroupSheet` of ``n_rubrics`` rows of ``n_attempts`` scores."""
    read = model_parser(GroupSheet)

    def parse(text: str) -> GroupSheet:
        sheet = read(text)
        shape = [len(row) for row in sheet.scores]
        if shape != [n_attempts] * n_rubrics:
            raise Unparsed(f"rated {len(shape)} rubrics x {shape} attempts, expected {n_rubrics} x {n_attempts}")
        return sheet

    return parse


# ------------------------------------------------------------------------------ prompts


def _clip(text: str, limit: int) -> str:
    return clip_middle(text.strip(), limit)


def _rubric_text(r: StageRubric) -> str:
    """``title: description``, :func:`~components.judges.render.untrusted` (a judge wrote it from
    attempts)."""
    return f"{untrusted(r.title)}: {untrusted(r.description)}"


def render_attempt(blocks: dict[str, str | None], limit: int) -> str:
    return "\n".join(f"[Stage {k + 1}: {STAGE_NAMES[k]}]\n" + (_clip(blocks[name], limit) if blocks[name] is not None
                                                               else "(this stage never happens)")
                     for k, name in enumerate(STAGES))


def _reference(question: Question) -> str:
    return f"Reference answer: {' / '.join(question.answers)}\n" if question.answers else ""


GENERATION_SYSTEM = ("You write grading rubrics for a research agent by comparing several of its attempts at the same "
                     "question, stage by stage.")
SCORING_SYSTEM = "You grade one attempt of a research agent against rubrics, strictly by what the attempt shows."
GROUP_SCORING_SYSTEM = ("You grade several attempts of a research agent at the same question against rubrics, strictly "
                        "by what each attempt shows.")


def generation_messages(question: Question, attempts: Sequence[str], own_rubrics: Sequence[list[str]],
                        existing: Sequence[StageRubric], targets: Sequence[tuple[int, int]]) -> list[Message]:
    shown = "\n\n".join(f"=== Attempt {i + 1} ===\n{a}" for i, a in enumerate(attempts))
    refs = "\n".join(f"- Attempt {i + 1}: " + " | ".join(" ".join(r.split()) for r in rs)
                     for i, rs in enumerate(own_rubrics) if rs) or "(none)"
    used = "\n".join(f"- Stage {r.stage + 1} [{'-' if r.negative else '+'}] {_rubric_text(r)}"
                     for r in existing if r.kind == "judge") or "(none yet)"
    purposes = "\n".join(f"Stage {k + 1} {STAGE_NAMES[k]} ({lo}-{hi} rubrics): {STAGE_PURPOSE[k]}"
                         for k, (lo, hi) in enumerate(targets))
    text = (
        f"Question: {question.question}\n{_reference(question)}"
        "(Whether the final answer matches the reference is scored separately: no rubric should only check that.)\n\n"
        f"{shown}\n\n"
        "Checklists the agent wrote for itself while planning. Treat them as hints about what may matter, never "
        "as the standard: a weak checklist must not lower the bar, and going beyond one's plan because of "
        f"evidence is good.\n{refs}\n\nRubrics already in use (do not repeat them):\n{used}\n\n"
        f"What each stage is for:\n{purposes}\n\n"
        "Write the rubrics, stage by stage, that best explain why some attempts are better than others:\n"
        "- each must separate these attempts; skip a dimension on which they all behave alike;\n"
        "- name this question's entities and facts, so another grader can apply it without doubt;\n"
        "- never a rubric that only checks that tags exist, rewards following a bad plan, copies one attempt's "
        "wording, or rewards length;\n"
        "- no positive and negative versions of the same idea; negative rubrics only for clear failures;\n"
        "- weight 1 = minor, 2 = important, 3 = critical; the counts above are targets, an empty list is fine.\n\n"
        'Reply with one JSON object: {"stage_1": {"positive_rubrics": [{"title": "...", "description": "...", '
        '"weight": 2}], "negative_rubrics": []}, "stage_2": {...}, "stage_3": {...}, "stage_4": {...}}'
    )
    return [Message(role="system", content=GENERATION_SYSTEM), Message(role="user", content=text)]


def _listed(rubrics: Sequence[StageRubric]) -> str:
    return "\n".join(f"{i}. [{'NEGATIVE' if r.negative else 'POSITIVE'}, stage {r.stage + 1} "
                     f"{STAGE_NAMES[r.stage]}] {_rubric_text(r)}" for i, r in enumerate(rubrics))


_SCALE = ("POSITIVE rubric: 2 = the attempt fully shows the quality, 1 = partly, 0 = not at all.\n"
          "NEGATIVE rubric: 2 = the attempt fully shows the flaw, 1 = partly, 0 = it avoids the flaw.\n")


def scoring_messages(question: Question, attempt: str, rubrics: Sequence[StageRubric]) -> list[Message]:
    text = (
        f"Question: {question.question}\n{_reference(question)}\nThe attempt, by stage:\n{attempt}\n\n"
        f"Rubrics:\n{_listed(rubrics)}\n\n{_SCALE}"
        "Score each rubric on its own, by its description only, and justify it in one sentence that points at "
        "the attempt.\n\n"
        'Reply with one JSON object: {"scores": [{"index": 0, "justification": "...", "score": 2}, ...]} with '
        f"every index from 0 to {len(rubrics) - 1} exactly once."
    )
    return [Message(role="system", content=SCORING_SYSTEM), Message(role="user", content=text)]


def group_scoring_messages(question: Question, attempts: Sequence[str], rubrics: Sequence[StageRubric]) -> list[Message]:
    shown = "\n\n".join(f"=== Attempt {letter(i)} ===\n{a}" for i, a in enumerate(attempts))
    letters = ", ".join(letter(i) for i in range(len(attempts)))
    text = (
        f"Question: {question.question}\n{_reference(question)}\n{shown}\n\nRubrics:\n{_listed(rubrics)}\n\n{_SCALE}"
        "Score every rubric for every attempt, reading the attempts side by side: an attempt that meets a rubric "
        "better than another gets the higher score, and equal scores mean equally good on that rubric. A stage "
        "that never happens meets no positive rubric.\n\n"
        f'Reply with one JSON object: {{"scores": [[...], ...]}}: {len(rubrics)} rows, row i for rubric i, each '
        f"row one score per attempt in the order {letters}."
    )
    return [Message(role="system", content=GROUP_SCORING_SYSTEM), Message(role="user", content=text)]


# ------------------------------------------------------------------------------ the judge


@dataclass
class JudgeResult:
    """One trajectory's judgment: ``scores`` per stage (None: missing), rubric values in [0, 1] and the
    judge's justifications by rubric id, and whether the scoring call failed (fallback used)."""

    scores: list[float | None]
    values: dict[str, float] = field(default_factory=dict)
    justifications: dict[str, str] = field(default_factory=dict)
    failed: bool = False
    error: str | None = None
    asked: int = 0  # rubrics sent to the scoring call (0: no call was needed)
    labels: dict[str, str] = field(default_factory=dict)  # rubric id -> "stage, +/-, title" (for feedback)

    def feedback(self) -> str:
        """The judgment as text: stage scores, then each rubric's value and justification."""
        lines = [", ".join(f"{name} {'missing' if s is None else f'{s:.2f}'}" for name, s in zip(STAGES, self.scores))]
        lines += [f"- {self.labels.get(i, i)}: {v:.2f}" + (f" ({self.justifications[i]})" if i in self.justifications
                                                           else "") for i, v in self.values.items()]
        return "\n".join(lines)


class StagewiseJudge:
    def __init__(self, generator: ChatModel, evaluator: ChatModel, *, caps: Sequence[int] = (3, 2, 2, 3),
                 targets: Sequence[tuple[int, int]] = ((1, 4), (1, 4), (1, 4), (2, 5)), max_tokens: int = 1024,
                 stage_chars: int = 1500, answer_weight: float = 3.0, scoring: str = "trajectory", seed: int = 0):
        if len(caps) != len(STAGES) or len(targets) != len(STAGES):
            raise ValueError(f"caps and targets need one entry per stage ({len(STAGES)})")
        if scoring not in SCORING_MODES:
            raise ValueError(f"scoring must be one of {SCORING_MODES}, got {scoring!r}")
        self.scoring, self.seed = scoring, seed
        self.generator, self.evaluator = generator, evaluator
        self.caps, self.targets = list(caps), [tuple(t) for t in targets]
        self.max_tokens, self.stage_chars, self.answer_weight = max_tokens, stage_chars, answer_weight
        self.buffers: dict[str, QuestionBuffer] = {}
        self.tally = Tally()  # the scoring calls: how their sheets were scored (text or probability)

    def buffer(self, question: Question) -> QuestionBuffer:
        if question.id not in self.buffers:
            persistent = [StageRubric(id="p-answer", stage=ANSWER, title="Matches the reference answer",
                                      description="Token F1 of the final answer against the reference answers.",
                                      weight=self.answer_weight, persistent=True, kind="answer_f1")]
            self.buffers[question.id] = QuestionBuffer(question_id=question.id,
                                                       persistent=persistent if question.answers else [])
        return self.buffers[question.id]

    def _call(self, messages: list[Message], parse: Callable[[str], Any], schema: dict[str, Any],
              choice: Choice | None = None) -> JudgeCall:
        return JudgeCall(messages, parse, Sampling(temperature=0.0, max_tokens=self.max_tokens), schema=schema,
                         choice=choice)

    async def generate(self, question: Question, trajectories: Sequence[Trajectory],
                       blocks: Sequence[dict[str, str | None]]) -> tuple[GeneratedRubrics | None, str | None]:
        messages = generation_messages(question, [render_attempt(b, self.stage_chars) for b in blocks],
                                       [self_rubrics(t) for t in trajectories], self.buffer(question).rubrics(),
                                       self.targets)
        result = await ask(self.generator, self._call(messages, model_parser(GeneratedRubrics),
                                                      json_schema_of(GeneratedRubrics)))
        return (result.value, None) if result.ok else (None, failure_reason(result))

    def admit(self, question: Question, drafts: GeneratedRubrics, step: int) -> int:
        buf, added = self.buffer(question), 0
        for k in range(len(STAGES)):
            stage = getattr(drafts, f"stage_{k + 1}")
            for negative, items in ((False, stage.positive_rubrics), (True, stage.negative_rubrics)):
                added += sum(buf.add(k, d.title, d.description, d.weight, negative, step) is not None for d in items)
        return added

    def _local(self, question: Question, trajectory: Trajectory, present: list[bool],
               rubrics: Sequence[StageRubric]) -> dict[str, float]:
        """Values that need no judge call: the persistent F1 rubric, and 0 for a stage never reached."""
        local: dict[str, float] = {}
        for r in rubrics:
            if r.kind == "answer_f1":
                answered = present[ANSWER] and trajectory.final_answer is not None
                local[r.id] = float(f1_score(trajectory.final_answer, question.answers)) if answered else 0.0
            elif not present[r.stage]:
                local[r.id] = 0.0
        return local

    @staticmethod
    def _result(rubrics: Sequence[StageRubric], local: dict[str, float], judged: dict[str, float],
                notes: dict[str, str], error: str | None, asked: int) -> JudgeResult:
        """Stage scores from rubric values; a failed judge call leaves only the answer stage's F1."""
        values = {**local, **judged} if error is None else {r.id: local[r.id] for r in rubrics if r.kind == "answer_f1"}
        by_id = {r.id: r for r in rubrics}
        scores: list[float | None] = []
        for k in range(len(STAGES)):
            scored = [(by_id[i].weight, v) for i, v in values.items() if by_id[i].stage == k]
            scores.append(sum(w * v for w, v in scored) / sum(w for w, _ in scored) if scored else None)
        labels = {r.id: f"{STAGES[r.stage]} {'-' if r.negative else '+'} {r.title}" for r in rubrics}
        return JudgeResult(scores, values, notes if error is None else {}, failed=error is not None, error=error,
                           asked=asked, labels=labels)

    async def score(self, question: Question, trajectory: Trajectory, blocks: dict[str, str | None],
                    rubrics: Sequence[StageRubric]) -> JudgeResult:
        """One trajectory scored alone (``scoring="trajectory"``)."""
        present = [blocks[name] is not None for name in STAGES]
        local = self._local(question, trajectory, present, rubrics)
        asked = [r for r in rubrics if r.kind == "judge" and present[r.stage]]
        judged, notes, error = {}, {}, None
        if asked:
            schema = one_item_per_key(json_schema_of(ScoreSheet), "scores", "index", list(range(len(asked))))
            messages = scoring_messages(question, render_attempt(blocks, self.stage_chars), asked)
            result = await ask(self.evaluator, self._call(messages, covering_sheet(len(asked)), schema, SHEET_CHOICE),
                               self.tally)
            if not result.ok:
                error = failure_reason(result)
            else:
                for s, score in zip(result.value.scores, result.expected_each, strict=True):
                    judged[asked[s.index].id], notes[asked[s.index].id] = asked[s.index].value(score), s.justification
        return self._result(rubrics, local, judged, notes, error, len(asked))

    def group_orders(self, question: Question, step: int, n: int) -> list[list[int]]:
        """The orders ``scoring="group"`` shows a group's attempts in (each position -> attempt): the cyclic
        shifts of one order drawn per (seed, step, question), so each attempt is seen once at every position."""
        return balanced_orders(f"{self.seed}:{step}:{question.id}", n)

    async def score_group(self, question: Question, trajectories: Sequence[Trajectory],
                          blocks: Sequence[dict[str, str | None]], rubrics: Sequence[StageRubric],
                          step: int) -> tuple[list[JudgeResult], int, dict[str, float]]:
        """Every attempt of a group scored side by side (``scoring="group"``), once per balanced order; a
        rubric's value for an attempt is its mean over the orders. A failed, unparseable or wrongly shaped reply
        to any of the calls fails every attempt of the group (each falls back to its answer score). Returns the
        results, the calls made and the position diagnostics: ``position_spread`` (max - min over shown
        positions of the judge's mean score, halved to [0, 1], before negative rubrics are inverted) and
        ``attempt_spread`` (the same over attempts)."""
        present = [[b[name] is not None for name in STAGES] for b in blocks]
        local = [self._local(question, t, p, rubrics) for t, p in zip(trajectories, present)]
        asked = [r for r in rubrics if r.kind == "judge" and any(p[r.stage] for p in present)]
        judged: list[dict[str, float]] = [{} for _ in trajectories]
        error, orders, diagnostics = None, [], {}
        if asked:
            orders = self.group_orders(question, step, len(trajectories))
            rendered = [render_attempt(b, self.stage_chars) for b in blocks]
            schema = group_sheet_schema(len(asked), len(trajectories))
            parse = group_sheet(len(asked), len(trajectories))
            outs = await asyncio.gather(*(ask(self.evaluator, self._call(group_scoring_messages(
                question, [rendered[i] for i in order], asked), parse, schema, GROUP_CHOICE), self.tally)
                for order in orders))
            by_attempt: list[dict[str, list[float]]] = [{} for _ in trajectories]
            raw_attempt: list[list[float]] = [[] for _ in trajectories]  # the judge's 0/1/2 (halved), uninverted
            raw_position: list[list[float]] = [[] for _ in trajectories]
            for order, out in zip(orders, outs):
                if not out.ok:
                    error = error or failure_reason(out)
                    continue
                each = iter(out.expected_each)
                for r in asked:
                    row = [next(each) for _ in order]
                    for pos, i in enumerate(order):
                        if present[i][r.stage]:
                            by_attempt[i].setdefault(r.id, []).append(r.value(row[pos]))
                            raw_attempt[i].append(row[pos] / 2)
                            raw_position[pos].append(row[pos] / 2)
            if error is None:
                judged = [{rid: float(np.mean(v)) for rid, v in per.items()} for per in by_attempt]
                spread = lambda groups: float(np.ptp([np.mean(v) for v in groups if v])) if any(groups) else 0.0
                diagnostics = {"position_spread": spread(raw_position), "attempt_spread": spread(raw_attempt)}
        results = [self._result(rubrics, local[i], judged[i], {}, error, sum(present[i][r.stage] for r in asked))
                   for i in range(len(trajectories))]
        return results, len(orders), diagnostics

    async def judge_groups(self, groups: Sequence[tuple[Question, Sequence[Trajectory]]],
                           step: int) -> tuple[list[list[JudgeResult]], dict[str, float]]:
        """Generate (concurrently, one call per group), admit, score (concurrently, one call per trajectory),
        prune. Returns the results per group, in order, and the step's judge metrics.

        1. Generation: the judge sees the group's attempts stage by stage (the agents' own ``<rubric>`` blocks only
           as references) and proposes positive and negative rubrics per stage, weights 1-3; a failed or
           unparseable call adds nothing and is counted.
        2. Scoring against persistent + active rubrics, 0/1/2 per rubric with a justification: one call per
           trajectory (``scoring="trajectory"``, the paper's), or every attempt on every rubric side by side, once
           per balanced order (:mod:`components.judges.orders`), averaged (``"group"``). A positive rubric is worth
           ``score / 2``, a negative one ``1 - score / 2``; the stage score ``R_k`` is their weighted mean in [0, 1].
           A stage the trajectory never reaches scores 0; one with no rubric is missing (None); a failed scoring
           call keeps only the answer stage's persistent score (the others None) and is counted. Each 0/1/2 is a
           label choice (``Choice(every=True)``): scored from probabilities (``rubricem.score_from``, else
           ``llm.scoring``) a rubric's score is the expectation over "0", "1", "2".
        3. Pruning: per stage, active rubrics beyond the cap (3, 2, 2, 3) go lowest discrimination first
           (population variance of their values over the group; unscored last, then older before newer)."""
        blocks = [[split_stages(scaffold_text(t)).blocks for t in trajs] for _, trajs in groups]
        generated = await asyncio.gather(*(self.generate(q, trajs, b) for (q, trajs), b in zip(groups, blocks)))
        gen_failures = sum(d is None for d, _ in generated)
        for (q, _), (d, why) in zip(groups, generated):
            if d is None:
                log.warning("stagewise judge: rubric generation for %s failed: %s", q.id, why)
        added = sum(self.admit(q, d, step) for (q, _), (d, _) in zip(groups, generated) if d is not None)
        rubric_sets = [self.buffer(q).rubrics() for q, _ in groups]
        results: list[list[JudgeResult]] = [[] for _ in groups]
        diagnostics: list[dict[str, float]] = []
        if self.scoring == "group":
            scored_groups = await asyncio.gather(*(self.score_group(q, trajs, blocks[g], rubric_sets[g], step)
                                                   for g, (q, trajs) in enumerate(groups)))
            results = [group for group, _, _ in scored_groups]
            calls = sum(n for _, n, _ in scored_groups)
            diagnostics = [d for _, _, d in scored_groups if d]
        else:
            flat = [(g, i) for g, (_, trajs) in enumerate(groups) for i in range(len(trajs))]
            scored = await asyncio.gather(*(self.score(groups[g][0], groups[g][1][i], blocks[g][i], rubric_sets[g])
                                            for g, i in flat))
            for (g, _), result in zip(flat, scored):
                results[g].append(result)
            calls = sum(r.asked > 0 for group in results for r in group)
        pruned = 0
        for (question, _), group in zip(groups, results):
            buf = self.buffer(question)
            for k, cap in enumerate(self.caps):
                variance = {}
                for r in buf.active[k]:
                    seen = [res.values[r.id] for res in group if r.id in res.values]
                    variance[r.id] = float(np.var(seen)) if len(seen) >= 2 else None
                pruned += len(buf.prune(k, cap, variance))
        every = [r for group in results for r in group]
        scoring, self.tally = self.tally.scoring(), Tally()
        metrics: dict[str, float] = {
            **{f"judge/{key}": float(n) for key, n in scoring.items()},
            "judge/generation_calls": float(len(groups)), "judge/generation_failures": float(gen_failures),
            "judge/scoring_calls": float(calls),
            "judge/scoring_failures": float(sum(r.failed for r in every)),
            "judge/fallback_fraction": sum(r.failed for r in every) / max(len(every), 1),
            "judge/rubrics_added": float(added), "judge/rubrics_pruned": float(pruned),
            # groups of 2+ judged attempts whose judge-scored stages (all but the answer's F1) came out identical
            "judge/flat_groups": float(sum(len(g) > 1 and any(r.asked for r in g) and not any(r.failed for r in g)
                                           and len({tuple(r.scores[:ANSWER]) for r in g}) == 1 for g in results)),
        }
        for key in ("position_spread", "attempt_spread"):  # group scoring: how much follows position, not attempt
            if diagnostics:
                metrics[f"judge/{key}"] = float(np.mean([d[key] for d in diagnostics]))
        for why in [why for d, why in generated if d is None] + [r.error for r in every if r.error]:
            key = f"judge/failure/{failure_kind(why)}"
            metrics[key] = metrics.get(key, 0.0) + 1.0
        for k, name in enumerate(STAGES):
            vals = [r.scores[k] for r in every if r.scores[k] is not None]
            if vals:
                metrics[f"stage/{name}_mean"] = float(np.mean(vals))
            metrics[f"stage/{name}_missing"] = float(len(every) - len(vals))
            metrics[f"judge/active_{name}"] = float(np.mean([len(self.buffer(q).active[k]) for q, _ in groups]))
        return results, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": {qid: b.model_dump(mode="json") for qid, b in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.buffers = {qid: QuestionBuffer.model_validate(b) for qid, b in ((state or {}).get("buffers") or {}).items()}
