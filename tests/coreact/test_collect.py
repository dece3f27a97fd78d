"""Depth-wise branching-point expansion with scripted candidate policies and scripted judges."""

import asyncio
import json
import re

import pytest

from components.agents.react import ReActAgent
from components.methods.coreact.collect import BranchingCollector
from components.methods.coreact.collect_metrics import summarize
from components.methods.coreact.council import judge_slate
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.middleware import ReliableChatModel
from components.agents.params import AgentParams
from components.llm.params import MiddlewareParams
from components.methods.coreact.params import CollectParams
from components.schemas import Question, SubQuestion, ToolCall

Q = Question(id="q1", question="Where was the director of Nightfall Harbor born?", answers=["Kestrow"],
             source="world")


class Tools:
    def call(self, name, argument):
        return ToolCall(name=name, arguments={"query": argument}, observation=f"[1] (d-{argument}) {argument}: ...",
                        doc_ids=[f"d-{argument}"])


def wrap(model, role):
    return ReliableChatModel(model, role=role, settings=MiddlewareParams(cache=False, max_attempts=1))


def policy(actions_by_depth):
    """Answers depend on how many steps the prefix has; the sample seed picks among the options."""
    def respond(messages, sampling):
        depth = sum(1 for m in messages if m.role == "assistant")
        options = actions_by_depth[min(depth, len(actions_by_depth) - 1)]
        return f"Thought: step {depth}\nAction: {options[(sampling.seed or 0) % len(options)]}"
    return respond


def shown_actions(messages):
    return dict(re.findall(r"^\[([A-Z])\] (.+)$", messages[1].content, flags=re.MULTILINE))


def preferring(word):
    """A judge that ranks candidates containing ``word`` first, the rest in label order."""
    def respond(messages, sampling):
        shown = shown_actions(messages)
        display = list(shown)
        order = sorted(shown, key=lambda lab: (word not in shown[lab], display.index(lab)))
        return json.dumps({"rationale": f"prefers {word}", "ranking": order})
    return respond


def collector(policies, judges, **settings):
    s = CollectParams(**{"temperatures": [0.4, 1.0], "samples_per_temperature": 2, "slate_size": 4,
                         "mmr_lambda": 0.5, "min_valid_judges": 2, "max_depth": 3, **settings})
    agent = ReActAgent(policies[0], Tools(), AgentParams(max_search_calls=5))
    return BranchingCollector(agent, policies, judges, s, seed=7)


DEPTHS = [
    ["search[Nightfall Harbor]", "search[Nightfall Harbor film]", "search[Kestrow]", "search[directors]",
     "browse[d-1]", "search[harbor]"],
    ["search[Ossian Threll]", "search[Threll birthplace]", "search[Nightfall Harbor director]", "finish[Paris]",
     "search[Ossian]"],
    ["finish[Kestrow]", "finish[Paris]", "search[Kestrow]", "search[again]", "finish[Rome]"],
]


def test_consensus_top_action_is_committed_depth_by_depth():
    pols = [wrap(ScriptedChatModel(policy(DEPTHS), name=f"p{i}"), f"cand[{i}]") for i in range(2)]
    judges = [wrap(ScriptedChatModel(preferring(w)), f"judge[{i}]") for i, w in enumerate(["Threll", "Threll"])]
    # at depth 0 nobody names Threll: both judges fall back to label order, yet Borda still decides
    result = asyncio.run(collector(pols, judges).expand(Q, 11))
    assert [p.depth for p in result.points] == [0, 1, 2]
    d1 = result.points[1]
    assert d1.kept and "Threll" in d1.candidates[d1.committed].action
    assert d1.candidates[d1.committed].action == d1.candidates[d1.slate[d1.consensus[0]]].action
    # the committed action of depth 1 is the last step of depth 2's prefix
    assert result.points[2].prefix[-1].action == d1.candidates[d1.committed].action
    assert all(len(p.slate) == 4 for p in result.points if p.kept)
    assert {c.model for c in result.points[0].candidates} == {"cand[0]", "cand[1]"}
    assert {c.temperature for c in result.points[0].candidates} == {0.4, 1.0}


