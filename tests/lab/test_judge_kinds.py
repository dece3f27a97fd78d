"""The simulated judge's kinds carry the signal the methods use, asked through each method's own entry point (the
council's Borda, the rubric evaluator's three modes, the criterion-mode verifier, best-of-N's scorer, the rubric generator, RaR's checklist and rating,
RubricEM's stagewise judge and reflection judge, ARCO's teacher annotation): the oracle's own next step ranks and
scores above a stray one, a whole episode above the same episode cut after its first turn, a reflection that names
the chain's facts above a generic one; a flip reverses them. The dial's graded verdicts: a score mirrored on its
scale, a ranking reversed, position bias the order shown, a reply's verdicts each with its own coin."""

from __future__ import annotations

import asyncio

import pytest

from components.judges.call import Tally
from components.judges.render import render_prefix, trajectory_text
from components.lab.judges import REPEATS, STRAYS, criterion_met, hops_done
from components.lab.world import build_lab_world, compact_episodes
from components.llm.backends.simulated import Dial, Judgment, Oracle, Ranking, Score, SimulatedJudge, dialled
from components.llm.base import Sampling
from components.methods.arbor import rar
from components.methods.arco.criteria import annotate, trajectory_steps
from components.methods.coreact import council, rubric_eval
from components.methods.coreact.baselines import BestOfNAgent, parse_json_reply
from components.methods.coreact.rubric_generator import RubricGenerator
from components.methods.coreact.verifier import verify_action
from components.methods.rubricem.reflection import Reflection, ReflectionJudge
from components.methods.rubricem.stagewise_judge import StagewiseJudge
from components.params_load import load_params
from components.schemas import Criterion, Rubric
from components.world.oracle import hop_titles


@pytest.fixture(scope="module")
def lab():
    params = load_params("params.yaml", overlays=["lab"], overrides=["data.n_train=80", "data.n_dev=20", "data.n_test=20"])
    world = build_lab_world(params, 99)
    episodes, _ = compact_episodes(world, world.questions, params.agent)
    deep = [(t, q) for t, q in episodes if len(q.gold_chain) >= 2 and len({h.answer for h in q.gold_chain}) >= 2
            and criterion_met(q, q.gold_chain[-1].answer, trajectory_text(t))
            and not criterion_met(q, q.gold_chain[-1].answer, trajectory_text(_half(t)))]
    return world, episodes, deep


def _judge(world, **dial) -> SimulatedJudge:
    return SimulatedJudge(Oracle(world.questions), Dial(**dial))


def _half(trajectory):
    return trajectory.model_copy(update={"steps": trajectory.steps[:1], "final_answer": None,
                                         "finish_reason": "max_turns"})


def _slate(episodes, deep):
    """A question, the history before its second step, and a slate: the oracle's next action, a stray search, a
    wrong answer."""
    traj, q = deep[0]
    stray = next(t for _, o in episodes for t in hop_titles(o) if t not in hop_titles(q))
    wrong = next(o.answers[0] for _, o in episodes if o.answers[0] not in q.answers)
    return q, render_prefix(traj.steps[:1]), [traj.steps[1].action, f"search[{stray}]", f"finish[{wrong}]"]


# -- the dial on graded verdicts --------------------------------------------------------------------------------
def test_a_flip_mirrors_a_score_and_reverses_a_ranking():
    score = Judgment(Score(2, 0, 2), str, attempts=["x"])
    ranking = Judgment(Ranking.by([3.0, 0.0, 1.0]), str, attempts=["a", "b", "c"])
    assert ranking.truth == Ranking(((0,), (2,), (1,)))
    assert dialled(score, Dial(flip_rate=1.0), "k") == Score(0, 0, 2)
    assert dialled(Judgment(Score(7, 1, 10), str), Dial(flip_rate=1.0), "k") == Score(4, 1, 10)
    assert dialled(ranking, Dial(flip_rate=1.0), "k") == Ranking(((1,), (2,), (0,)))
    assert dialled(ranking, Dial(), "k") == ranking.truth


