"""Co-ReAct's judgments on the judge bench (:mod:`components.judges.bench.registry`), registered on import (by
``plugin.py``):

- ``coreact_council``: one council judge (the first ``council_judges`` role) ranks a slate, the trajectories of
  one question, listwise with the council's own prompt, parser and neutral labels
  (:mod:`.council`). A candidate is a trajectory's sequence of actions (the council ranks actions, never their
  results), a trajectory that stops without answering marked so. The slate is ranked once in each of its
  balanced orders (every trajectory once at every position), so the position effect can be told from the
  attempt effect. Modes: text (the ranking is not a label choice, so no probability mode) and reference: the
  council labels training data only, and the project's ``collect.judge_reference`` shows it the gold answer and
  hop chain (:func:`.council.reference_notes`); the paper's council ranks without.
- ``coreact_rubric_evaluator``: the rubric evaluator in its criterion mode (:func:`.rubric_eval.evaluate_criteria`,
  role ``rubric_generator.evaluator_role``): for each trajectory, its last action judged after its earlier
  turns against the fixed checklist :data:`CHECKLIST`, one yes/no call per criterion; the score is the
  weighted fraction, per question against the oracle's order. Modes: text and probability (yes/no is a label
  choice). No reference mode: the evaluator scores the rubric generator's checklists, which are written and
  used without a reference, and the reward compares its scores with the council's ranking.
- ``coreact_verifier`` and ``coreact_verifier_checklist``: the verifier (:func:`.verifier.verify_action`, role
  ``verifier``, ``coreact.tau``) in its two forms, ``criterion`` (one yes/no call per criterion, the embedded
  default) and ``checklist`` (one JSON call with a verdict per criterion, the paper's). The agent verifies a
  proposed tool call before it runs (never a finish), so a unit is each distinct tool action of the set after
  its history (an action that occurs in several trajectories with the same history is asked once), checked
  against the fixed checklist :data:`VERIFIER_CHECKLIST`. The oracle label is whether the action finds a new
  gold fact (its turn is the first to show a hop's gold paragraph with the hop's answer,
  ``labels["hop_steps"]``): accuracy is the verifier's accept/reject against it, AUC its weighted fraction as
  a score of it (:func:`verifier_summary`). Modes: text; probability for the criterion form (yes/no is a label
  choice; the JSON checklist is not). No reference mode: Co-ReAct's verifier never sees the gold answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from components.judges.bench import metrics
from components.judges.bench.registry import BenchJudgment, Context, Unit
from components.judges.call import ask
from components.judges.orders import balanced_orders
from components.judges.render import render_prefix
from components.llm.base import ChatModel, Sampling
from components.methods.coreact.council import (
    borda,
    build_messages,
    neutral_labels,
    ranking_call,
    reference_notes,
    vote_from_reply,
)
from components.methods.coreact.rubric_eval import evaluate_criteria
from components.methods.coreact.verifier import verify_action
from components.schemas import Criterion, Rubric, Trajectory

__all__ = ["CHECKLIST", "COUNCIL", "RUBRIC_EVALUATOR", "VERIFIER", "VERIFIER_CHECKLIST", "VERIFIER_JSON",
           "action_sequence", "verifier_summary", "verifier_units"]

CHECKLIST = Rubric(criteria=[
    Criterion(text="The action is a final answer.", weight=1.0),
    Criterion(text="The history holds a retrieved paragraph for each entity the question's chain passes through.",
              weight=1.0),
    Criterion(text="The answer the action gives is the one the facts in the history lead to.", weight=1.0),
])
"""The evaluator's checklist on the bench: what a Co-ReAct rubric for a last step says, in general words (the
rubric generator never sees the reference, so neither does this)."""


def action_sequence(trajectory: Trajectory) -> str:
    """The trajectory's actions in order, joined by arrows; one that stops without answering says so."""
    actions = " -> ".join(s.action or s.raw.strip() for s in trajectory.steps)
    return actions if trajectory.final_answer is not None else f"{actions} -> (stops without answering)"


