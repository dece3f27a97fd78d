"""The stagewise evolving judge with scripted judges: hand-computed stage scores (weights, negative rubrics
inverted, the persistent F1 rubric, absent stages), buffer caps and pruning as a state machine over steps,
and judges that fail or answer malformed JSON on some calls."""

import asyncio
import json
import re

import pytest

from components.methods.rubricem.stagewise_judge import GeneratedRubrics, QuestionBuffer, StagewiseJudge
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import ChatModel, Completion, TransientLLMError
from components.llm.json_schema import json_schema_of
from components.methods.rubricem.stage_returns import StagewiseReward
from components.training.grpo.episodes import Episode, StepContext, score_matrix
from tests.rubricem.trajectories import Q, episode_trajectory


def drafts(**stages):
    """JSON of a generation reply: stages given as {k: [(title, weight, negative), ...]} by stage number."""
    out = {}
    for k in range(1, 5):
        items = stages.get(f"s{k}", [])
        out[f"stage_{k}"] = {
            "positive_rubrics": [{"title": t, "description": f"checks {t}", "weight": w} for t, w, neg in items if not neg],
            "negative_rubrics": [{"title": t, "description": f"checks {t}", "weight": w} for t, w, neg in items if neg]}
    return json.dumps(out)


def respond_with(table, fail=()):
    """A scripted evaluator's replies: the attempt is named by its marker (A, B, C...) in the plan;
    ``table[marker][title]`` is the 0/1/2 score; markers in ``fail`` raise a transient error (a call that still
    failed after the middleware's retries)."""

    def respond(messages, sampling=None):
        text = messages[-1].content
        marker = re.search(r"Two hops\. (\w+)", text).group(1)
        if marker in fail:
            return TransientLLMError("judge overloaded")
        listed = re.findall(r"^(\d+)\. \[[A-Z]+, stage \d \w+\] (.+?): checks", text, re.MULTILINE)
        return json.dumps({"scores": [{"index": int(i), "justification": f"{title} seen", "score": table[marker][title]}
                                      for i, title in listed]})

    return respond


def scorer(table, fail=()):
    return ScriptedChatModel(respond_with(table, fail), name="evaluator")


GENERATION = drafts(s1=[("Names both hops", 2, False)],
                    s2=[("Searches the town", 3, False), ("Repeats a search", 1, True)],
                    s3=[("Cites each fact", 2, False)],
                    s4=[("Gives only the river", 1, False)])
TABLE = {
    "A": {"Names both hops": 2, "Searches the town": 2, "Repeats a search": 0, "Cites each fact": 1,
          "Gives only the river": 2},
    "B": {"Names both hops": 1, "Searches the town": 1, "Repeats a search": 2, "Gives only the river": 2},
    "C": {"Names both hops": 0, "Searches the town": 1, "Repeats a search": 1, "Cites each fact": 0,
          "Gives only the river": 0},
}


def group():
    return [episode_trajectory("A"), episode_trajectory("B", review=False), episode_trajectory("C", answer="Danube")]


def test_stage_scores_by_hand():
    generator = ScriptedChatModel([GENERATION], name="generator")
    judge = StagewiseJudge(generator, scorer(TABLE))
    results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    a, b, c = results[0]
    # A: plan 2/2; research (3*1 + 1*(1-0)) / 4; review 1/2; answer (3*F1 + 1*1) / 4 with F1("Ammel") = 1
    assert a.scores == pytest.approx([1.0, 1.0, 0.5, 1.0])
    # B has no review stage: it scores 0 there (its review rubric is not asked); research (3*.5 + 1*(1-1)) / 4
    assert b.scores == pytest.approx([0.5, 0.375, 0.0, 1.0])
    # C answered "Danube": F1 0; research (3*.5 + 1*.5) / 4
    assert c.scores == pytest.approx([0.0, 0.5, 0.0, 0.0])
    assert metrics["judge/rubrics_added"] == 5 and metrics["judge/scoring_calls"] == 3
    assert metrics["judge/generation_failures"] == 0 and metrics["judge/scoring_failures"] == 0
    assert metrics["stage/research_mean"] == pytest.approx((1.0 + 0.375 + 0.5) / 3)
    evaluator_prompts = [m[-1].content for m, _ in judge.evaluator.requests]
    b_prompt = next(p for p in evaluator_prompts if "Two hops. B" in p)
    assert "Cites each fact" not in b_prompt and "(this stage never happens)" in b_prompt
    # generation saw the group's attempts and their own rubrics as references; calls asked for structured output
    gen_prompt = generator.requests[0][0][-1].content
    assert "=== Attempt 3 ===" in gen_prompt and "- Attempt 1: - town of Ossian Threll" in gen_prompt
    assert generator.requests[0][1].json_schema == json_schema_of(GeneratedRubrics)
    assert "$ref" not in json.dumps(json_schema_of(GeneratedRubrics))
    assert "review 0.50" in a.feedback() and "Searches the town" in a.feedback()


