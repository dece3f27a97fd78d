"""Co-ReAct's rubric reward by hand: perfect / reversed / random rankings, ties on either side, the atomicity and
format terms (the rule and the judge's count; the schema and the released count-and-weights), the repetition gate
on the reply or the criteria, the fewest criteria scored, the pairwise ablation, and an evaluator that fails on
some calls (its rubrics leave the group; nothing is scored 0)."""

import asyncio
import itertools
import json
import math
import random
import re

import pytest
import torch

from components.judges.call import Tally
from components.llm.accounting import Accounting
from components.llm.backends.scripted import ScriptedChatModel, WithLogprobs
from components.llm.base import TokenLogprob, TransientLLMError
from components.llm.middleware import ReliableChatModel
from components.llm.params import MiddlewareParams
from components.methods.coreact.generator_reward import (
    RubricReward,
    atomicity,
    evaluator_model,
    is_atomic,
    listwise_rank_reward,
    pairwise_rank_reward,
    rank_correlation,
    repetition_rate,
)
from components.methods.coreact.params import RubricGeneratorParams
from components.methods.coreact.rubric_eval import parse_yes_no
from components.schemas import BranchingPoint, Candidate, Criterion, Rubric
from components.training.grpo.advantages import group_advantages
from components.training.grpo.episodes import Episode, StepContext, score_matrix

SETTINGS = RubricGeneratorParams()
ACTIONS = ["search[Nightfall Harbor]", "search[Ossian Threll]", "browse[d9]", "search[film]"]


def point(borda=(3.0, 2.0, 1.0, 0.0)):
    return BranchingPoint(question_id="q1", question="Where was the director of Nightfall Harbor born?", depth=0,
                          candidates=[Candidate(action=a, model="m", temperature=0.4) for a in ACTIONS],
                          slate=[0, 1, 2, 3], borda_scores=list(borda), consensus=[0, 1, 2, 3])


def rubric_text(*criteria, weights=None):
    weights = weights or [2, 1][: len(criteria)] + [1] * max(0, len(criteria) - 2)
    return json.dumps({"criteria": [{"criterion": c, "weight": w} for c, w in zip(criteria, weights)]})


GOOD = rubric_text("Looks up the film named in the question", "Uses a search action")


def evaluator(verdicts: dict[str, list[bool]], fail=lambda action, rubric: False, calls=None, count=None):
    """Scripted evaluator: the verdicts of each action; ``fail(action, rubric)`` makes that call fail; ``count``
    (an int, or ``count(action)``) is the atomic count its replies carry, as the judge-atomicity schema asks."""

    def respond(messages, sampling):
        body = messages[1].content
        action = re.search(r"Proposed next action:\n(.+)", body).group(1)
        checklist = body.split("Checklist", 1)[1]
        if calls is not None:
            calls.append(action)
        if fail(action, checklist):
            raise TransientLLMError("evaluator down")
        reply = {"satisfied": verdicts[action]}
        if count is not None:
            reply["atomic_count"] = count(action) if callable(count) else count
        return json.dumps(reply)

    return ScriptedChatModel(respond)


# weights 2:1 -> the four verdict patterns score 1, 2/3, 1/3, 0
IN_ORDER = {ACTIONS[0]: [True, True], ACTIONS[1]: [True, False], ACTIONS[2]: [False, True], ACTIONS[3]: [False, False]}
REVERSED = {a: IN_ORDER[ACTIONS[3 - i]] for i, a in enumerate(ACTIONS)}


def score(model, text=GOOD, pt=None, **kw):
    return asyncio.run(RubricReward(model, SETTINGS, **kw).score(pt or point(), text))


