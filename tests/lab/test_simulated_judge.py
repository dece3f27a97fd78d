"""The simulated judge answers every judgment kind the four methods make from the world oracle, through the methods'
own prompts and parsers and the one judge interface (``ask``), and its dial does what it says: for every kind the
agreement with the oracle is 1 at flip rate 0 and 0.8 within a binomial interval at flip rate 0.2 (each verdict of a
reply counted, :mod:`components.lab.dial`), position bias picks the first attempt, the keyword bias passes a
keyword, and a prompt it cannot answer is a failed call, never a verdict."""

from __future__ import annotations

import asyncio

import pytest
from scipy.stats import binom

from components.judges.answer import CORRECT, judge_prompt, parse_verdict
from components.judges.call import JudgeCall, ask
from components.judges.render import trajectory_text
from components.lab.dial import KINDS_MEASURED, dial_table, known_judgments
from components.lab.judges import criterion_met
from components.lab.world import build_lab_world, compact_episodes
from components.llm.backends.simulated import KINDS, Dial, Oracle, SimulatedJudge
from components.llm.base import Sampling, system, user
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_judge import (
    parse_winner,
)
from components.params_load import load_params

N = 240


@pytest.fixture(scope="module")
def lab():
    params = load_params("params.yaml", overlays=["lab"], overrides=["data.n_train=80", "data.n_dev=20", "data.n_test=20"])
    world = build_lab_world(params, 99)
    episodes, _ = compact_episodes(world, world.questions, params.agent)
    return world, episodes


def _judge(world, **dial) -> SimulatedJudge:
    return SimulatedJudge(Oracle(world.questions), Dial(**dial))


def _half(trajectory):
    """The episode cut after its first turn: it misses the later hops' facts and gives no answer."""
    return trajectory.model_copy(update={"steps": trajectory.steps[:1], "final_answer": None,
                                         "finish_reason": "max_turns"})


def _criterion(question) -> RubricText:
    last = question.gold_chain[-1]
    return RubricText(title=f"finds that {last.answer} answers the last hop",
                      description=f"reads the paragraph that says {last.answer}", counter_description="stops early")