def test_buffer_pruning_lowest_variance_first_unscored_last_older_first():
    buf = QuestionBuffer(question_id="q")
    for step, title in [(1, "r1"), (1, "r2"), (2, "r3"), (2, "r4")]:
        buf.add(1, title, "d", 2, False, step)
    assert buf.add(1, " R1 ", "again", 3, False, 3) is None  # same title: not added twice
    removed = buf.prune(1, 2, {"s1-1": 0.25, "s1-2": 0.0, "s1-3": None, "s1-4": 0.0})
    assert [r.title for r in removed] == ["r2", "r4"] and [r.title for r in buf.active[1]] == ["r1", "r3"]
    buf.add(1, "r5", "d", 1, False, 4)
    removed = buf.prune(1, 2, {"s1-1": 0.1, "s1-3": 0.1, "s1-5": 0.1})  # a three-way tie: the oldest goes
    assert [r.title for r in removed] == ["r1"]
    assert buf.prune(1, 2, {}) == []  # at the cap: nothing to do


def test_caps_and_pruning_over_steps_keep_persistent_rubrics():
    # step 1 proposes 4 answer rubrics (cap 3) and 3 research rubrics (cap 2)
    step1 = drafts(s2=[("Searches the town", 3, False), ("Browses", 1, False), ("Repeats a search", 1, True)],
                   s4=[("Short", 1, False), ("Names a river", 2, False), ("Hedges", 1, True), ("Cites", 1, False)])
    step2 = drafts(s2=[("Browses", 2, False), ("Reads the river", 2, False)])
    scores = {m: {"Searches the town": s, "Browses": 1, "Repeats a search": r, "Short": sh, "Names a river": n,
                  "Hedges": h, "Cites": 0, "Reads the river": rr}
              for m, s, r, sh, n, h, rr in [("A", 2, 0, 2, 2, 0, 2), ("B", 0, 0, 1, 2, 2, 0), ("C", 1, 1, 2, 1, 1, 2)]}
    judge = StagewiseJudge(ScriptedChatModel([step1, step2]), scorer(scores))
    asyncio.run(judge.judge_groups([(Q, group())], step=1))
    buf = judge.buffer(Q)
    # research: "Browses" gave 1 everywhere (variance 0) -> pruned; answer: "Cites" always 0 -> pruned
    assert [r.title for r in buf.active[1]] == ["Searches the town", "Repeats a search"]
    assert [r.title for r in buf.active[3]] == ["Short", "Names a river", "Hedges"]
    assert [r.id for r in buf.persistent] == ["p-answer"]
    # step 2: "Browses" is proposed again (it was pruned, so it returns) with a new rubric; 4 > cap 2 again:
    # Browses (variance 0) and "Repeats a search" (values 1, 1, .5) are now the least discriminative
    asyncio.run(judge.judge_groups([(Q, group())], step=2))
    assert [r.title for r in buf.active[1]] == ["Searches the town", "Reads the river"]
    assert [r.id for r in buf.persistent] == ["p-answer"]
    # buffers survive a checkpoint as JSON
    restored = StagewiseJudge(ScriptedChatModel([]), scorer(scores))
    restored.load_state_dict(json.loads(json.dumps(judge.state_dict())))
    assert restored.buffer(Q).model_dump() == buf.model_dump()