def guided(seen):
    """A judge that prefers candidates naming a fact from its reference notes (hop answers after '->');
    with no notes it ranks in label order. ``seen`` collects whether each prompt carried notes."""
    def respond(messages, sampling):
        prompt = messages[1].content
        seen.append("Reference notes" in prompt)
        facts = re.findall(r"-> (.+)$", prompt, flags=re.MULTILINE)
        shown = shown_actions(messages)
        display = list(shown)
        order = sorted(shown, key=lambda lab: (not any(f in shown[lab] for f in facts), display.index(lab)))
        return json.dumps({"rationale": "r", "ranking": order})
    return respond


@pytest.mark.parametrize("reference", [True, False])
def test_reference_guided_council_sees_the_gold_chain_and_the_agent_does_not(reference):
    gold = Q.model_copy(update={"gold_chain": [
        SubQuestion(question="Who directed Nightfall Harbor?", answer="Ossian Threll"),
        SubQuestion(question="Where was Ossian Threll born?", answer="Kestrow")]})
    policy_prompts = []

    def recording(messages, sampling):
        policy_prompts.append(" ".join(m.content for m in messages))
        return policy(DEPTHS)(messages, sampling)

    seen = []
    pols = [wrap(ScriptedChatModel(recording, name="p"), "cand[0]")]
    judges = [wrap(ScriptedChatModel(guided(seen)), f"j{i}") for i in range(2)]
    result = asyncio.run(collector(pols, judges, judge_reference=reference, samples_per_temperature=3).expand(gold, 11))
    assert seen and all(s is reference for s in seen)
    assert not any("Reference notes" in p or "Ossian Threll ->" in p for p in policy_prompts)
    if reference:  # both judges put the one candidate naming a gold fact first, so the consensus does too
        for point in result.points:
            slate = [point.candidates[i].action for i in point.slate]
            if "search[Kestrow]" in slate:
                assert slate[point.consensus[0]] == "search[Kestrow]"
        assert any("search[Kestrow]" in [p.candidates[i].action for i in p.slate] for p in result.points)


def test_final_answer_winner_drops_the_point_and_stops():
    depths = [DEPTHS[0], ["search[Ossian Threll]", "search[Threll birthplace]", "finish[Paris]", "search[Ossian]"]]
    pols = [wrap(ScriptedChatModel(policy(depths), name="p"), "cand[0]")]
    judges = [wrap(ScriptedChatModel(preferring("finish")), f"j{i}") for i in range(2)]
    result = asyncio.run(collector(pols, judges, max_depth=5, samples_per_temperature=4).expand(Q, 3))
    assert result.points[0].kept  # no finish candidate at depth 0
    last = result.points[-1]
    assert len(result.points) == 2 and result.stop == "final_answer"
    assert not last.kept and last.drop_reason == "final_answer"
    assert last.candidates[last.committed].action == "finish[Paris]"


def test_one_valid_judge_drops_the_point_and_commits_the_fallback():
    pols = [wrap(ScriptedChatModel(policy(DEPTHS), name="p"), "cand[0]")]
    judges = [wrap(ScriptedChatModel(preferring("Kestrow")), "good"),
              wrap(ScriptedChatModel(lambda m, s: "I like all of them."), "garbage")]
    result = asyncio.run(collector(pols, judges, max_depth=1, samples_per_temperature=3).expand(Q, 5))
    point = result.points[0]
    assert not point.kept and point.drop_reason == "too_few_valid_judges"
    assert [v.valid for v in point.votes] == [True, False] and point.votes[1].error
    assert point.committed == 0 and point.consensus == []


def test_too_few_distinct_actions_is_dropped_without_asking_judges():
    same = [["search[Nightfall Harbor]", "Search[ nightfall harbor ]", "search[Nightfall Harbor.]"]]
    judge = ScriptedChatModel(preferring("x"))
    pols = [wrap(ScriptedChatModel(policy(same), name="p"), "cand[0]")]
    result = asyncio.run(collector(pols, [wrap(judge, "j0"), wrap(judge, "j1")], max_depth=1).expand(Q, 1))
    assert result.points[0].drop_reason == "too_few_distinct" and result.points[0].n_distinct == 1
    assert judge.requests == []


