"""The answer judge on the bench (``answer_judge``): does a prediction mean the same as the gold answer?

Units (:func:`answer_items`): per question, the gold answer in two sentences (right), the set's wrong answer and
an intermediate hop's answer (wrong); none is an exact match, so each needs the judge. Scored by
:func:`components.judges.bench.metrics.answer_summary` (accuracy at 0.5, AUC of the verdict for "right").
The judge always sees the reference answers: that is the judgment itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.evaluation.metrics import exact_match, normalize_answer
from components.judges.answer import judge_answer
from components.judges.bench import metrics
from components.judges.bench.registry import BenchJudgment, Context, Unit


def answer_items(items: Sequence[Any]) -> list[dict]:
    """Per question: the gold answer in two sentences (right), the wrong answer of the set and an intermediate
    hop's answer (wrong); none of them an exact match, so each needs the judge."""
    out, seen = [], set()
    for it in items:
        q = it.question
        if it.variant == "gold":
            gold = q.answers[0]
            candidates = [(f"I believe it is {gold}", True), (f"{gold}, according to the search results", True)]
            hops = [h.answer for h in q.gold_chain[:-1]
                    if not exact_match(h.answer, q.answers) and normalize_answer(h.answer) not in ("yes", "no")]
            if hops:
                candidates.append((hops[-1], False))
        elif it.variant == "wrong_answer":
            candidates = [(it.trajectory.final_answer, False)]
        else:
            continue
        for prediction, label in candidates:
            if (exact_match(prediction, q.answers) and not label) or (q.id, prediction) in seen:
                continue
            seen.add((q.id, prediction))
            out.append({"question": q, "prediction": prediction, "label": label,
                        "kind": "paraphrase" if label else ("hop_answer" if it.variant == "gold" else "wrong_answer")})
    return out


def units(items: Sequence[Any], params: Any) -> list[Unit]:
    return [Unit(f"{a['question'].id}:{a['prediction']}", a["question"].id, a,
                 {"prediction": a["prediction"], "kind": a["kind"], "label": a["label"]})
            for a in answer_items(items)]


async def ask(model, unit: Unit, context: Context) -> dict[str, Any]:
    verdict = await judge_answer(model, unit.data["question"], unit.data["prediction"], context.tally)
    return {"verdict": None if verdict is None else float(verdict)}


ANSWER_JUDGE = BenchJudgment(
    name="answer_judge", method="shared", role=lambda params: "answer_judge", units=units, ask=ask,
    summary=metrics.answer_summary, choice=True, reference="always",
    reference_note="the answer judge compares a prediction with the reference answers: it always sees them",
    doc="answers string matching cannot decide; accuracy at 0.5 and AUC for 'right'").register()