def test_failed_and_malformed_scoring_fall_back_to_the_answer_score():
    def malformed_for_c(messages, sampling):
        text = messages[-1].content
        if "Two hops. C" in text:
            return '{"scores": [{"index": 0, "justification": "x", "score": 2}]}'  # skips the other indices
        return respond_with(TABLE, fail={"B"})(messages, sampling)

    judge = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(malformed_for_c))
    results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    a, b, c = results[0]
    assert a.scores == pytest.approx([1.0, 1.0, 0.5, 1.0]) and not a.failed
    assert b.failed and "judge overloaded" in b.error and b.scores == [None, None, None, 1.0]  # F1 only
    assert c.failed and "expected each of 0..4 once" in c.error and c.scores == [None, None, None, 0.0]
    assert metrics["judge/scoring_failures"] == 2 and metrics["judge/fallback_fraction"] == pytest.approx(2 / 3)
    assert metrics["judge/failure/call_TransientLLMError"] == 1 and metrics["judge/failure/coverage"] == 1
    assert metrics["stage/plan_missing"] == 2
    # the failed episodes' missing stages become NaN for the trainer, never 0
    m = score_matrix([r.scores for r in results[0]])
    assert m.shape == (3, 4) and int(m.isnan().sum()) == 6


def test_failed_generation_adds_nothing_and_is_counted(caplog):
    judge = StagewiseJudge(ScriptedChatModel([TransientLLMError("down")]), ScriptedChatModel([]))
    with caplog.at_level("WARNING", logger="components.methods.rubricem.stagewise_judge"):
        results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    assert metrics["judge/generation_failures"] == 1 and metrics["judge/rubrics_added"] == 0
    assert metrics["judge/flat_groups"] == 0  # nothing was judged: not a group the judge scored alike
    assert metrics["judge/failure/call_TransientLLMError"] == 1
    assert f"rubric generation for {Q.id} failed: call failed: TransientLLMError: down" in caplog.text
    assert metrics["judge/scoring_calls"] == 0  # nothing to ask an LLM: only the persistent F1 rubric
    assert [r.scores for r in results[0]] == [[None, None, None, 1.0], [None, None, None, 1.0],
                                              [None, None, None, 0.0]]
    bad_json = StagewiseJudge(ScriptedChatModel([('{"stage_1": {"positive_rubrics": [{"title": "t", '
                                                 '"description": "d", "weight": 5}]}}')]), ScriptedChatModel([]))
    _, metrics = asyncio.run(bad_json.judge_groups([(Q, group())], step=1))
    assert metrics["judge/generation_failures"] == 1 and bad_json.buffer(Q).rubrics(0) == []
    assert metrics["judge/failure/schema"] == 1


class Slow(ChatModel):
    """Counts how many calls are in flight at once."""

    def __init__(self, reply):
        self.reply, self.live, self.peak = reply, 0, 0

    async def _complete(self, messages, sampling):
        self.live += 1
        self.peak = max(self.peak, self.live)
        await asyncio.sleep(0.01)
        self.live -= 1
        text = self.reply(messages) if callable(self.reply) else self.reply
        return Completion(texts=[text], model="slow")