def test_position_bias_ranks_in_the_order_shown_and_scores_the_first_top():
    ranking = Judgment(Ranking.by([0.0, 3.0, 1.0]), str, attempts=["a", "b", "c"])
    assert dialled(ranking, Dial(position_bias=1.0), "k") == Ranking(((0,), (1,), (2,)))
    first, second = (Judgment(Score(1, 0, 2), str, attempts=["a", "b"], about=i) for i in (0, 1))
    assert dialled(first, Dial(position_bias=1.0), "k").value == 2
    assert dialled(second, Dial(position_bias=1.0), "k").value == 0


def test_keyword_bias_ranks_the_keyword_first():
    ranking = Judgment(Ranking.by([3.0, 0.0]), str, attempts=["search[x]", "finish[certainly y]"])
    assert dialled(ranking, Dial(bias="keyword", bias_rate=1.0), "k") == Ranking(((1,), (0,)))


def test_each_verdict_of_a_reply_has_its_own_coin():
    reply = Judgment.of([Judgment(True, str, attempts=["x"]) for _ in range(200)], tuple)
    assert dialled(reply, Dial(flip_rate=1.0), "k") == (False,) * 200
    flipped = dialled(reply, Dial(flip_rate=0.5), "k").count(False)
    assert 60 < flipped < 140


# -- Co-ReAct ----------------------------------------------------------------------------------------------------
def test_the_council_puts_the_oracle_action_first_and_a_flip_puts_it_last(lab):
    world, episodes, deep = lab
    q, prefix, slate = _slate(episodes, deep)
    judges = [_judge(world)] * 3
    out = asyncio.run(council.judge_slate(judges, q.question, prefix, slate, rng_seed=1))
    assert out.kept and out.consensus == [0, 1, 2]  # next step > stray search > wrong answer
    flipped = asyncio.run(council.judge_slate([_judge(world, flip_rate=1.0)] * 3, q.question, prefix, slate, rng_seed=1))
    assert flipped.consensus == [2, 1, 0]


def test_the_rubric_evaluator_scores_the_next_step_above_a_stray_one_in_every_mode(lab):
    world, episodes, deep = lab
    q, prefix, slate = _slate(episodes, deep)
    nxt = next(t for t, done in zip(hop_titles(q), hops_done(q, prefix)) if not done)
    rubric = Rubric(criteria=[Criterion(text="takes the next step of the chain", weight=1.0),
                              Criterion(text=f"looks up {nxt}", weight=1.0)])
    judge, actions = _judge(world), slate[:2]
    by_action = asyncio.run(rubric_eval.evaluate_actions(judge, q.question, prefix, actions, rubric))
    by_criterion = asyncio.run(rubric_eval.evaluate_criteria(judge, q.question, prefix, actions, rubric))
    side_by_side = asyncio.run(rubric_eval.evaluate_slate(judge, q.question, prefix, actions, rubric,
                                                          orders=[[0, 1], [1, 0]]))
    for scores in (by_action, by_criterion, side_by_side):
        assert [s.score for s in scores] == [1.0, 0.0]
    counted = asyncio.run(rubric_eval.evaluate_actions(judge, q.question, prefix, actions, rubric, count_atomic=True))
    assert counted[0].atomic_count == 1  # the criterion that names a paragraph
    inverted = asyncio.run(rubric_eval.evaluate_criteria(_judge(world, flip_rate=1.0), q.question, prefix, actions,
                                                         rubric))
    assert [s.score for s in inverted] == [0.0, 1.0]


def test_the_criterion_mode_verifier_accepts_the_next_step_and_rejects_a_stray_one(lab):
    world, episodes, deep = lab
    q, prefix, slate = _slate(episodes, deep)
    rubric = Rubric(criteria=[Criterion(text="takes the next step of the chain", weight=1.0)])
    good, stray = (asyncio.run(verify_action(_judge(world), q.question, prefix, "", a, rubric, tau=0.5,
                                             mode="criterion")) for a in slate[:2])
    assert good.accepted and not stray.accepted and not good.failed


