"""ARBOR's judgments on the judge bench (:mod:`components.judges.bench.registry`), registered on import (by
``plugin.py``):

- ``arbor_pairwise`` and ``arbor_pairwise_verdicts``: the pairwise process judge (:mod:`.pairwise_judge`, role
  ``arbor.judge_role``) in its forms (the paper's winner-or-TIE call; a yes/no verdict per attempt with both in
  view; ``arbor_pairwise_single``: a yes/no per attempt seen alone) on each
  pair (gold, perturbed) of one question, both orders, on a fixed rubric about finding each hop (:data:`RUBRIC`).
  Modes: text, probability (the winner is a label choice) and reference. ARBOR's judge scores training
  rollouts, never an answer at test time, so it may be shown the gold answer and the question's gold facts as
  RaR's writer and ARCO's oracle diagnostics are (issue 46.3): the reference mode is that setting, and the
  paper's setting (no reference) is the text mode;
- ``arbor_rar``: the RaR baseline's rating (:mod:`.rar`): a checklist written per question from the question
  and its reference answer (one call, counted in the first trajectory's judgment), then a 1-10 rating of each
  trajectory against it, scored per question against the oracle's order. RaR's checklist writer always sees the
  reference answer (that is the method), so it has no separate reference mode; the rating is not a label choice
  (no probability mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.judges.bench import metrics
from components.judges.bench.registry import BenchGap, BenchJudgment, Context, Unit
from components.judges.bench.trajectories import pairs
from components.judges.render import trajectory_text
from components.llm.base import ChatModel, Sampling
from components.methods.arbor import rar
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_judge import ask_edge, reference_facts

__all__ = ["PAIRWISE", "PAIRWISE_SINGLE", "PAIRWISE_VERDICTS", "RAR", "RUBRIC"]

RUBRIC = RubricText(
    title="Finds each hop",
    description="Looks up each entity of the question's chain in turn, reads every fact the answer depends on in "
                "a retrieved paragraph, and answers with what those facts give.",
    counter_description="Skips an entity of the chain, answers without having read a fact it depends on, or stops "
                        "before reaching the answer.")

_SWAP = {"A": "B", "B": "A"}


def pair_units(items: Sequence[Any], params: Any) -> list[Unit]:
    """Each pair (gold, perturbed) in both orders; ``preferred`` is the oracle's choice in the shown positions."""
    obs = params.arbor.observation_chars
    out = []
    for gold, other, preferred in pairs(items):
        texts = {"gold": trajectory_text(gold.trajectory, obs), "other": trajectory_text(other.trajectory, obs)}
        pair_id = f"{gold.question.id}:{other.variant}"
        for order in ("AB", "BA"):
            a, b = ("gold", "other") if order == "AB" else ("other", "gold")
            shown = preferred if order == "AB" or preferred is None else _SWAP[preferred]
            out.append(Unit(f"{pair_id}:{order}", gold.question.id,
                            {"question": gold.question, "a": texts[a], "b": texts[b]},
                            {"pair": pair_id, "variant": other.variant, "order": order, "preferred": shown}))
    return out


def pair_asker(form: str):
    """The ask of one pair unit in ``form`` (:func:`.pairwise_judge.ask_edge`)."""
    async def ask_pair(model: ChatModel, unit: Unit, context: Context) -> dict[str, Any]:
        q = unit.data["question"]
        verdict = await ask_edge(model, q.question, unit.data["a"], unit.data["b"], RUBRIC,
                                 Sampling(temperature=0.0, max_tokens=context.params.arbor.judge_max_tokens),
                                 context.tally, form, reference_facts(q) if context.reference else None,
                                 context.cache if form == "single" else None)
        return {"winner": verdict.winner, "expected": verdict.expected, "failure": verdict.failure,
                "meets": list(verdict.meets) if verdict.meets else None, "label_probs": verdict.label_probs,
                "replies": list(verdict.replies)}

    return ask_pair


def rar_units(items: Sequence[Any], params: Any) -> list[Unit]:
    obs = params.arbor.observation_chars
    return [Unit(f"{i.question.id}:{i.variant}", i.question.id,
                 {"question": i.question, "variant": i.variant, "text": trajectory_text(i.trajectory, obs)},
                 {"oracle": {i.variant: metrics.oracle_key(i.labels)}}) for i in items]


async def ask_rar(model: ChatModel, unit: Unit, context: Context) -> dict[str, Any]:
    q, variant = unit.data["question"], unit.data["variant"]
    a = context.params.arbor
    if q.id not in context.cache:  # one checklist per question, its call counted in this judgment
        context.cache[q.id] = await rar.write_checklist(model, q, a.rar_min_items, a.rar_max_items, context.tally,
                                                        max_tokens=a.writer_max_tokens)
    items = context.cache[q.id]
    score = None if items is None else await rar.rate(model, q.question, unit.data["text"], items, context.tally)
    return {"scores": {variant: score}, "view": 0, "failure": None if score is not None else
            ("no checklist" if items is None else "rating failed")}


_PAIR_REFERENCE = ("ARBOR's pairwise judge scores training rollouts only; shown the gold answer and facts in the "
                   "reference mode (issue 46.3), not in the paper's setting (text)")

_FORMS = {
    "winner": "the paper's form: one call names the winner or TIE; pairs (gold, perturbed) in both orders",
    "verdicts": "the verdicts form: a yes/no per attempt with both in view, the winner the one that alone meets it",
    "single": ("the single form: a yes/no per attempt seen alone (asked once per attempt and mode, its call counted "
               "in the first pair that needs it), the winner the one that alone meets it"),
}


def _pairwise(form: str) -> BenchJudgment:
    return BenchJudgment(
        name="arbor_pairwise" if form == "winner" else f"arbor_pairwise_{form}", method="arbor",
        role=lambda params: params.arbor.judge_role, units=pair_units, ask=pair_asker(form),
        summary=metrics.pairwise_summary, choice=True, reference="mode", reference_note=_PAIR_REFERENCE,
        doc=_FORMS[form], per_variant=metrics.pairwise_per_variant, scoring_key="arbor.judge_scoring").register()


PAIRWISE, PAIRWISE_VERDICTS, PAIRWISE_SINGLE = (_pairwise(form) for form in _FORMS)

RAR = BenchJudgment(
    name="arbor_rar", method="arbor", role=lambda params: params.arbor.judge_role, units=rar_units, ask=ask_rar,
    summary=metrics.slate_summary, choice=False, reference="always",
    reference_note="RaR's checklist is written from the question and its reference answer in every mode",
    doc="a checklist per question (with the reference answer), each trajectory rated 1-10 against it",
    per_variant=metrics.slate_per_variant).register()

INDUCTION = BenchGap(
    name="arbor_induction", method="arbor",
    reason=("induction writes rubrics from contrasting trajectories; the oracle labels trajectories, not "
            "rubrics, so a written rubric has no label to agree with. Its effect reaches the bench through the "
            "pairwise judge that scores with it")).register()