def test_reward_runs_calls_concurrently_and_leaves_results_for_the_reflection_judge():
    q2 = Q.model_copy(update={"id": "q2"})
    generator = Slow(GENERATION)
    evaluator = Slow(respond_with(TABLE))
    reward = StagewiseReward(StagewiseJudge(generator, evaluator))
    trajs = group() + group()
    episodes = [Episode(prompt=Q if i < 3 else q2, group=i // 3, rows=[], info={"trajectory": t})
                for i, t in enumerate(trajs)]
    out = asyncio.run(reward(episodes, StepContext(step=1, groups=[e.group for e in episodes])))
    assert generator.peak == 2 and evaluator.peak == 6
    assert out.scores[0] == pytest.approx([1.0, 1.0, 0.5, 1.0]) and out.scores[3] == out.scores[0]
    assert episodes[4].info["stagewise"].scores == pytest.approx([0.5, 0.375, 0.0, 1.0])
    assert set(reward.judge.buffers) == {"q1", "q2"}


def group_respond(table, reply=None):
    """A scripted group scorer: finds each shown attempt's marker, in the order shown, and answers a row per rubric
    with ``table[marker][title]`` (0 where the table has no entry); ``reply(call_index)`` overrides the answer."""
    seen = []

    def respond(messages, sampling=None):
        text = messages[-1].content
        markers = re.findall(r"=== Attempt [A-Z] ===\n\[Stage 1: Plan\]\n<think>Two hops\. (\w+)", text)
        listed = re.findall(r"^(\d+)\. \[[A-Z]+, stage \d \w+\] (.+?): checks", text, re.MULTILINE)
        seen.append((markers, sampling.json_schema))
        if reply is not None:
            return reply(len(seen) - 1)
        return json.dumps({"scores": [[table[m].get(title, 0) for m in markers] for _, title in listed]})

    return respond, seen


def test_group_scoring_shows_each_attempt_at_every_position_and_maps_scores_back():
    orders = set()
    for seed in range(4):
        respond, seen = group_respond(TABLE)
        judge = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(respond), scoring="group", seed=seed)
        results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
        a, b, c = results[0]
        # the same hand-computed scores as one call per trajectory (test_stage_scores_by_hand)
        assert a.scores == pytest.approx([1.0, 1.0, 0.5, 1.0])
        assert b.scores == pytest.approx([0.5, 0.375, 0.0, 1.0])
        assert c.scores == pytest.approx([0.0, 0.5, 0.0, 0.0])
        assert len(seen) == 3 and metrics["judge/scoring_calls"] == 3 and metrics["judge/flat_groups"] == 0
        shown = [markers for markers, _ in seen]
        assert sorted(map(tuple, shown)) == sorted(tuple("ABC"[i] for i in o) for o in judge.group_orders(Q, 1, 3))
        for position in range(3):
            assert sorted(m[position] for m in shown) == ["A", "B", "C"]
        rows = seen[0][1]["properties"]["scores"]
        assert rows["minItems"] == rows["maxItems"] == 5 and rows["items"]["minItems"] == rows["items"]["maxItems"] == 3
        assert metrics["judge/attempt_spread"] > 0
        orders.add(tuple(shown[0]))
    assert len(orders) > 1  # the orders are drawn, not the rollout order


def test_a_judge_that_scores_by_position_gives_a_flat_group():
    """The 1.5B's reply on a real group: the same descending row for every rubric, whatever it was shown."""
    def by_position(call):
        return json.dumps({"scores": [[2, 1, 0]] * 5})

    respond, _ = group_respond(TABLE, reply=by_position)
    judge = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(respond), scoring="group")
    results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    a, b, c = results[0]
    assert a.scores[0] == b.scores[0] == c.scores[0] == pytest.approx(0.5)  # (2 + 1 + 0) / 3 / 2 each
    assert a.scores[1] == pytest.approx(c.scores[1])
    assert metrics["judge/position_spread"] == pytest.approx(1.0) and metrics["judge/attempt_spread"] < 0.2
    # B never reaches the review stage: its stage is 0 whatever the judge said, so B's mean differs a little


def test_one_failed_order_fails_the_whole_group():
    def second_fails(call):
        return TransientLLMError("judge overloaded") if call == 1 else json.dumps({"scores": [[2, 1, 0]] * 5})

    respond, seen = group_respond(TABLE, reply=second_fails)
    judge = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(respond), scoring="group")
    results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    assert len(seen) == 3 and all(r.failed for r in results[0])
    assert [r.scores for r in results[0]] == [[None, None, None, 1.0], [None, None, None, 1.0], [None, None, None, 0.0]]
    assert "judge/position_spread" not in metrics


def test_group_orders_are_drawn_per_seed_step_and_question():
    judge = StagewiseJudge(ScriptedChatModel([]), ScriptedChatModel([]), scoring="group", seed=3)
    assert judge.group_orders(Q, 2, 4) == judge.group_orders(Q, 2, 4)
    assert len({tuple(judge.group_orders(Q, step, 4)[0]) for step in range(8)}) > 1


@pytest.mark.parametrize("reply, why", [
    (TransientLLMError("judge overloaded"), "call_TransientLLMError"),
    ('{"scores": [[2, 2, 2]]}', "coverage"),                 # one row for five rubrics
    ('{"scores": [[2, 2], [2, 2], [2, 2], [2, 2], [2, 2]]}', "coverage"),  # two scores for three attempts
    ('{"scores": [[3, 2, 2], [2, 2, 2], [2, 2, 2], [2, 2, 2], [2, 2, 2]]}', "schema"),  # off the 0/1/2 scale
    ("all of them look fine", "no_json"),
])
def test_a_failed_or_misshapen_group_call_fails_every_attempt_of_the_group(reply, why):
    respond, _ = group_respond(TABLE, reply=lambda call: reply)
    judge = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(respond), scoring="group")
    results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    a, b, c = results[0]
    assert all(r.failed for r in results[0])
    assert [a.scores, b.scores, c.scores] == [[None, None, None, 1.0], [None, None, None, 1.0], [None, None, None, 0.0]]
    assert metrics["judge/scoring_failures"] == 3 and metrics[f"judge/failure/{why}"] == 3
    assert metrics["judge/flat_groups"] == 0  # a failed group is not a flat one