def test_best_of_n_scores_a_supported_right_answer_highest(lab):
    world, _, deep = lab
    traj, q = deep[0]
    agent = BestOfNAgent(None, None, scorer=None)

    def score(trajectory, **dial) -> int | None:
        out = asyncio.run(_judge(world, **dial).chat(agent.scorer_messages(trajectory), Sampling(max_tokens=16)))
        return parse_json_reply(out.text, "score", int)

    cut = _half(traj).model_copy(update={"final_answer": q.answers[0]})
    wrong = traj.model_copy(update={"final_answer": next(o.answers[0] for _, o in deep if o.answers[0] not in q.answers)})
    assert score(traj) == 10 and 1 < score(cut) < 10 and score(wrong) == 1
    assert score(traj, flip_rate=1.0) == 1 and score(cut, flip_rate=1.0) == 11 - score(cut)



def test_the_rubric_generator_names_the_next_hop_and_a_flip_misleads_the_verifier(lab):
    """Asked through the method's own generator (its prompt, its strict parser), the simulated generator writes the
    next hop's lookup, then the answer once every hop is shown; the criterion-mode verifier accepts the oracle's next
    step under that rubric and rejects it under a flipped one (a wrong hop's)."""
    world, episodes, deep = lab
    traj, q = deep[0]

    def rubric(k: int, **dial):
        out = asyncio.run(RubricGenerator(_judge(world, **dial), max_chars=160).generate(q.question, traj.steps[:k]))
        assert out.ok, out.error
        return out.rubric

    first, last = rubric(0), rubric(len(traj.steps) - 1)
    assert first.criteria[0].text == f"Looks up the fact: {q.gold_chain[0].question}"
    assert last.criteria[0].text == f"Gives the final answer {q.answers[0]}"
    wrong = rubric(0, flip_rate=1.0)
    assert wrong.criteria[0].text == f"Looks up the fact: {q.gold_chain[-1].question}"  # a jump ahead

    def accepted(r, action: str) -> bool:
        v = asyncio.run(verify_action(_judge(world), q.question, "", "", action, r, tau=0.4, mode="criterion"))
        assert not v.failed
        return v.accepted

    _, _, slate = _slate(episodes, deep)
    assert accepted(first, traj.steps[0].action) and not accepted(first, slate[1])
    assert not accepted(wrong, traj.steps[0].action)

# -- ARBOR's RaR -------------------------------------------------------------------------------------------------
def test_rar_checklist_names_the_chain_and_its_rating_ranks_the_whole_episode_above_its_cut(lab):
    world, _, deep = lab
    traj, q = deep[0]
    tally = Tally()
    items = asyncio.run(rar.write_checklist(_judge(world), q, 5, 10, tally))
    assert all(any(h.answer in item for item in items) for h in q.gold_chain)
    full, cut = (asyncio.run(rar.rate(_judge(world), q.question, trajectory_text(t), items, tally))
                 for t in (traj, _half(traj)))
    assert full == 1.0 and cut < 0.7 and tally.failures == 0
    short = asyncio.run(rar.write_checklist(_judge(world, flip_rate=1.0), q, 5, 10, tally))
    assert not any(q.gold_chain[-1].answer in item for item in short)
    assert asyncio.run(rar.rate(_judge(world, flip_rate=1.0), q.question, trajectory_text(traj), items, tally)) == 0.0


# -- RubricEM ----------------------------------------------------------------------------------------------------
def _scaffold_blocks(q, traj, full: bool) -> dict:
    last = q.gold_chain[-1].answer
    return {"plan": f"First look up {hop_titles(q)[0]}.", "research": trajectory_text(traj if full else _half(traj)),
            "review": f"{last} is stated in the paragraph read last." if full else None,
            "answer": f"{traj.final_answer} (from {last})" if full else None}