def council_units(items: Sequence[Any], params: Any) -> list[Unit]:
    """Per question: its slate in each balanced order (the order drawn from the question's id)."""
    slates: dict[str, list[Any]] = {}
    for i in items:
        slates.setdefault(i.question.id, []).append(i)
    out = []
    for qid, slate in slates.items():
        for n, order in enumerate(balanced_orders(f"bench:{qid}", len(slate))):
            shown = [slate[p] for p in order]
            out.append(Unit(f"{qid}:{n}", qid, {"question": slate[0].question,
                                                "shown": [(i.variant, action_sequence(i.trajectory)) for i in shown]},
                            {"view": n, "oracle": {i.variant: metrics.oracle_key(i.labels) for i in slate},
                             "positions": {i.variant: p for p, i in enumerate(shown)}}))
    return out


async def ask_council(model: ChatModel, unit: Unit, context: Context) -> dict[str, Any]:
    q, shown = unit.data["question"], unit.data["shown"]
    k = len(shown)
    labels = neutral_labels(k)
    messages = build_messages(q.question, "", [(labels[j], action) for j, (_, action) in enumerate(shown)],
                              reference_notes(q) if context.reference else None)
    result = await ask(model, ranking_call(messages, labels, Sampling(temperature=0.0, max_tokens=384)),
                       context.tally)
    vote = vote_from_reply("bench", list(range(k)), labels, result)
    points = borda([vote], k) if vote.valid else [None] * k
    return {"scores": {variant: points[j] for j, (variant, _) in enumerate(shown)},
            "ranking": vote.ranking if vote.valid else None, "failure": None if vote.valid else vote.error,
            "reply": getattr(result, "text", None) or getattr(result, "reply", None)}


NO_ACTION = "(none: the episode ended before any action)"


def evaluator_units(items: Sequence[Any], params: Any) -> list[Unit]:
    """Each trajectory: its last action after the turns before it (a truncated one with no turn left has none,
    :data:`NO_ACTION`)."""
    obs = params.coreact.observation_chars
    out = []
    for i in items:
        steps = i.trajectory.steps
        action = (steps[-1].action or steps[-1].raw.strip()) if steps else NO_ACTION
        out.append(Unit(f"{i.question.id}:{i.variant}", i.question.id,
                        {"question": i.question, "variant": i.variant, "prefix": render_prefix(steps[:-1], obs),
                         "action": action}, {"oracle": {i.variant: metrics.oracle_key(i.labels)}}))
    return out


async def ask_evaluator(model: ChatModel, unit: Unit, context: Context) -> dict[str, Any]:
    d = unit.data
    [score] = await evaluate_criteria(model, d["question"].question, d["prefix"], [d["action"]], CHECKLIST,
                                      tally=context.tally)
    return {"scores": {d["variant"]: score.score}, "view": 0, "failure": score.error,
            "satisfied": list(score.satisfied) if score.satisfied is not None else None}


COUNCIL = BenchJudgment(
    name="coreact_council", method="coreact", role=lambda params: "council_judges", units=council_units,
    ask=ask_council, summary=metrics.slate_summary, choice=False, reference="mode",
    reference_note=("the council labels training data; collect.judge_reference shows it the gold answer and hop "
                    "chain (reference mode), the paper's council ranks without (text)"),
    doc="one judge ranks each question's trajectories (as action sequences) in each balanced order",
    per_variant=metrics.slate_per_variant).register()

RUBRIC_EVALUATOR = BenchJudgment(
    name="coreact_rubric_evaluator", method="coreact", role=lambda params: params.rubric_generator.evaluator_role,
    units=evaluator_units, ask=ask_evaluator, summary=metrics.slate_summary, choice=True, reference="never",
    reference_note=("off: the evaluator scores the rubric generator's checklists, which never see a reference, "
                    "and its scores are compared with the council's ranking"),
    doc="each trajectory's last action after its history, one yes/no call per criterion of a fixed checklist",
    per_variant=metrics.slate_per_variant, scoring_key="rubric_generator.evaluator_scoring").register()

VERIFIER_CHECKLIST = Rubric(criteria=[
    Criterion(text="The action looks up an entity that the question names, or that a fact found in the history "
                   "names, as the next link of the question's chain.", weight=1.0),
    Criterion(text="The action seeks a fact the question still needs, one the history has not already found.",
              weight=1.0),
    Criterion(text="What the action looks up bears on the answer to the question; it is not a detour.", weight=1.0),
])
"""The verifier's checklist on the bench: what a Co-ReAct step rubric asks of a tool call, in general words
(the rubric generator never sees the reference, so neither does this)."""


