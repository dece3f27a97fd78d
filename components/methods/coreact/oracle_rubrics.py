"""Rubrics written from a question's gold chain, and the rubric generator's oracle warm start built from them.

:func:`oracle_rubric` writes the rubric a branching point's next step should meet, from the gold chain of its
question: look up the first hop whose answer the history has not shown yet and do not answer before; once every
hop's answer has been shown, give the gold answer. It is the ceiling of the rubric reward
(``scripts/probe_rubric_evaluator.py --rubrics gold``: an evaluator that cannot rank a slate by a rubric that
names the next hop cannot reward a generator for writing one) and the target of the warm start.

The warm start (``rubric_generator.warm_start: oracle``) is SFT of the generator on one row per prefix: the
generator's own prompt (not trained) and the oracle rubric (trained). The prefixes are the branching points of the
training questions and every prefix of the policy warm start's trajectories (``sft_data``: oracle and teacher
episodes in training worlds, :func:`trajectory_points`), which cover every depth: the collect's 20 training points
of a 16-question run were all at depth 1 or 2, and a warm start on them alone wrote "Gives the final answer ..."
at every held-out point, depth 0 included. GRPO from the untrained 0.5B never sampled a rubric that names the next
hop, so it could not learn to write one; the warm start puts such rubrics in its samples, as the oracle
trajectories do for the policy. At inference the generator sees no gold chain: it has to read the next hop off the
question and the observations.

    points = training_points + [p for t in trajectories for p in trajectory_points(t)]
    rows, skipped = warm_start_rows(points, questions, render, max_criteria=4, max_chars=160)
    examples = [build_sft_example(r, tokenizer) for r in rows]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from components.llm.base import Message
from components.methods.coreact.rubric_generator import generator_messages, parse_rubric
from components.schemas import BranchingPoint, Question, Trajectory
from components.training.sft.trajectories import reply_row

__all__ = ["hop_rubric", "next_hop", "oracle_rubric", "trajectory_points", "warm_start_rows"]


def oracle_rubric(point: BranchingPoint, question: Question) -> str:
    """The gold-chain rubric of ``point``'s next step (see the module doc), as the generator's JSON."""
    seen = " ".join(f"{s.action} {s.observation}" for s in point.prefix)
    return hop_rubric(question, next_hop(question, seen))


def next_hop(question: Question, seen: str) -> int:
    """The first hop of ``question``'s gold chain whose answer ``seen`` (the history's text) does not show, or the
    chain's length when every one is shown (the next step answers)."""
    seen = seen.casefold()
    return next((k for k, hop in enumerate(question.gold_chain) if hop.answer.casefold() not in seen),
                len(question.gold_chain))


def hop_rubric(question: Question, hop: int) -> str:
    """The rubric of a step that looks up hop ``hop`` of the gold chain (and does not answer yet), or, at the
    chain's length, that gives the gold answer; as the generator's JSON."""
    if hop < len(question.gold_chain):
        criteria = [{"criterion": f"Looks up the fact: {question.gold_chain[hop].question}", "weight": 3},
                    {"criterion": "Does not give a final answer yet", "weight": 2}]
    else:
        criteria = [{"criterion": f"Gives the final answer {question.answers[0]}", "weight": 3}]
    return json.dumps({"criteria": criteria})


def trajectory_points(trajectory: Trajectory) -> list[BranchingPoint]:
    """Every point of ``trajectory`` at which the agent chose a next action: the empty prefix, and the prefix before
    each later step (the last step, a final answer, is never part of a prefix)."""
    return [BranchingPoint(question_id=trajectory.question_id, question=trajectory.question, depth=k,
                           prefix=trajectory.steps[:k]) for k in range(len(trajectory.steps))]


def warm_start_rows(points: Sequence[BranchingPoint], questions: Mapping[str, Question],
                    render: Callable[[list[Message], bool], str], max_criteria: int, observation_chars: int = 400,
                    *, max_chars: int,
                    format_reward: str = "schema") -> tuple[list[list[tuple[str, bool]]], dict[str, int]]:
    """SFT rows ``[(prompt, False), (oracle rubric + end of turn, True)]``, one per distinct (question, prefix)
    among ``points``, and how many points were skipped for each reason: ``no_gold_chain`` (the question is not in
    ``questions`` or has no chain), ``rubric_too_long`` (a hop's question makes a criterion longer than
    ``max_chars``, which the strict parser would reject) and ``duplicate``."""
    rows, skipped, seen = [], {"no_gold_chain": 0, "rubric_too_long": 0, "duplicate": 0}, set()
    for p in points:
        question = questions.get(p.question_id)
        if question is None or not question.gold_chain:
            skipped["no_gold_chain"] += 1
            continue
        key = (p.question_id, tuple((s.action, s.observation) for s in p.prefix))
        if key in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(key)
        rubric = oracle_rubric(p, question)
        if not parse_rubric(rubric, max_criteria, max_chars=max_chars).ok:
            skipped["rubric_too_long"] += 1
            continue
        messages = generator_messages(p.question, p.prefix, max_criteria, observation_chars, max_chars=max_chars,
                                      format_reward=format_reward)
        rows.append(reply_row(messages, rubric, render))
    return rows, skipped
