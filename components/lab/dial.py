"""Measure the simulated judge against the oracle at a dial setting: for each simulated kind, judgments whose oracle
verdicts are known (the lab world's compact oracle episodes, and the same episodes cut after their first turn), asked
through the methods' own prompt builders and parsers and the one judge interface, and the share of verdicts equal
to the oracle's, with a Clopper-Pearson 95% interval.

    rows = dial_table(params, [Dial(), Dial(flip_rate=0.2)], n=200)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from scipy.stats import binomtest

from components.evaluation.metrics import exact_match
from components.judges.answer import CORRECT, judge_prompt, parse_verdict
from components.judges.call import JudgeCall, ask
from components.judges.render import render_prefix, trajectory_text
from components.lab.judges import criterion_met
from components.lab.world import build_lab_world, compact_episodes
from components.llm.backends.simulated import Dial, Oracle, SimulatedJudge
from components.llm.base import Sampling
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_judge import (
    MEETS,
    WINNER,
    judge_messages,
    parse_meets,
    parse_winner,
    single_messages,
)
from components.methods.coreact.verifier import parse_verdicts, verifier_messages
from components.schemas import Criterion, Rubric
from components.world.oracle import hop_titles

__all__ = ["dial_table", "known_judgments"]


def _half(t):
    return t.model_copy(update={"steps": t.steps[:1], "final_answer": None, "finish_reason": "max_turns"})


def _criterion(q) -> RubricText:
    last = q.gold_chain[-1]
    return RubricText(title=f"finds {last.answer}", description=f"reads the paragraph that says {last.answer}",
                      counter_description="stops early")


def known_judgments(world, episodes, n: int) -> dict[str, list[tuple[JudgeCall, object]]]:
    """kind -> ``n`` (call, oracle verdict) pairs, half of them each way where the kind allows."""
    qs, out = world.questions, {k: [] for k in ("answer_correct", "arbor_single", "arbor_winner", "coreact_checklist")}
    for i in range(n):
        q, other = qs[i % len(qs)], qs[(i + 7) % len(qs)]
        pad = " " * (i // len(qs))  # a distinct prompt per judgment, so each has its own coins
        pred = f"it is {q.answers[0]}{pad}" if i % 2 == 0 else other.answers[0] + pad  # right in other words, or not
        truth = i % 2 == 0 or bool(exact_match(pred, q.answers))
        out["answer_correct"].append((JudgeCall(judge_prompt(q, pred), parse_verdict, Sampling(max_tokens=16),
                                                choice=CORRECT), truth))
        traj, eq = episodes[i % len(episodes)]
        rubric, full = _criterion(eq), trajectory_text(traj)
        cut = trajectory_text(_half(traj)) + "\n" * (i // len(episodes))
        crit = f"{rubric.title} {rubric.description}"
        shown = full + "\n" * (i // len(episodes)) if i % 2 == 0 else cut
        out["arbor_single"].append((JudgeCall(single_messages(eq.question, shown, rubric), parse_meets,
                                              Sampling(max_tokens=4), choice=MEETS), criterion_met(eq, crit, shown)))
        a, b = (full, cut) if i % 2 == 0 else (cut, full)
        met = [criterion_met(eq, crit, a), criterion_met(eq, crit, b)]
        winner = "A" if met[0] and not met[1] else "B" if met[1] and not met[0] else "TIE"
        out["arbor_winner"].append((JudgeCall(judge_messages(eq.question, a, b, rubric), parse_winner,
                                              Sampling(max_tokens=16), choice=WINNER), winner))
        k = (i // 2) % len(traj.steps)  # the oracle's own action at step k (good), or a search for a name of
        step = traj.steps[k]             # another question's chain (bad)
        elsewhere = next(t for _, o in episodes[i + 1:] + episodes[:i + 1] for t in hop_titles(o)
                         if t not in hop_titles(eq))
        action, good = (step.action, True) if i % 2 == 0 else (f"search[{elsewhere}]", False)
        checklist = Rubric(criteria=[Criterion(text="takes the next step of the chain", weight=1.0)])
        msgs = verifier_messages(eq.question, render_prefix(traj.steps[:k]) + pad, step.thought, action, checklist)
        out["coreact_checklist"].append((JudgeCall(msgs, lambda t: _first(parse_verdicts(t, 1)), Sampling(max_tokens=64)),
                                         good))
    return out


def _first(parsed):
    return parsed if isinstance(parsed, str) else parsed[0][0]


def dial_table(params, dials: Sequence[Dial], n: int = 200, seed: int = 99) -> list[dict]:
    """One row per (kind, dial): the measured agreement with the oracle and its 95% interval."""
    world = build_lab_world(params, seed)
    episodes, _ = compact_episodes(world, world.questions, params.agent)
    judgments = known_judgments(world, episodes, n)
    rows = []
    for dial in dials:
        judge = SimulatedJudge(Oracle(world.questions), dial)
        for kind, calls in judgments.items():
            async def run(calls=calls):
                return await asyncio.gather(*(ask(judge, c) for c, _ in calls))

            results = asyncio.run(run())
            agree = sum(r.ok and r.value == truth for r, (_, truth) in zip(results, calls))
            ci = binomtest(agree, len(calls)).proportion_ci(0.95)
            rows.append({"kind": kind, "flip_rate": dial.flip_rate, "position_bias": dial.position_bias,
                         "bias": dial.bias, "bias_rate": dial.bias_rate, "n": len(calls),
                         "agreement": agree / len(calls), "low": ci.low, "high": ci.high,
                         "failed": sum(not r.ok for r in results),
                         "example": results[0].text if results[0].ok else results[0].describe()})
    return rows