def verifier_units(items: Sequence[Any], params: Any) -> list[Unit]:
    """Each distinct (question, history, tool action) of the set, labelled by whether the action finds a new
    gold fact; ``variant`` is the first trajectory it occurs in (gold before its perturbations)."""
    obs = params.coreact.observation_chars
    out, seen = [], set()
    for i in items:
        steps, found = i.trajectory.steps, {s for s in i.labels["hop_steps"] if s is not None}
        for n, step in enumerate(steps):
            if step.tool_call is None or step.final_answer is not None:
                continue
            prefix = render_prefix(steps[:n], obs)
            key = (i.question.id, prefix, step.action)
            if key in seen:
                continue
            seen.add(key)
            out.append(Unit(f"{i.question.id}:{i.variant}:{n}", i.question.id,
                            {"question": i.question, "prefix": prefix, "thought": step.thought or "",
                             "action": step.action or step.raw.strip()},
                            {"variant": i.variant, "step": n, "label": n in found}))
    return out


def verifier_asker(form: str):
    """The ask of one verifier unit in ``form`` (``coreact.verifier_mode``'s values)."""
    async def ask_verifier(model: ChatModel, unit: Unit, context: Context) -> dict[str, Any]:
        d, c = unit.data, context.params.coreact
        v = await verify_action(model, d["question"].question, d["prefix"], d["thought"], d["action"],
                                VERIFIER_CHECKLIST, tau=c.tau, max_tokens=c.judge_max_tokens, mode=form,
                                tally_out=context.tally)
        return {"verdict": v.fraction, "accepted": v.accepted, "failure": v.error, "satisfied": v.satisfied,
                "reasons": v.reasons}

    return ask_verifier


def verifier_summary(rows: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Accuracy of the accept/reject decision against the oracle label (the action finds a new gold fact), AUC
    of the weighted fraction as a score of it, both with bootstrap intervals; ``accept_rate`` over judged units
    and the failure rate (a failed verification is a failure, never a rejection)."""
    judged = [r for r in rows if r["verdict"] is not None]
    hits = [float(r["accepted"] == r["label"]) for r in judged]
    scores, labels = [float(r["verdict"]) for r in judged], [bool(r["label"]) for r in judged]
    value = metrics.auc(scores, labels) if judged else float("nan")
    return {"rows": len(rows), "failure_rate": (len(rows) - len(judged)) / len(rows) if rows else None,
            "accuracy": float(np.mean(hits)) if hits else None,
            "accuracy_ci": metrics.bootstrap_interval(hits, seed=seed),
            "accuracy_n": len(hits), "auc": None if np.isnan(value) else value,
            "auc_ci": metrics.auc_interval(scores, labels, seed),
            "accept_rate": float(np.mean([bool(r["accepted"]) for r in judged])) if judged else None,
            "positives": sum(labels), "flat_rate": None, "position_effect": None}


def verifier_per_variant(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per trajectory the actions first occur in: how many the verifier accepts, and how many find a fact."""
    out = {}
    for v in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == v]
        judged = [r for r in mine if r["verdict"] is not None]
        out[v] = (f"accepts {sum(bool(r['accepted']) for r in judged)}/{len(judged)}, "
                  f"oracle: finds {sum(bool(r['label']) for r in mine)}/{len(mine)}")
    return out


_VERIFIER_FORMS = {
    "criterion": ("one yes/no call per criterion (coreact.verifier_mode criterion, the embedded default), the "
                  "weighted fraction accepted above coreact.tau"),
    "checklist": "one JSON call with a verdict per criterion (coreact.verifier_mode checklist, the paper's form)",
}


def _verifier(form: str) -> BenchJudgment:
    return BenchJudgment(
        name="coreact_verifier" if form == "criterion" else "coreact_verifier_checklist", method="coreact",
        role=lambda params: "verifier", units=verifier_units, ask=verifier_asker(form), summary=verifier_summary,
        choice=form == "criterion", reference="never",
        reference_note=("off: Co-ReAct's verifier checks a proposed action against the step's rubric and never "
                        "sees the gold answer"),
        doc=(f"each distinct tool action after its history, against a fixed 3-item checklist; "
             f"{_VERIFIER_FORMS[form]}. "
             "Oracle label: the action finds a new gold fact (its turn first shows a hop's gold paragraph with the "
             "hop's answer); accuracy = accept/reject against it, AUC = the fraction as a score of it"),
        per_variant=verifier_per_variant).register()


VERIFIER, VERIFIER_JSON = (_verifier(form) for form in _VERIFIER_FORMS)
