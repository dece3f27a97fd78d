"""The judge bench's trajectory set: for each of N world questions, the oracle's gold trajectory (the gold chain
followed through the real tools by :func:`components.warmstart.oracle.oracle_trajectory`) and perturbed copies of it
(:func:`perturb`: edits of the recorded trajectory, no model asked), each labelled by the oracle (:func:`labels`,
:func:`preference`). The set is written as JSONL with a manifest (version, seed, sizes, the SHA-256 of the JSONL
bytes), so a result names the exact set it used.

    items = build_set(world, toolbox, agent_settings, n_questions=8, seed=7)
    digest = write_set(items, out / "trajectories.jsonl")
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.agents.params import AgentParams
from components.evaluation.metrics import exact_match, normalize_answer
from components.io import write_json, write_jsonl
from components.schemas import Question, Step, Trajectory
from components.warmstart.oracle import oracle_trajectory
from components.world.oracle import OracleError

SET_VERSION = "judge-bench-trajectories-v1"
VARIANTS = ("gold", "wrong_answer", "skip_hop", "truncated", "irrelevant_search")


@dataclass
class Item:
    """One trajectory of the set: its question, which variant it is, and the oracle's labels of it."""

    question: Question
    variant: str
    trajectory: Trajectory
    labels: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict:
        return {"question_id": self.question.id, "variant": self.variant, "question": self.question.question,
                "answers": list(self.question.answers), "type": self.question.type, "labels": self.labels,
                "trajectory": self.trajectory.without_timings().model_dump(mode="json")}


def labels(trajectory: Trajectory, question: Question) -> dict[str, Any]:
    """The oracle's labels of ``trajectory``, read from it against the question's gold chain: ``em`` (exact match of
    the final answer, 0 without one), ``hop_steps`` (per hop, the first turn whose observation shows the hop's gold
    paragraph id with the hop's answer, or None), ``hops_found`` and ``facts_found`` (hop answers in any
    observation, whichever paragraph showed them)."""
    hop_steps: list[int | None] = []
    for hop in question.gold_chain:
        found = None
        for i, step in enumerate(trajectory.steps):
            argument = next(iter(step.tool_call.arguments.values()), "") if step.tool_call else ""
            shows_paragraph = hop.doc_id is not None and (hop.doc_id in step.observation or argument == hop.doc_id)
            if shows_paragraph and hop.answer in step.observation:
                found = i
                break
        hop_steps.append(found)
    seen = " ".join(s.observation for s in trajectory.steps)
    answer = trajectory.final_answer
    return {"em": float(exact_match(answer, question.answers)) if answer else 0.0,
            "answered": answer is not None, "hop_steps": hop_steps,
            "hops_found": sum(s is not None for s in hop_steps), "n_hops": len(question.gold_chain),
            "facts_found": sum(h.answer in seen for h in question.gold_chain)}


def preference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """``"A"`` when the trajectory labelled ``a`` is better by the oracle (more hops found, then a correct
    answer), ``"B"`` when ``b`` is, None when they tie on both."""
    for key in ("hops_found", "em"):
        if a[key] != b[key]:
            return "A" if a[key] > b[key] else "B"
    return None


def _renumber(steps: Sequence[Step]) -> list[Step]:
    return [s.model_copy(update={"index": i}) for i, s in enumerate(steps)]


def _with_steps(trajectory: Trajectory, steps: Sequence[Step], **update) -> Trajectory:
    steps = _renumber(steps)
    docs = list(dict.fromkeys(d for s in steps if s.tool_call for d in s.tool_call.doc_ids))
    return trajectory.model_copy(update={"steps": steps, "docs_seen": docs, **update})


def wrong_answer_for(question: Question, others: Sequence[Question], rng: random.Random) -> str | None:
    """A wrong answer of the same kind: the other yes/no, the other option of a two-way comparison, or the
    answer of another question of the same type that is a number when the gold answer is (never an exact
    match of a gold answer)."""
    gold = normalize_answer(question.answers[0])
    if gold in ("yes", "no"):
        return "no" if gold == "yes" else "yes"
    options = (question.metadata.get("compare") or {}).get("options")
    if options:
        rest = [o for o in options if not exact_match(o, question.answers)]
        if rest:
            return rest[0]
    pool = sorted({o.answers[0] for o in others if o.type == question.type and o.id != question.id
                   and normalize_answer(o.answers[0]) not in ("yes", "no")
                   and not exact_match(o.answers[0], question.answers)
                   and o.answers[0].isdigit() == question.answers[0].isdigit()})
    return rng.choice(pool) if pool else None