def test_perfect_agreement_gives_one_and_reversed_gives_zero():
    assert listwise_rank_reward([0.9, 0.5, 0.2, 0.0], [3, 2, 1, 0]) == pytest.approx(1.0)
    assert listwise_rank_reward([0.0, 0.2, 0.5, 0.9], [3, 2, 1, 0]) == pytest.approx(0.0)
    best = score(evaluator(IN_ORDER))
    assert best.rho == pytest.approx(1.0) and best.rank == pytest.approx(1.0)
    assert best.total == pytest.approx(1.0)  # both criteria atomic, exact format: 0.75 + 0.15 + 0.10
    worst = score(evaluator(REVERSED))
    assert worst.rank == pytest.approx(0.0) and worst.total == pytest.approx(0.25)


def test_random_rankings_average_one_half():
    consensus = [3.0, 2.0, 1.0, 0.0]
    exhaustive = [listwise_rank_reward(list(p), consensus) for p in itertools.permutations(range(4))]
    assert sum(exhaustive) / 24 == pytest.approx(0.5)
    rng = random.Random(0)
    draws = [listwise_rank_reward([rng.random() for _ in range(4)], consensus) for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(0.5, abs=0.02)


def test_ties_get_average_ranks_and_constant_scoring_gets_chance():
    # scores [1, .5, .5, 0] -> ranks [4, 2.5, 2.5, 1]; consensus ranks [4, 3, 2, 1]:
    # rho = 4.5 / sqrt(4.5 * 5) = 0.948683
    assert rank_correlation([1.0, 0.5, 0.5, 0.0], [3, 2, 1, 0]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    # a tie in the council's Borda scores, same rule on that side: ranks [4, 2.5, 2.5, 1] vs [4, 3, 2, 1]
    assert rank_correlation([3, 2, 1, 0], [6.0, 3.0, 3.0, 0.0]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    assert listwise_rank_reward([0.5, 0.5, 0.5, 0.5], [3, 2, 1, 0]) == 0.5
    flat = score(evaluator({a: [True, False] for a in ACTIONS}))
    assert flat.rho == 0.0 and flat.rank == 0.5 and flat.total == pytest.approx(0.75 * 0.5 + 0.15 + 0.10)
    assert flat.flat and not score(evaluator(IN_ORDER)).flat  # counted, so a run shows an evaluator that cannot rank


def test_atomicity_counts_single_checks():
    assert is_atomic("Looks up the director of the film")
    assert not is_atomic("Looks up the director and the year of the film")
    assert not is_atomic("Searches the film; reads its paragraph")
    assert is_atomic('Searches for "Tom and Jerry" by its exact title')  # a quoted name is not a joiner
    assert not is_atomic(" ".join(["word"] * 26))
    mixed = Rubric(criteria=[Criterion(text="Looks up the director"), Criterion(text="Reads d3 or d4")])
    assert atomicity(mixed) == 0.5
    half = score(evaluator(IN_ORDER), rubric_text("Looks up the film named in the question",
                                                  "Uses a search and not a browse"))
    assert half.atomicity == 0.5 and half.total == pytest.approx(0.75 + 0.15 * 0.5 + 0.10)


def test_format_term_and_unparseable_rubrics():
    calls = []
    chatty = score(evaluator(IN_ORDER, calls=calls), "Here is my rubric:\n" + GOOD + "\nGood luck!")
    assert chatty.format == 0.5 and chatty.total == pytest.approx(0.75 + 0.15 + 0.05)
    fenced = score(evaluator(IN_ORDER), f"```json\n{GOOD}\n```")
    assert fenced.format == 1.0
    calls.clear()
    for bad in ["no json at all", '{"criteria": []}', rubric_text(*[f"check {i}" for i in range(5)]),
                '{"criteria": [{"criterion": "x", "weight": -1}]}', '{"criteria": [{"criterion": "x"}]}']:
        parts = score(evaluator(IN_ORDER, calls=calls), bad)
        assert parts.total == 0.0 and parts.format == 0.0 and parts.rank is None
    assert calls == []  # an unparseable rubric is never sent to the evaluator


CRITERIA_GATE = RubricGeneratorParams(repetition_scope="criteria")


def test_repetition_gate_zeroes_the_reward():
    assert repetition_rate("a b c d a b c d") == pytest.approx(1 - 4 / 5)
    assert repetition_rate("three words only") == 0.0
    calls = []
    looping = rubric_text(*["Search for the director of the film now"] * 3, weights=[1, 1, 1])
    # the criteria alone: the same 8-word check three times, 21 4-grams, 8 distinct -> 1 - 8/21 = 0.62 > 0.4
    parts = asyncio.run(RubricReward(evaluator(IN_ORDER, calls=calls), CRITERIA_GATE).score(point(), looping))
    assert parts.repetition == pytest.approx(1 - 8 / 21) and parts.gated and parts.total == 0.0 and calls == []
    # the whole reply (the default): "criteria", then 3 x (criterion, the 8 words, weight, 1): 34 words, 31 4-grams,
    # 1 + 11 distinct (the first, then one period of 11) -> 1 - 12/31
    parts = score(evaluator(IN_ORDER, calls=calls), looping)
    assert parts.repetition == pytest.approx(1 - 12 / 31) and parts.gated and calls == []
    # twice, weights 2 and 1: 13 4-grams, 8 distinct -> 0.38 on the criteria; on the reply 23 words, 20 4-grams, of
    # which the second copy repeats 7 (the 6 from "criterion" to "now" and "the film now weight") -> 0.35
    twice = rubric_text(*["Search for the director of the film now"] * 2)
    assert asyncio.run(RubricReward(evaluator(IN_ORDER), CRITERIA_GATE).score(point(), twice)).repetition == \
        pytest.approx(1 - 8 / 13)
    assert score(evaluator(IN_ORDER), twice).repetition == pytest.approx(7 / 20)
    assert not score(evaluator(IN_ORDER), twice).gated
    below = rubric_text("Search for the director of the film", "Then read the paragraph about the director")
    assert not score(evaluator(IN_ORDER), below).gated


def test_the_reply_gate_sees_a_loop_outside_the_json_that_the_criteria_gate_does_not():
    reply = GOOD + "\n" + "I hope this helps you. " * 6
    on_reply = score(evaluator(IN_ORDER), reply)
    on_criteria = asyncio.run(RubricReward(evaluator(IN_ORDER), CRITERIA_GATE).score(point(), reply))
    assert on_reply.gated and on_reply.total == 0.0
    assert not on_criteria.gated and on_criteria.total == pytest.approx(0.75 + 0.15 + 0.10 * 0.5)


# ----------------------------------------------------------------------------------- the released code's terms

JUDGE = RubricGeneratorParams(evaluator_mode="action", atomicity="judge")


def test_judge_atomicity_is_the_count_from_the_scoring_calls_over_the_criteria():
    asked = []
    model = evaluator(IN_ORDER, count=1)
    parts = asyncio.run(RubricReward(model, JUDGE).score(point(), GOOD))
    assert parts.atomicity == 0.5 and parts.total == pytest.approx(0.75 + 0.15 * 0.5 + 0.10)
    messages, sampling = model.requests[0]
    assert "atomic_count" in messages[0].content  # the same call that scores the action is asked to count
    assert sampling.json_schema["properties"]["atomic_count"] == {"type": "integer", "minimum": 0, "maximum": 2}
    assert "atomic_count" in sampling.json_schema["required"]
    # one count per action call: the term is their mean over the criteria ((2 + 2 + 1 + 1) / 4 / 2)
    varied = asyncio.run(RubricReward(evaluator(IN_ORDER, count=lambda a: 2 if a in ACTIONS[:2] else 1,
                                                calls=asked), JUDGE).score(point(), GOOD))
    assert varied.atomicity == pytest.approx(0.75) and len(asked) == 4
    # the rule sees both criteria atomic: the two measures are not the same term
    assert score(evaluator(IN_ORDER), GOOD).atomicity == 1.0


@pytest.mark.parametrize("count", [None, -1, 3, 1.5, "2", True])
def test_a_missing_or_impossible_count_is_an_evaluator_failure_never_zero(count):
    def respond(messages, sampling):
        reply = {"satisfied": [True, False]}
        if count is not None:
            reply["atomic_count"] = count
        return json.dumps(reply)

    tally = Tally()
    assert asyncio.run(RubricReward(ScriptedChatModel(respond), JUDGE).score(point(), GOOD, tally=tally)) is None
    assert tally.unparsed == 4


def test_judge_atomicity_in_slate_mode_averages_the_orders_counts():
    orders = iter([2, 1, 1, 2])

    def respond(messages, sampling):
        body = messages[1].content
        shown = re.findall(r"^[A-Z]\. (.+)$", body.split("Proposed next actions", 1)[1].split("Checklist")[0],
                           re.MULTILINE)
        assert "atomic_count" in messages[0].content and "atomic_count" in sampling.json_schema["required"]
        return json.dumps({"verdicts": [[IN_ORDER[a][c] for a in shown] for c in range(2)],
                           "atomic_count": next(orders)})

    settings = RubricGeneratorParams(evaluator_mode="slate", atomicity="judge")
    parts = asyncio.run(RubricReward(ScriptedChatModel(respond), settings, seed=3).score(point(), GOOD))
    assert parts.rho == pytest.approx(1.0) and parts.atomicity == pytest.approx(1.5 / 2)


def test_judge_atomicity_needs_a_structured_evaluator_reply():
    with pytest.raises(ValueError, match="atomicity: judge needs evaluator_mode action or slate"):
        RubricGeneratorParams(evaluator_mode="criterion", atomicity="judge")


def test_count_weights_format_rewards_three_to_five_criteria_and_weights_summing_to_one():
    settings = RubricGeneratorParams(format_reward="count_weights", max_criteria=6)

    def fmt(*weights, around=""):
        text = rubric_text(*[f"Looks up fact {i}" for i in range(len(weights))], weights=list(weights))
        return asyncio.run(RubricReward(evaluator({a: [True] * len(weights) for a in ACTIONS}), settings)
                           .score(point(), around + text + around)).format

    assert fmt(0.5, 0.3, 0.2) == 1.0
    assert fmt(0.5, 0.3, 0.2, around="Here: ") == 1.0  # text around the JSON costs nothing under this rule
    assert fmt(3, 2, 1) == 0.5  # 3 criteria, weights summing to 6
    assert fmt(0.6, 0.4) == 0.5  # weights sum to 1, only 2 criteria
    assert fmt(2, 1) == 0.0
    assert fmt(0.3, 0.3, 0.3) == 1.0 and fmt(0.28, 0.28, 0.28) == 0.5  # |0.9 - 1| < 0.15; |0.84 - 1| is not
    assert fmt(*[1 / 6] * 6) == 0.5  # 6 criteria are one too many
    assert asyncio.run(RubricReward(evaluator(IN_ORDER), settings).score(point(), "no rubric")).format == 0.0


def test_a_rubric_under_min_criteria_earns_only_its_format_and_is_not_evaluated():
    calls = []
    settings = RubricGeneratorParams(min_criteria=2, format_reward="count_weights")
    one = rubric_text("Looks up the film named in the question", weights=[1.0])
    parts = asyncio.run(RubricReward(evaluator(IN_ORDER, calls=calls), settings).score(point(), one))
    assert calls == [] and parts.too_few and parts.rank is None and parts.atomicity is None
    assert parts.format == 0.5 and parts.total == pytest.approx(0.10 * 0.5)  # weight 1.0, but one criterion
    assert asyncio.run(RubricReward(evaluator(IN_ORDER), settings).score(point(), GOOD)).rank == 1.0
    # the default scores a one-criterion rubric like any other
    assert not score(evaluator({a: v[:1] for a, v in IN_ORDER.items()}), one).too_few
    episodes = [Episode(prompt={"prompt": "p", "point": point()}, group=0, rows=[], text=t) for t in [one, GOOD]]
    out = asyncio.run(RubricReward(evaluator(IN_ORDER), settings)(episodes, StepContext(step=1, groups=[0, 0])))
    assert out.metrics["too_few_criteria"] == 1 and out.scores[0] == pytest.approx(0.05)


def test_pairwise_variant_evaluates_one_pair_shared_by_the_group():
    reward = RubricReward(evaluator(IN_ORDER), SETTINGS, pairwise=True, seed=3)
    better, worse = reward.pair_for(point(), step=1)
    assert point().borda_scores[better] > point().borda_scores[worse]
    assert reward.pair_for(point(), step=1) == (better, worse)
    calls = []
    kept = asyncio.run(RubricReward(evaluator(IN_ORDER, calls=calls), SETTINGS, pairwise=True, seed=3)
                       .score(point(), GOOD, step=1))
    assert sorted(calls) == sorted([ACTIONS[better], ACTIONS[worse]]) and kept.rank == 1.0 and kept.rho is None
    flipped = asyncio.run(RubricReward(evaluator(REVERSED), SETTINGS, pairwise=True, seed=3).score(point(), GOOD, step=1))
    assert flipped.rank == 0.0
    tied = asyncio.run(RubricReward(evaluator({a: [True, True] for a in ACTIONS}), SETTINGS, pairwise=True, seed=3)
                       .score(point(), GOOD, step=1))
    assert tied.rank == 0.5
    assert pairwise_rank_reward(0.3, 0.3) == 0.5


def test_failing_evaluator_drops_the_sample_and_the_group_shrinks():
    other = rubric_text("Browses a document", "Searches the director")
    unparsed = rubric_text("Looks up the year", "Searches the city")
    # the evaluator fails on one action of `other` and answers nonsense for `unparsed`
    model = evaluator(IN_ORDER, fail=lambda action, rubric: "Browses a document" in rubric and action == ACTIONS[2])

    def respond(messages, sampling):
        if "Looks up the year" in messages[1].content:
            return "I think it is fine."
        return model._responder(messages, sampling)

    episodes = [Episode(prompt={"prompt": "p", "point": point()}, group=0, rows=[], text=t)
                for t in [GOOD, other, unparsed, "not a rubric", GOOD]]
    out = asyncio.run(RubricReward(ScriptedChatModel(respond), SETTINGS)(episodes, StepContext(step=1, groups=[0] * 5)))
    assert out.scores[1] is None and out.scores[2] is None  # dropped, not 0
    assert out.scores[0] == out.scores[4] == pytest.approx(1.0) and out.scores[3] == 0.0
    assert out.metrics["evaluator_dropped"] == 2 and out.metrics["rubric_parse_failures"] == 1
    assert out.metrics["evaluator/failures"] == 1 + 4  # one failed call + four unparseable replies
    assert out.metrics["evaluator/calls"] == 4 + 4 + 4  # GOOD evaluated once for both episodes
    adv = group_advantages(score_matrix(out.scores), [0] * 5)
    assert torch.isnan(adv[1]).all() and torch.isnan(adv[2]).all()
    kept = adv[[0, 3, 4], 0]
    # the group is the three scored rubrics: [1, 0, 1] -> mean 2/3, population std sqrt(2)/3
    assert kept.tolist() == pytest.approx([(1 - 2 / 3) / (2 ** 0.5 / 3), (0 - 2 / 3) / (2 ** 0.5 / 3),
                                           (1 - 2 / 3) / (2 ** 0.5 / 3)], abs=1e-4)


# ----------------------------------------------------------------------------------------------- slate mode

SLATE = RubricGeneratorParams(evaluator_mode="slate")


def slate_evaluator(verdicts: dict[str, list[bool]], fail=False, reply=None, seen=None):
    """Scripted slate evaluator: reads the labelled actions in the order shown and answers criterion-major."""

    def respond(messages, sampling):
        body = messages[1].content
        shown = re.findall(r"^[A-Z]\. (.+)$", body.split("Proposed next actions", 1)[1].split("Checklist")[0], re.MULTILINE)
        if seen is not None:
            seen.append(shown)
        if fail:
            raise TransientLLMError("evaluator down")
        if reply is not None:
            return reply
        n = len(verdicts[shown[0]])
        return json.dumps({"verdicts": [[verdicts[a][c] for a in shown] for c in range(n)]})

    return ScriptedChatModel(respond)


def test_slate_mode_shows_each_action_at_every_position_and_maps_scores_back():
    seen = []
    model = slate_evaluator(IN_ORDER, seen=seen)
    reward = RubricReward(model, SLATE, seed=3)
    best = asyncio.run(reward.score(point(), GOOD))
    assert len(seen) == 4 and all(sorted(s) == sorted(ACTIONS) for s in seen)  # the whole slate, once per order
    for position in range(4):  # each action shown once at each position
        assert sorted(s[position] for s in seen) == sorted(ACTIONS)
    assert [ACTIONS[i] for i in reward.slate_orders(point(), 4)[0]] in seen
    assert best.rho == pytest.approx(1.0) and best.total == pytest.approx(1.0)
    worst = asyncio.run(RubricReward(slate_evaluator(REVERSED), SLATE, seed=3).score(point(), GOOD))
    assert worst.rho == pytest.approx(-1.0)
    # the orders are drawn per (seed, point): the same for every rubric of a group, not always A = slate[0]
    firsts = set()
    for seed in range(8):
        shown = []
        reward = RubricReward(slate_evaluator(IN_ORDER, seen=shown), SLATE, seed=seed)
        asyncio.run(reward.score(point(), GOOD))
        asyncio.run(reward.score(point(), rubric_text("Names an entity", "Searches")))
        assert sorted(map(tuple, shown[:4])) == sorted(map(tuple, shown[4:]))
        firsts.add(tuple(shown[0]))
    assert len(firsts) > 1


def test_slate_mode_a_position_only_evaluator_scores_flat():
    """The 1.5B's habit on real slates: the same verdicts by position whatever actions it is shown."""
    by_position = '{"verdicts": [[true, false, true, false], [false, true, false, false]]}'
    parts = asyncio.run(RubricReward(slate_evaluator(IN_ORDER, reply=by_position), SLATE, seed=1).score(point(), GOOD))
    assert parts.flat and parts.rho == 0.0 and parts.rank == pytest.approx(0.5)


def test_slate_mode_failures_leave_the_whole_rubric_unscored():
    assert asyncio.run(RubricReward(slate_evaluator(IN_ORDER, fail=True), SLATE).score(point(), GOOD)) is None
    # two criteria but one verdict list, and a list one action short: unparseable, never a zero
    for bad in ('{"verdicts": [[true, false, true, true]]}', '{"verdicts": [[true, true, true], [true, true, true]]}',
                "all of them look fine"):
        assert asyncio.run(RubricReward(slate_evaluator(IN_ORDER, reply=bad), SLATE).score(point(), GOOD)) is None


def test_slate_mode_pairwise_shows_only_the_pair():
    seen = []
    reward = RubricReward(slate_evaluator(IN_ORDER, seen=seen), SLATE, pairwise=True, seed=5)
    parts = asyncio.run(reward.score(point(), GOOD, step=2))
    better, worse = reward.pair_for(point(), 2)
    assert sorted(seen[0]) == sorted([ACTIONS[better], ACTIONS[worse]])
    assert parts.rank == 1.0  # IN_ORDER scores follow the Borda order


# ------------------------------------------------------------------------------------------- criterion mode

CRITERION = RubricGeneratorParams(evaluator_mode="criterion")
GOOD_CRITERIA = ["Looks up the film named in the question", "Uses a search action"]


def criterion_evaluator(verdicts: dict[str, list[bool]], asked=None, reply=None):
    """Scripted yes/no evaluator: finds the one requirement and the one action in the prompt and answers from
    ``verdicts`` (``reply(action, index)`` overrides the answer)."""

    def respond(messages, sampling):
        body = messages[1].content
        requirement = re.search(r"Requirement: (.+)", body).group(1)
        action = re.search(r"Proposed next action: (.+)", body).group(1)
        index = GOOD_CRITERIA.index(requirement)
        if asked is not None:
            asked.append((action, index, sampling.json_schema))
        if reply is not None:
            return reply(action, index)
        return "Yes." if verdicts[action][index] else "no"

    return ScriptedChatModel(respond)


def test_criterion_mode_asks_once_per_criterion_and_action_and_ranks_like_the_action_mode():
    asked = []
    best = asyncio.run(RubricReward(criterion_evaluator(IN_ORDER, asked), CRITERION).score(point(), GOOD))
    assert sorted((a, i) for a, i, _ in asked) == sorted((a, i) for a in ACTIONS for i in range(2))
    assert all(schema is None for *_, schema in asked)  # free text: one word, no JSON
    assert best.rho == pytest.approx(1.0) and best.total == pytest.approx(1.0)
    worst = asyncio.run(RubricReward(criterion_evaluator(REVERSED), CRITERION).score(point(), GOOD))
    assert worst.rho == pytest.approx(-1.0)
    # weights 2 and 1: scores 1, 2/3, 1/3, 0 follow the Borda order exactly; all "yes" is flat (chance)
    every = asyncio.run(RubricReward(criterion_evaluator({}, reply=lambda a, i: "YES"), CRITERION).score(point(), GOOD))
    assert every.flat and every.rho == 0.0


def test_criterion_mode_an_unclear_answer_leaves_the_rubric_unscored_and_counted():
    def reply(action, index):
        return "Maybe, it depends" if (action, index) == (ACTIONS[2], 1) else "no"

    reward = RubricReward(criterion_evaluator({}, reply=reply), CRITERION)
    tally = Tally()
    assert asyncio.run(reward.score(point(), GOOD, tally=tally)) is None
    assert tally.calls == 8 and tally.unparsed == 1 and tally.failures == 0


def test_criterion_mode_with_evaluator_scoring_probability_ranks_what_the_sampled_word_leaves_flat():
    """Every answer is the word yes, so scored from the text every action gets 1 (flat, no rank signal); P(yes)
    falls with the action's Borda place, so scored from probabilities the rubric ranks the slate exactly."""
    p_yes = {a: 0.9 - 0.2 * i for i, a in enumerate(ACTIONS)}

    def roles(name):
        assert name == "slate_judge"

        def respond(messages, sampling):
            action = re.search(r"Proposed next action: (.+)", messages[1].content).group(1)
            p = p_yes[action]
            return WithLogprobs("yes", [TokenLogprob(token="yes", logprob=math.log(p),
                                                     top=(("yes", math.log(p)), ("no", math.log(1 - p))))])

        return ReliableChatModel(ScriptedChatModel(respond), role=name, settings=MiddlewareParams(cache=False),
                                 accounting=Accounting())  # the role's own scoring: text

    def reward(scoring):
        settings = CRITERION.model_copy(update={"evaluator_role": "slate_judge", "evaluator_scoring": scoring})
        return asyncio.run(RubricReward(evaluator_model(roles, settings), settings).score(point(), GOOD))

    assert evaluator_model(roles, CRITERION.model_copy(update={"evaluator_role": "slate_judge"})).scoring == "text"
    assert reward(None).flat and reward("text").flat
    ranked = reward("probability")
    assert not ranked.flat and ranked.rho == pytest.approx(1.0)


@pytest.mark.parametrize("text, verdict", [("yes", True), ("No.", False), ('"Yes" - it searches', True),
                                           ("**no**", False), ("", None), ("The answer is yes", None)])
def test_parse_yes_no_reads_the_first_word_only(text, verdict):
    parsed = parse_yes_no(text)
    assert parsed == verdict if verdict is not None else isinstance(parsed, str)