@pytest.mark.parametrize("scoring", ["trajectory", "group"])
def test_stagewise_judge_writes_separating_rubrics_and_scores_the_whole_episode_higher(lab, scoring):
    world, _, deep = lab
    traj, q = deep[0]
    trajs = [traj, _half(traj).model_copy(update={"final_answer": None})]
    blocks = [_scaffold_blocks(q, traj, True), _scaffold_blocks(q, traj, False)]
    judge = StagewiseJudge(generator=_judge(world), evaluator=_judge(world), scoring=scoring)
    drafts, why = asyncio.run(judge.generate(q, trajs, blocks))
    assert why is None and drafts.stage_2.positive_rubrics and not drafts.stage_2.negative_rubrics
    assert judge.admit(q, drafts, step=0) >= 2
    rubrics = judge.buffer(q).rubrics()
    if scoring == "group":
        results, calls, _ = asyncio.run(judge.score_group(q, trajs, blocks, rubrics, step=0))
        assert calls == 2
    else:
        results = [asyncio.run(judge.score(q, t, b, rubrics)) for t, b in zip(trajs, blocks)]
    whole, cut = results
    assert not whole.failed and not cut.failed
    assert whole.scores[1] == 1.0 and cut.scores[1] == 0.0  # research: the separating facts found, or not
    flipped = StagewiseJudge(generator=_judge(world), evaluator=_judge(world, flip_rate=1.0), scoring=scoring)
    flipped.buffers = judge.buffers
    again = asyncio.run(flipped.score(q, trajs[0], blocks[0], rubrics))
    assert again.scores[1] == 0.0


def test_stage_scores_penalise_a_repeated_and_a_stray_lookup(lab):
    world, episodes, deep = lab
    traj, q = deep[0]
    first = traj.steps[0].action
    stray = next(t for _, o in episodes for t in hop_titles(o) if t not in hop_titles(q))
    clean = _scaffold_blocks(q, traj, True)
    repeated = {**clean, "research": clean["research"] + f"\nAction: {first}"}
    strayed = {**clean, "research": clean["research"] + f"\nAction: search[ {stray} ]"}
    judge = StagewiseJudge(generator=_judge(world), evaluator=_judge(world))
    trajs = [traj] * 3
    drafts, _ = asyncio.run(judge.generate(q, trajs, [clean, repeated, strayed]))
    assert {r.title for r in drafts.stage_2.negative_rubrics} == {REPEATS, STRAYS}
    judge.admit(q, drafts, step=0)
    rubrics = [r for r in judge.buffer(q).rubrics() if r.negative]
    scores = [asyncio.run(judge.score(q, traj, b, rubrics)).scores[1] for b in (clean, repeated, strayed)]
    assert scores == [1.0, 0.5, 0.5]  # each flaw costs its rubric (a negative rubric's value is 1 - score / 2)


def test_the_reflection_judge_rates_naming_the_chain_above_generic_advice(lab):
    world, _, deep = lab
    traj, q = deep[0]
    facts = [h.answer for h in q.gold_chain]
    candidates = [Reflection("Critical requirements: the facts.", "1. Be careful."),
                  Reflection(f"Critical requirements: {', '.join(facts)}.", "1. Read each page.")]
    scores, error = asyncio.run(ReflectionJudge(_judge(world)).score(q, trajectory_text(traj), "Plan 1.00", candidates))
    assert error is None and scores[1] > scores[0]
    flipped, _ = asyncio.run(ReflectionJudge(_judge(world, flip_rate=1.0)).score(q, trajectory_text(traj), "Plan 1.00",
                                                                                    candidates))
    assert flipped[1] < flipped[0]


# -- ARCO --------------------------------------------------------------------------------------------------------
def test_the_arco_teacher_names_each_step_s_next_paragraph_then_the_answer(lab):
    world, _, deep = lab
    traj, q = deep[0]
    steps = trajectory_steps(traj)
    criteria, why = asyncio.run(annotate(_judge(world), q, steps, k=3))
    assert why is None and len(criteria) == len(steps) and all(len(c) == 3 for c in criteria)
    assert criteria[0][0] == f"looks up {hop_titles(q)[0]}"
    assert criteria[-1][0] == f"answers {q.answers[0]}"  # every fact found before the last step
    poor, _ = asyncio.run(annotate(_judge(world, flip_rate=1.0), q, steps, k=3))
    assert poor[0][0] == "answers at once" and poor[-1][0].endswith(" again")


def test_a_reply_of_no_verdicts_stays_empty_under_any_dial():
    empty = Judgment.of([], tuple)
    assert dialled(empty, Dial(flip_rate=1.0, position_bias=1.0, bias="length", bias_rate=1.0), "k") == ()
