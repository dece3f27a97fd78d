"""Measure the simulated judge against the oracle at a dial setting: for every judgment kind it answers, judgments
whose oracle verdicts are known (the lab world's compact oracle episodes and the same episodes cut after their first
turn; the oracle's own next action beside a repeat, a stray search and a wrong answer), asked through the methods'
own prompt builders and parsers and the one judge interface, and the share of verdicts equal to the oracle's, with a
Clopper-Pearson 95% interval. A reply of several verdicts (one per criterion, rubric, step or candidate) counts each;
a graded verdict agrees when it is the oracle's exactly (a ranking: the same tie groups, also reported as the mean
Spearman rho; a 0/1/2 score whose truth is the scale's midpoint, which a flip leaves as it is, is not counted).

    rows = dial_table(params, [Dial(), Dial(flip_rate=0.2)], n=200)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import binomtest, spearmanr

from components.evaluation.metrics import exact_match
from components.judges.answer import CORRECT, judge_prompt, parse_verdict
from components.judges.call import JudgeCall, Unparsed, ask, model_parser, reasons
from components.judges.render import render_prefix, trajectory_text
from components.lab import judges as lab
from components.lab.world import build_lab_world, compact_episodes
from components.llm.backends.simulated import Dial, Oracle, SimulatedJudge
from components.llm.base import Sampling
from components.methods.arbor import induction, rar
from components.methods.arbor.contrast import InductionPlan
from components.methods.arbor.memory import Draft, RubricText
from components.methods.arbor.pairwise_judge import (
    MEETS,
    WINNER,
    judge_messages,
    parse_meets,
    parse_winner,
    single_messages,
    verdict_messages,
)
from components.methods.arco import criteria as arco
from components.methods.coreact import council, rubric_eval
from components.methods.coreact.baselines import BestOfNAgent, parse_json_reply
from components.methods.coreact.oracle_rubrics import oracle_rubric
from components.methods.coreact.rubric_generator import generator_messages, parse_rubric
from components.methods.coreact.verifier import parse_verdicts, verifier_messages
from components.methods.rubricem import reflection
from components.methods.rubricem import stagewise_judge as stagewise
from components.schemas import BranchingPoint, Criterion, Rubric
from components.world.oracle import hop_titles

__all__ = ["KINDS_MEASURED", "Known", "dial_table", "known_judgments"]

GREEDY = Sampling(temperature=0.0, max_tokens=512)


@dataclass
class Known:
    """A kind's known judgments: (call, the oracle's verdict as the method's parser reads it) pairs, how a parsed
    reply is compared with it (one bool per verdict it holds, None for one not counted), what agreement means,
    and for a ranking its graded agreement (Spearman rho of one reply against the oracle's)."""

    calls: list[tuple[JudgeCall, Any]]
    agree: Callable[[Any, Any], list[bool | None]]
    measure: str
    graded: Callable[[Any, Any], float] | None = None


def _same(value, truth) -> list[bool]:
    return [value == truth]


def _each(value, truth) -> list[bool]:
    return [v == t for v, t in zip(value, truth, strict=True)]


def _scores(value, truth) -> list[bool | None]:
    return [None if t == 1 else v == t for v, t in zip(value, truth, strict=True)]


def _half(t):
    return t.model_copy(update={"steps": t.steps[:1], "final_answer": None, "finish_reason": "max_turns"})


def _criterion(q) -> RubricText:
    last = q.gold_chain[-1]
    return RubricText(title=f"finds {last.answer}", description=f"reads the paragraph that says {last.answer}",
                      counter_description="stops early")


def _elsewhere(episodes, i, eq) -> str:
    """A title of another question's chain that this question's does not read (a stray search)."""
    return next(t for _, o in episodes[i + 1:] + episodes[:i + 1] for t in hop_titles(o) if t not in hop_titles(eq))


def _groups(groups) -> list[list[str]]:
    return [sorted(g) for g in groups]


def _rho(value, truth) -> float:
    labels = sorted(x for g in truth for x in g)
    place = lambda groups: [next(p for p, g in enumerate(groups) if x in g) for x in labels]
    mine, oracle = place(value), place(truth)
    if len(set(mine)) < 2 or len(set(oracle)) < 2:
        return 0.0  # one tie group says nothing about the order
    return float(spearmanr(mine, oracle).statistic)


def _blocks(q, traj, full: bool) -> dict[str, str | None]:
    """A scaffold attempt from a compact episode: a plan naming the question's first paragraph, the episode as the
    research, and (the whole episode only) a review and an answer that cite the last fact."""
    last = q.gold_chain[-1].answer
    return {"plan": f"First look up {hop_titles(q)[0]}.", "research": trajectory_text(traj if full else _half(traj)),
            "review": f"{last} is stated in the paragraph read last." if full else None,
            "answer": f"{traj.final_answer} (from {last})" if full else None}


def _stage_rubrics(q, blocks) -> list[stagewise.StageRubric]:
    """The oracle's stage rubrics for the stages the attempt reaches (the judge asks no other)."""
    return [stagewise.StageRubric(id=f"r{n}", stage=k, title=t, description=d, weight=2, negative=negative)
            for n, (k, t, d, negative) in enumerate(lab.stage_rubrics(q)) if blocks[stagewise.STAGES[k]] is not None]


def known_judgments(world, episodes, n: int) -> dict[str, Known]:
    """kind -> ``n`` known judgments, half of them each way where the kind allows."""
    qs = world.questions
    deep = [(t, q) for t, q in episodes if len(q.gold_chain) >= 2 and len({h.answer for h in q.gold_chain}) >= 2
            and lab.criterion_met(q, _criterion(q).title, trajectory_text(t))
            and not lab.criterion_met(q, _criterion(q).title, trajectory_text(_half(t)))]
    out: dict[str, list] = {k: [] for k in KINDS_MEASURED}
    for i in range(n):
        q, other = qs[i % len(qs)], qs[(i + 7) % len(qs)]
        pad = " " * (i // len(qs))  # a distinct prompt per judgment, so each has its own coins
        pred = f"it is {q.answers[0]}{pad}" if i % 2 == 0 else other.answers[0] + pad  # right in other words, or not
        truth = i % 2 == 0 or bool(exact_match(pred, q.answers))
        out["answer_correct"].append((JudgeCall(judge_prompt(q, pred), parse_verdict, Sampling(max_tokens=16),
                                                choice=CORRECT), truth))

        traj, eq = episodes[i % len(episodes)]
        nl = "\n" * (i // len(episodes))
        rubric, full = _criterion(eq), trajectory_text(traj)
        cut = trajectory_text(_half(traj)) + nl
        crit = f"{rubric.title} {rubric.description}"
        shown = full + nl if i % 2 == 0 else cut
        out["arbor_single"].append((JudgeCall(single_messages(eq.question, shown, rubric), parse_meets,
                                              Sampling(max_tokens=4), choice=MEETS), lab.criterion_met(eq, crit, shown)))
        a, b = (full, cut) if i % 2 == 0 else (cut, full)
        met = [lab.criterion_met(eq, crit, a), lab.criterion_met(eq, crit, b)]
        winner = "A" if met[0] and not met[1] else "B" if met[1] and not met[0] else "TIE"
        out["arbor_winner"].append((JudgeCall(judge_messages(eq.question, a, b, rubric), parse_winner,
                                              Sampling(max_tokens=16), choice=WINNER), winner))
        about = "AB"[(i // 2) % 2]
        out["arbor_verdict"].append((JudgeCall(verdict_messages(eq.question, a, b, rubric, about), parse_meets,
                                               Sampling(max_tokens=4), choice=MEETS), met["AB".index(about)]))

        # a proposed action: the oracle's own at step k (good), or a search for another question's paragraph (bad);
        # the question's text padded (the prompts strip the history), so each judgment has its own coins
        k = (i // 2) % len(traj.steps)
        step, prefix, asked_q = traj.steps[k], render_prefix(traj.steps[:k]), eq.question + nl.replace("\n", " ")
        stray = f"search[{_elsewhere(episodes, i, eq)}]"
        action = step.action if i % 2 == 0 else stray
        checklist = Rubric(criteria=[Criterion(text="takes the next step of the chain", weight=1.0)])
        msgs = verifier_messages(asked_q, prefix, step.thought, action, checklist)
        out["coreact_checklist"].append((JudgeCall(msgs, lambda t: _first(parse_verdicts(t, 1)), Sampling(max_tokens=64)),
                                         i % 2 == 0))
        nxt = next((t for t, done in zip(hop_titles(eq), lab.hops_done(eq, prefix)) if not done), hop_titles(eq)[-1])
        criteria = ["takes the next step of the chain", f"looks up {nxt}"]
        rubric2 = Rubric(criteria=[Criterion(text=c, weight=1.0) for c in criteria])
        meets = [lab.action_meets(eq, prefix, action, c) for c in criteria]
        out["coreact_evaluator"].append((JudgeCall(rubric_eval.evaluator_messages(asked_q, prefix, action, rubric2),
                                                   reasons(lambda t: rubric_eval.parse_satisfied(t, 2)), GREEDY), meets))
        out["coreact_criterion"].append((JudgeCall(rubric_eval.criterion_messages(
            asked_q, prefix, action, criteria[i % 4 // 2]), reasons(rubric_eval.parse_yes_no), Sampling(max_tokens=4)),
            meets[i % 4 // 2]))
        pair = [step.action, stray] if i % 4 < 2 else [stray, step.action]
        grid = [[lab.action_meets(eq, prefix, x, c) for x in pair] for c in criteria]
        out["coreact_slate"].append((JudgeCall(rubric_eval.slate_messages(asked_q, prefix, pair, rubric2),
                                               reasons(lambda t: rubric_eval.parse_verdicts(t, 2, 2)), GREEDY),
                                     [x for row in grid for x in row]))
        # a slate: the oracle's action, a stray search, a wrong answer and (after the first step) a repeat
        slate = [step.action, stray, f"finish[{other.answers[0]}]"] + (
            [f"search[{hop_titles(eq)[0]}]"] if k > 0 and not step.action.startswith("search") else [])
        order = [(j + i) % len(slate) for j in range(len(slate))]
        labels = council.neutral_labels(len(slate))
        shown_actions = [slate[p] for p in order]
        values = [lab.action_value(eq, prefix, x) for x in shown_actions]
        ranking = [[labels[j] for j in range(len(slate)) if values[j] == v] for v in sorted(set(values), reverse=True)]
        out["coreact_council"].append((council.ranking_call(council.build_messages(
            asked_q, prefix, list(zip(labels, shown_actions))), labels, GREEDY), _groups(ranking)))
        # the rubric of the next step after the same prefix, as the method's own oracle writes it from the steps
        point = BranchingPoint(question_id=eq.id, question=asked_q, depth=k, prefix=traj.steps[:k])
        out["coreact_generator"].append((JudgeCall(generator_messages(
            asked_q, point.prefix, GENERATOR_LIMITS[0], max_chars=GENERATOR_LIMITS[1]), _rubric_reply, GREEDY),
            _rubric_reply(oracle_rubric(point, eq))))

        # the rest ask about questions with a chain of two facts or more, the whole episode against its cut
        traj, dq = deep[i % len(deep)]
        nl = "\n" * (i // len(deep))
        full, cut = trajectory_text(traj) + nl, trajectory_text(_half(traj)) + nl
        out["arbor_rar_checklist"].append((JudgeCall(rar.checklist_messages(dq.model_copy(update={"id": f"{i}"}),
                                                                            5, 10 + i), lambda t: rar.parse_items(t, 10),
                                                     GREEDY), dq))
        items = lab.rar_items(dq, full=i % 4 < 2)
        text = full if i % 2 == 0 else cut
        share = sum(lab.criterion_met(dq, it, text) for it in items) / len(items)
        out["arbor_rar_rating"].append((JudgeCall(rar.rating_messages(dq.question, text, items), rar.parse_rating,
                                                  GREEDY), 1 + round(9 * share)))
        wrong = next(o.answers[0] for o in qs[i % len(qs):] + qs if not exact_match(o.answers[0], dq.answers))
        rated = (traj if i % 4 < 2 else _half(traj)).model_copy(update={
            "question": dq.question + nl.replace("\n", " "), "final_answer": dq.answers[0] if i % 2 == 0 else wrong})
        shown_facts = lab.found_facts(dq, render_prefix([s for s in rated.steps if s.final_answer is None], 400))
        out["coreact_best_of_n"].append((JudgeCall(BEST_OF_N.scorer_messages(rated), _score_reply, GREEDY),
                                         1 + round(9 * shown_facts / len(dq.gold_chain)) if i % 2 == 0 else 1))
        plan = InductionPlan(kind="pairs", reason="contrast", pairs=[(0, 1)])
        out["arbor_induction"].append((induction.writing_call(induction.induction_messages(
            dq.question, None, [full, cut], [1.0, 0.0], plan, [], 2), 2, 768), (dq, full, cut)))
        draft = Draft(id=f"d{i}", rubric=_criterion(dq), question_id=dq.id, question=dq.question, step=0, variance=0.1,
                      pearson=None)
        common = [RubricText(**lab.GENERAL)] if i % 2 else [_criterion(dq)]
        last = dq.gold_chain[-1].answer  # the draft names the last hop's fact: its first hop in the chain
        hop = lab.hop_standard(next(k for k, h in enumerate(dq.gold_chain, 1) if h.answer == last))["title"]
        out["arbor_consolidation"].append((induction.writing_call(induction.consolidation_messages(
            [draft] * (1 + i // len(deep)), common, 2), 2, 768), (hop, lab.GENERAL["title"]) if i % 2 == 0 else (hop,)))
        attempts = [_blocks(dq, traj, True), _blocks(dq, traj, False)]
        rendered = [stagewise.render_attempt(x, 1500) + nl for x in attempts]
        out["rubricem_generation"].append((JudgeCall(stagewise.generation_messages(
            dq, rendered, [[], []], [], ((1, 4),) * 4), model_parser(stagewise.GeneratedRubrics), GREEDY), True))
        one = attempts[i % 2]
        asked = _stage_rubrics(dq, one)
        out["rubricem_stage_scores"].append((JudgeCall(stagewise.scoring_messages(dq, rendered[i % 2], asked),
                                                       stagewise.covering_sheet(len(asked)), GREEDY),
                                             [lab.stage_score(dq, r.stage, f"{r.title}: {r.description}",
                                                              rendered[i % 2]) for r in asked]))
        order = [0, 1] if i % 4 < 2 else [1, 0]
        both = _stage_rubrics(dq, attempts[0])
        out["rubricem_group_scores"].append((JudgeCall(stagewise.group_scoring_messages(
            dq, [rendered[j] for j in order], both), stagewise.group_sheet(len(both), 2), GREEDY),
            [lab.stage_score(dq, r.stage, f"{r.title}: {r.description}", rendered[j]) for r in both for j in order]))
        facts = [h.answer for h in dq.gold_chain]
        candidates = [reflection.Reflection(f"Critical requirements: {', '.join(facts)}.", "1. Read each page."),
                      reflection.Reflection("Critical requirements: the facts.", "1. Be careful."),
                      reflection.Reflection(f"Pitfalls: it never found {facts[-1]}.", "1. Follow the names.")]
        candidates = candidates[i % 3:] + candidates[:i % 3]
        shown = list(enumerate(candidates, 1))
        judge_messages_ = reflection.ReflectionJudge(None).messages(dq, text, "Plan 1.00" + nl, shown)
        out["rubricem_reflection"].append((JudgeCall(judge_messages_, model_parser(reflection.RatingSheet), GREEDY),
                                           [lab.reflection_rating(dq, f"{c.rubrics}\n{c.takeaways}") for c in candidates]))
        steps = arco.trajectory_steps(traj if i % 2 == 0 else _half(traj))
        padded = dq.model_copy(update={"question": dq.question + " " * (i // len(deep))})
        out["arco_teacher"].append((JudgeCall(arco.teacher_messages(padded, steps, 3 + i % 2),
                                              _teacher_parser(len(steps), 3 + i % 2), GREEDY), [True] * len(steps)))
    measures = {
        "coreact_council": Known(out["coreact_council"], lambda v, t: [_groups(v.groups) == t],
                                 "the same ranking (tie groups) as the oracle's; rho: mean Spearman", _rho_of),
        "coreact_evaluator": Known(out["coreact_evaluator"], _each, "each criterion's verdict"),
        "coreact_slate": Known(out["coreact_slate"], lambda v, t: _each([x for row in v for x in row], t),
                               "each (criterion, action) verdict"),
        "arbor_rar_checklist": Known(out["arbor_rar_checklist"], lambda v, q: [_names_chain(v, q)],
                                     "the checklist names every fact of the chain"),
        "arbor_rar_rating": Known(out["arbor_rar_rating"], _same, "the oracle's 1-10 rating exactly"),
        "coreact_best_of_n": Known(out["coreact_best_of_n"], _same, "the oracle's 1-10 score exactly"),
        "coreact_generator": Known(out["coreact_generator"], _same, "the oracle rubric's criteria exactly"),
        "arbor_induction": Known(out["arbor_induction"], lambda v, t: [_separates(v, *t)],
                                 "the rubric is met by the better attempt and not the worse"),
        "arbor_consolidation": Known(out["arbor_consolidation"], lambda v, t: [tuple(r.title for r in v) == t],
                                     "the drafted hop's standard, and the whole chain's when not in use"),
        "rubricem_generation": Known(out["rubricem_generation"], lambda v, t: [_polarities(v) == t],
                                     "the separating rubrics written, each with the oracle's polarity"),
        "rubricem_stage_scores": Known(out["rubricem_stage_scores"], lambda v, t: _scores([s.score for s in sorted(
            v.scores, key=lambda s: s.index)], t), "each rubric's 0/1/2 (midpoint truths not counted)"),
        "rubricem_group_scores": Known(out["rubricem_group_scores"], lambda v, t: _scores(
            [x for row in v.scores for x in row], t), "each (rubric, attempt) 0/1/2 (midpoint truths not counted)"),
        "rubricem_reflection": Known(out["rubricem_reflection"], lambda v, t: _each(
            [c.within.diagnostic_accuracy for c in sorted(v.candidates, key=lambda c: c.index)],
            [round(x, 3) for x in t]), "each candidate's rating"),
        "arco_teacher": Known(out["arco_teacher"], lambda v, t: _each([_good_step(c) for c in v], t),
                              "each step's criteria are a good step's (no repeat, no early answer)"),
    }
    yes_no = "the oracle's verdict"
    return {kind: measures.get(kind) or Known(out[kind], _same, yes_no) for kind in KINDS_MEASURED}


KINDS_MEASURED = ("answer_correct", "arbor_single", "arbor_winner", "arbor_verdict", "coreact_checklist",
                  "coreact_evaluator", "coreact_criterion", "coreact_slate", "coreact_council", "coreact_best_of_n",
                  "coreact_generator",
                  "arbor_rar_checklist",
                  "arbor_rar_rating", "arbor_induction", "arbor_consolidation", "rubricem_generation",
                  "rubricem_stage_scores", "rubricem_group_scores", "rubricem_reflection", "arco_teacher")


BEST_OF_N = BestOfNAgent(None, None, scorer=None)  # its scorer prompt only
GENERATOR_LIMITS = (4, 160)  # the rubric generator's max_criteria and max_criterion_chars (params.yaml's)


def _rubric_reply(text: str) -> list[str]:
    parsed = parse_rubric(text, GENERATOR_LIMITS[0], max_chars=GENERATOR_LIMITS[1])
    if not parsed.ok:
        raise Unparsed(parsed.error)
    return [c.text for c in parsed.rubric.criteria]


def _score_reply(text: str) -> int | None:
    return parse_json_reply(text, "score", int)


def _teacher_parser(steps: int, k: int):
    return lambda text: arco.parse_teacher_reply(text, steps, k)


def _first(parsed):
    return parsed if isinstance(parsed, str) else parsed[0][0]


def _rho_of(value, truth) -> float:
    return _rho(_groups(value.groups), truth)


def _names_chain(items: list[str], q) -> bool:
    return all(lab.mentions(" ".join(items), h.answer) for h in q.gold_chain)


def _separates(rubrics: list[RubricText], q, better: str, worse: str) -> bool:
    if not rubrics:
        return False
    crit = f"{rubrics[0].title} {rubrics[0].description}"
    return lab.criterion_met(q, crit, better) and not lab.criterion_met(q, crit, worse)


def _polarities(drafts: stagewise.GeneratedRubrics) -> bool:
    stages = [getattr(drafts, f"stage_{k + 1}") for k in range(4)]
    written = [(r.title, negative) for s in stages for negative, rs in ((False, s.positive_rubrics),
                                                                       (True, s.negative_rubrics)) for r in rs]
    return bool(written) and all(negative == (title in (lab.REPEATS, lab.STRAYS)) for title, negative in written)


def _good_step(criteria: list[str]) -> bool:
    return not criteria[0].endswith(" again") and criteria[0] != "answers at once"


def dial_table(params, dials: Sequence[Dial], n: int = 200, seed: int = 99) -> list[dict]:
    """One row per (kind, dial): the measured agreement with the oracle (over ``verdicts``, a reply may hold
    several), its 95% interval, what it means, and for a ranking the mean Spearman rho."""
    world = build_lab_world(params, seed)
    episodes, _ = compact_episodes(world, world.questions, params.agent)
    known = known_judgments(world, episodes, n)
    rows = []
    for dial in dials:
        judge = SimulatedJudge(Oracle(world.questions), dial)
        for kind, k in known.items():
            async def run(calls=k.calls, judge=judge):
                return await asyncio.gather(*(ask(judge, c) for c, _ in calls))

            results = asyncio.run(run())
            counted = [x for r, (_, truth) in zip(results, k.calls) if r.ok for x in k.agree(r.value, truth)
                       if x is not None]
            agree, total = sum(counted), len(counted)
            ci = binomtest(agree, total).proportion_ci(0.95) if total else None
            row = {"kind": kind, "flip_rate": dial.flip_rate, "position_bias": dial.position_bias,
                   "bias": dial.bias, "bias_rate": dial.bias_rate, "n": len(k.calls), "verdicts": total,
                   "agreement": agree / total if total else float("nan"), "low": ci.low if ci else float("nan"),
                   "high": ci.high if ci else float("nan"), "failed": sum(not r.ok for r in results),
                   "measure": k.measure, "example": results[0].text if results[0].ok else results[0].describe()}
            if k.graded is not None:
                rhos = [k.graded(r.value, truth) for r, (_, truth) in zip(results, k.calls) if r.ok]
                row["rho"] = sum(rhos) / len(rhos) if rhos else float("nan")
            rows.append(row)
    return rows