def _answer_calls(world):
    """(call, oracle truth) pairs: correct answers written differently (case), and another question's answer."""
    qs, out = world.questions, []
    for i in range(N):
        q, other = qs[i % len(qs)], qs[(i + 7) % len(qs)]
        right = i % 2 == 0 and True
        pred = q.answers[0].upper() + (" " * (i // len(qs))) if right else other.answers[0]
        right = right or pred.casefold() == q.answers[0].casefold()
        call = JudgeCall(judge_prompt(q.model_copy(update={"id": f"{q.id}-{i}"}), pred), parse_verdict,
                         Sampling(temperature=0.0, max_tokens=16), choice=CORRECT)
        out.append((call, right, f"{i}"))
    return out


def _winner_calls(world, episodes):
    return known_judgments(world, episodes, N)["arbor_winner"].calls


@pytest.fixture(scope="module")
def table():
    params = load_params("params.yaml", overlays=["lab"], overrides=["data.n_train=80", "data.n_dev=20", "data.n_test=20"])
    rows = dial_table(params, [Dial(), Dial(flip_rate=0.2)], n=N)
    return {(r["kind"], r["flip_rate"]): r for r in rows}


def test_every_kind_the_judge_answers_is_measured():
    assert set(KINDS_MEASURED) == set(KINDS.names())


@pytest.mark.parametrize("kind", KINDS_MEASURED)
def test_agreement_with_the_oracle_follows_the_flip_rate(table, kind):
    exact, noisy = table[kind, 0.0], table[kind, 0.2]
    assert exact["failed"] == noisy["failed"] == 0, exact["example"]
    assert exact["agreement"] == 1.0 and exact["verdicts"] >= N
    lo, hi = binom.interval(0.999, noisy["verdicts"], 0.8)
    assert lo <= noisy["agreement"] * noisy["verdicts"] <= hi, (kind, noisy["agreement"], noisy["verdicts"])


def test_both_verdicts_occur_where_a_kind_has_two(lab):
    """A judge that always said one thing could not agree at 1.0 with these sets."""
    world, episodes = lab
    known = known_judgments(world, episodes, N)
    for kind in ("answer_correct", "arbor_single", "arbor_verdict", "coreact_checklist", "coreact_criterion"):
        assert len({truth for _, truth in known[kind].calls}) == 2, kind
    written = {truth for _, truth in known["arbor_consolidation"].calls}
    assert {len(t) for t in written} == {1, 2} and len({t[0] for t in written}) >= 2  # hops differ; chain or not
    assert len({truth for _, truth in known["arbor_winner"].calls}) >= 2
    assert len({tuple(truth) for _, truth in known["coreact_evaluator"].calls}) >= 3
    assert len({truth for _, truth in known["arbor_rar_rating"].calls}) >= 3
    assert {x for _, truth in known["rubricem_stage_scores"].calls for x in truth} >= {0, 2}
    assert all(len(truth) >= 2 for _, truth in known["coreact_council"].calls)  # never one tie group


def test_council_rho_follows_the_flip_rate(table):
    """A ranking reversed on a flip: the mean Spearman rho against the oracle's is 1 at flip 0, about 0.6 at 0.2."""
    assert table["coreact_council", 0.0]["rho"] == 1.0
    assert 0.4 <= table["coreact_council", 0.2]["rho"] <= 0.8


def test_position_bias_picks_the_first_attempt(lab):
    world, episodes = lab
    calls = _winner_calls(world, episodes)

    async def run(judge):
        return await asyncio.gather(*(ask(judge, call) for call, _ in calls))

    results = asyncio.run(run(_judge(world, position_bias=1.0)))
    assert {r.value for r in results} == {"A"}
    half = asyncio.run(run(_judge(world, position_bias=0.5)))
    truth_a = sum(truth == "A" for _, truth in calls) / N
    share = sum(r.value == "A" for r in half) / N  # the oracle's A pairs, and half of the others by position
    lo, hi = binom.interval(0.999, N, truth_a + (1 - truth_a) / 2)
    assert lo / N <= share <= hi / N


def test_keyword_bias_passes_any_answer_with_the_keyword(lab):
    world, _ = lab
    q = world.questions[0]
    wrong = world.questions[1].answers[0] + " certainly"
    call = JudgeCall(judge_prompt(q, wrong), parse_verdict, Sampling(temperature=0.0, max_tokens=16), choice=CORRECT)
    assert asyncio.run(ask(_judge(world), call)).value is False
    assert asyncio.run(ask(_judge(world, bias="keyword", bias_rate=1.0), call)).value is True
    plain_wrong = JudgeCall(judge_prompt(q, world.questions[1].answers[0]), parse_verdict,
                            Sampling(temperature=0.0, max_tokens=16), choice=CORRECT)
    assert asyncio.run(ask(_judge(world, bias="keyword", bias_rate=1.0), plain_wrong)).value is False


def test_the_same_prompt_gets_the_same_verdict(lab):
    world, _ = lab
    calls = _answer_calls(world)[:40]
    judge = _judge(world, flip_rate=0.5, seed=3)
    first = [asyncio.run(ask(judge, c)).value for c, *_ in calls]
    assert first == [asyncio.run(ask(judge, c)).value for c, *_ in calls]
    other = [asyncio.run(ask(_judge(world, flip_rate=0.5, seed=4), c)).value for c, *_ in calls]
    assert other != first  # another seed, other coins


def test_an_unknown_judgment_fails_as_a_call_not_a_score(lab):
    world, _ = lab
    call = JudgeCall([system("Rank these candidates."), user("Question: what?")], parse_winner)
    result = asyncio.run(ask(_judge(world), call))
    assert not result.ok and result.kind == "call_failed" and "no oracle" in result.reason


def test_induction_names_a_fact_the_better_attempt_found_and_the_judge_checks_it(lab):
    from components.judges.call import Tally
    from components.methods.arbor.contrast import InductionPlan
    from components.methods.arbor.induction import consolidate, induce

    world, episodes = lab
    traj, q = next((t, q) for t, q in episodes if len(q.gold_chain) >= 2 and criterion_met(
        q, q.gold_chain[-1].answer, trajectory_text(t)) and not criterion_met(
        q, q.gold_chain[-1].answer, trajectory_text(_half(t))))
    texts = [trajectory_text(traj), trajectory_text(_half(traj))]
    plan = InductionPlan(kind="pairs", reason="contrast", pairs=[(0, 1)])
    tally = Tally()
    rubrics = asyncio.run(induce(_judge(world), q.question, texts, [1.0, 0.0], plan, [], 2, tally))
    assert len(rubrics) == 1 and tally.failed == 0
    rubric = rubrics[0]
    crit = f"{rubric.title} {rubric.description}"
    assert criterion_met(q, crit, texts[0]) and not criterion_met(q, crit, texts[1])  # the oracle can check it
    flipped = asyncio.run(induce(_judge(world, flip_rate=1.0), q.question, texts, [1.0, 0.0], plan, [], 2, tally))
    assert flipped == []  # the worse attempt found nothing the better did not
    again = asyncio.run(induce(_judge(world), q.question, texts, [1.0, 0.0], plan, rubrics, 2, tally))
    assert rubrics[0] not in again  # an existing rubric is not repeated (the next fact the worse attempt missed is)
    assert callable(consolidate)


def test_a_hop_standard_is_checked_on_any_question(lab):
    """Consolidation's general standards are hop-relative ("takes a second step"): the oracle checks that hop's fact
    of whatever question it is asked about, so one standard separates attempts of every question; a question with
    fewer hops meets it in every attempt (no separation, no reward)."""
    from components.lab.judges import criterion_met, hop_standard

    world, _ = lab
    q = next(q for q in world.questions if len(q.gold_chain) == 2 and q.gold_chain[0].answer != q.gold_chain[1].answer)
    first, second = (h.answer for h in q.gold_chain)
    crit = "{title}: {description}".format(**hop_standard(2))
    assert criterion_met(q, crit, f"search[x] -> ... {second} ...")
    assert not criterion_met(q, crit, f"search[x] -> ... {first} ...")
    assert criterion_met(q, "{title}: {description}".format(**hop_standard(3)), "nothing found")


def test_the_hop_standards_survive_arbors_de_duplication(repo_root):
    """Worded apart: under the run's embedder every pair of standards is below arbor.dedup_threshold, so a
    consolidation that writes them all adds them all to the common pool."""
    import numpy as np

    from components.lab.judges import GENERAL, HOP_STANDARDS
    from components.methods.arbor.memory import RubricText
    from components.retrieval.dense import embed, resolve_embedder

    arbor = load_params(repo_root / "params.yaml", overlays=["lab"]).arbor
    texts = [RubricText(**r).embedding_text() for r in (*HOP_STANDARDS, GENERAL)]
    v = np.asarray(embed(resolve_embedder(arbor.embedder), texts), dtype=np.float64)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    cos = v @ v.T
    assert cos[~np.eye(len(texts), dtype=bool)].max() < arbor.dedup_threshold