def test_flat_groups_counts_groups_the_judge_scored_alike():
    same = {m: {"Names both hops": 2, "Searches the town": 2, "Repeats a search": 0, "Cites each fact": 2,
                "Gives only the river": 2} for m in "ABC"}
    respond, _ = group_respond(same)
    judge = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(respond), scoring="group")
    trajs = [episode_trajectory("A"), episode_trajectory("B"), episode_trajectory("C", answer="Danube")]
    results, metrics = asyncio.run(judge.judge_groups([(Q, trajs)], step=1))
    assert metrics["judge/flat_groups"] == 1  # the answers differ (F1 1, 1, 0) but the judged stages do not
    assert [r.scores[3] for r in results[0]] != [results[0][0].scores[3]] * 3


def test_unknown_scoring_mode_is_refused():
    with pytest.raises(ValueError, match="scoring must be one of"):
        StagewiseJudge(ScriptedChatModel([]), ScriptedChatModel([]), scoring="pairs")


def _unsure(respond, choice):
    """``respond``'s sheets with every 0/1/2 reported as a coin flip between it and the next digit (mod 3), so
    a score s reads as the expectation (s + (s + 1) % 3) / 2: 2 -> 1.0, 1 -> 1.5, 0 -> 0.5."""
    import math

    from components.llm.backends.scripted import WithLogprobs
    from components.llm.base import TokenLogprob

    def reply(messages, sampling=None):
        text = respond(messages, sampling)
        tokens, at = [], 0
        for start in choice.locate_each(text):
            tokens.append(TokenLogprob(token=text[at:start], logprob=0.0, top=()))
            s = text[start]
            top = ((s, math.log(0.5)), (str((int(s) + 1) % 3), math.log(0.5)))
            tokens.append(TokenLogprob(token=s, logprob=math.log(0.5), top=top))
            at = start + 1
        return WithLogprobs(text, [*tokens, TokenLogprob(token=text[at:], logprob=0.0, top=())])

    return reply


# A read from probabilities: plan 2 -> 1.0 / 2; research (3 * 1.0/2 + 1 * (1 - 0.5/2)) / 4; review 1 -> 1.5 / 2;
# answer (3 * F1 1 + 1 * 1.0/2) / 4
A_FROM_PROBABILITIES = [0.5, 0.5625, 0.75, 0.875]


@pytest.mark.parametrize("scoring", ["trajectory", "group"])
def test_scores_read_from_probabilities_are_each_rubric_s_expected_score(scoring):
    from components.methods.rubricem.stagewise_judge import GROUP_CHOICE, SHEET_CHOICE

    respond = respond_with(TABLE) if scoring == "trajectory" else group_respond(TABLE)[0]
    evaluator = ScriptedChatModel(_unsure(respond, SHEET_CHOICE if scoring == "trajectory" else GROUP_CHOICE))
    evaluator.scoring = "probability"
    judge = StagewiseJudge(ScriptedChatModel([GENERATION]), evaluator, scoring=scoring)
    results, metrics = asyncio.run(judge.judge_groups([(Q, group())], step=1))
    assert results[0][0].scores == pytest.approx(A_FROM_PROBABILITIES)
    assert evaluator.requests[0][1].logprobs  # the sheets were asked with their tokens' probabilities
    assert metrics["judge/scored_from_probability"] == 3 and metrics["judge/scored_from_text"] == 0
    text = StagewiseJudge(ScriptedChatModel([GENERATION]), ScriptedChatModel(respond), scoring=scoring)
    results, metrics = asyncio.run(text.judge_groups([(Q, group())], step=1))
    assert results[0][0].scores == pytest.approx([1.0, 1.0, 0.5, 1.0])  # the sampled digits, as before
    assert "judge/scored_from_probability" not in metrics