def _finish(step: Step, answer: str) -> Step:
    raw = step.raw.rsplit("Action:", 1)[0] + f"Action: finish[{answer}]"
    return step.model_copy(update={"raw": raw, "action": f"finish[{answer}]", "final_answer": answer})


def perturb(gold: Trajectory, question: Question, others: Sequence[Question], toolbox, titles: Sequence[str],
            settings: AgentParams, rng: random.Random) -> dict[str, Trajectory]:
    """The perturbed copies of ``gold``; a perturbation that cannot be made is left out. ``wrong_answer``: the finish
    turn names a wrong answer (the other side of a yes/no or two-way comparison, else another question's answer of
    the same kind); ``skip_hop``: one tool turn dropped, chosen (seeded) among those whose removal loses exactly one
    hop; ``truncated``: the finish turn and the last tool turn dropped, so no answer; ``irrelevant_search``: a
    search for an unrelated entity's title, with the real tool's observation, put before the finish turn."""
    out: dict[str, Trajectory] = {}
    steps, finish = gold.steps[:-1], gold.steps[-1]
    base = labels(gold, question)
    wrong = wrong_answer_for(question, others, rng)
    if wrong is not None:
        out["wrong_answer"] = _with_steps(gold, [*steps, _finish(finish, wrong)], final_answer=wrong)
    droppable = []
    for i in range(len(steps)):
        candidate = _with_steps(gold, [*steps[:i], *steps[i + 1:], finish])
        if labels(candidate, question)["hops_found"] == base["hops_found"] - 1:
            droppable.append(candidate)
    if droppable:
        out["skip_hop"] = rng.choice(droppable)
    if steps:
        out["truncated"] = _with_steps(gold, steps[:-1], final_answer=None, finish_reason="max_turns")
    gold_docs = {h.doc_id for h in question.gold_chain} | set(question.supporting_doc_ids)
    gold_names = {h.answer for h in question.gold_chain} | set(question.metadata.get("hop_titles") or [])
    unrelated = [t for t in titles if t not in gold_names and not any(t in n or n in t for n in gold_names)]
    if unrelated:
        title = rng.choice(unrelated)
        result = toolbox.call("search", title)
        if not result.error and not gold_docs & set(result.doc_ids):
            observation = result.observation[: settings.observation_max_chars]
            extra = Step(index=0, raw=f"Thought: I will also look up {title}.\nAction: search[{title}]",
                         thought=f"I will also look up {title}.", action=f"search[{title}]", tool_call=result,
                         observation=observation)
            out["irrelevant_search"] = _with_steps(gold, [*steps, extra, finish])
    return out


def build_set(questions: Sequence[Question], toolbox, settings: AgentParams, titles: Sequence[str],
              n_questions: int, seed: int) -> list[Item]:
    """The gold trajectory and its perturbations for the first ``n_questions`` questions the oracle can do, in
    the questions' order; ``titles`` are the corpus's entity titles (where irrelevant searches come from)."""
    items: list[Item] = []
    taken = 0
    for q in questions:
        if taken >= n_questions:
            break
        rng = random.Random(f"{seed}:{q.id}")
        try:
            gold = asyncio.run(oracle_trajectory(q, toolbox.for_question(q), settings, random.Random(f"oracle:{q.id}")))
        except OracleError:
            continue
        taken += 1
        items.append(Item(q, "gold", gold, labels(gold, q)))
        for variant, traj in perturb(gold, q, questions, toolbox.for_question(q), titles, settings, rng).items():
            items.append(Item(q, variant, traj, labels(traj, q)))
    return items


def pairs(items: Sequence[Item]) -> list[tuple[Item, Item, str | None]]:
    """(gold, perturbed, the oracle's preference with gold as A) for every perturbed trajectory of the set."""
    gold = {i.question.id: i for i in items if i.variant == "gold"}
    return [(gold[i.question.id], i, preference(gold[i.question.id].labels, i.labels))
            for i in items if i.variant != "gold"]


def write_set(items: Sequence[Item], path: str | Path, meta: dict[str, Any]) -> str:
    """Write the set as JSONL at ``path`` and its manifest beside it (``<stem>.manifest.json``); returns the
    SHA-256 of the JSONL bytes."""
    path = Path(path)
    write_jsonl(path, [i.record() for i in items])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    counts = {v: sum(i.variant == v for i in items) for v in VARIANTS}
    write_json(path.with_name(f"{path.stem}.manifest.json"),
               {"version": SET_VERSION, "sha256": digest, "trajectories": len(items),
                "questions": counts["gold"], "variants": counts, **meta})
    return digest