def test_judge_orders_reach_the_council_and_its_metrics():
    pols = [wrap(ScriptedChatModel(policy(DEPTHS), name=f"p{i}"), f"cand[{i}]") for i in range(2)]
    judges = [wrap(ScriptedChatModel(preferring("Threll")), f"judge[{i}]") for i in range(2)]
    result = asyncio.run(collector(pols, judges, judge_orders=2).expand(Q, 11))
    judged = [p for p in result.points if p.votes]
    assert judged and all(len(p.votes) == 4 for p in judged)
    for p in judged:  # two different cyclic shifts of one drawn order per judge
        for name in ("judge[0]", "judge[1]"):
            first, second = [v.permutation for v in p.votes if v.judge == name]
            assert first != second and second == first[1:] + first[:1]
    assert "mean_self_kendall_tau" in summarize(result.points)
    with pytest.raises(ValueError, match="judge_orders"):
        CollectParams(slate_size=4, judge_orders=5)


def _council_runs(judges, slate, n, monkeypatch=None):
    from components.schemas import BranchingPoint, Candidate

    points = []
    for seed in range(n):
        out = asyncio.run(judge_slate(judges, "q?", "", slate, rng_seed=seed, min_valid=2))
        points.append(BranchingPoint(question_id=str(seed), question="q?", depth=0, slate=list(range(len(slate))),
                                     candidates=[Candidate(action=a, model="m", temperature=0) for a in slate],
                                     votes=out.votes, consensus=out.consensus, borda_scores=out.scores))
    return points


def test_judge_position_bias_is_detected_and_controlled_by_permutation(monkeypatch):
    """Judges that always rank in display order (X first) are maximally position biased. The metrics
    show it (raw top label always X; the winner's label skewed towards X), and the permutations keep it
    from favouring any candidate: over identical-quality candidates the winner is spread evenly over the
    slate. With the permutation switched off, the first candidate would always win."""
    from scipy.stats import chisquare

    from components.methods.coreact import council

    biased = lambda messages, sampling: json.dumps({"rationale": "first is best",
                                                    "ranking": list(shown_actions(messages))})
    judges = [wrap(ScriptedChatModel(biased), f"j{i}") for i in range(3)]
    slate = ["search[a]", "search[b]", "search[c]", "search[d]"]
    points = _council_runs(judges, slate, 400)
    m = summarize(points)
    assert m["top_label.X"] == 1.0 and m["top_label_chi2_p"] < 1e-6
    assert m["winner_label.X"] > 0.4 and m["winner_label_chi2_p"] < 1e-6
    winners = [p.consensus[0] for p in points]
    shares = [winners.count(i) / len(winners) for i in range(4)]
    assert all(0.18 < s < 0.32 for s in shares) and chisquare([winners.count(i) for i in range(4)]).pvalue > 0.001
    assert m["judge_validity.j0"] == 1.0 and m["kept"] == 400

    monkeypatch.setattr(council, "permutations_for", lambda n, k, seed: [list(range(k))] * n)
    unpermuted = _council_runs(judges, slate, 50)
    assert all(p.consensus[0] == 0 for p in unpermuted)


def test_unbiased_judges_give_uniform_winner_labels():
    """Judges that rank by content (alphabetical action) ignore position: the winner's label is uniform."""
    by_content = lambda messages, sampling: json.dumps({"rationale": "content",
        "ranking": sorted(shown_actions(messages), key=lambda lab: shown_actions(messages)[lab])})
    judges = [wrap(ScriptedChatModel(by_content), f"j{i}") for i in range(3)]
    m = summarize(_council_runs(judges, ["search[a]", "search[b]", "search[c]", "search[d]"], 400))
    assert m["winner_label_chi2_p"] > 0.001 and m["mean_kendall_tau"] == 1.0
