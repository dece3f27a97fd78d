"""Control flow of the test-time baselines with scripted models: Self-Refine's critique and retry, Step-Back's view
before each action, CRITIC's verification search and grounded retry, Best-of-N's sampling, scoring and greedy
answer, and the plug-in mode (the rubric in each baseline's context, no Co-ReAct verifier)."""

import asyncio
import json
import re

import pytest

from components.methods.coreact.baselines import (
    CRITIQUE_SYSTEM,
    SCORER_SYSTEM,
    STEP_BACK_SYSTEM,
    BestOfNAgent,
    CriticAgent,
    SelfRefineAgent,
    StepBackAgent,
)
from components.agents.react import agent_options
from components.agents.react import FORCE_MESSAGE, build_agent
from components.methods.coreact.rubric_generator import RubricGenerator
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import TransientLLMError
from components.params_load import load_params
from tests.coreact.scripted_agents import SETTINGS, DictToolbox, Q, generator, policy, turn_index

GOOD, BAD = "search[Nightfall Harbor]", "search[film]"


def run(agent, seed=5):
    return asyncio.run(agent.run(Q, seed=seed))


def kinds(traj):
    return [(c["kind"], c["trainable"]) for c in traj.metadata["policy_calls"]]


def feedback_turns(marker):
    def turns(i, context):
        if i == 0:
            return f"Thought: fix\nAction: {GOOD}" if marker in context else f"Thought: guess\nAction: {BAD}"
        return "Thought: done\nAction: finish[Kestrow]"
    return turns


def test_self_refine_critiques_and_retries_once():
    def side(system, context):
        assert system == CRITIQUE_SYSTEM
        if f"Action: {BAD}" in context:
            return json.dumps({"sufficient": False, "feedback": "search the film by its name"})
        return json.dumps({"sufficient": True, "feedback": ""})

    model, tools = policy(feedback_turns("insufficient: search the film by its name"), side), DictToolbox()
    traj = run(SelfRefineAgent(model, tools, SETTINGS, max_retries=1))
    assert tools.calls == [("search", "Nightfall Harbor")] and traj.final_answer == "Kestrow"
    record = traj.metadata["guided"]["steps"][0]
    assert record["retries"] == 1 and record["critiques"][0]["sufficient"] is False
    # the refined draft is not critiqued again (one retry); the finish is critiqued and found sufficient
    assert kinds(traj) == [("turn", False), ("critique", False), ("refine", True), ("turn", True), ("critique", False)]
    assert traj.metadata["guided"]["steps"][1]["critiques"][0]["sufficient"] is True


def test_self_refine_keeps_the_draft_when_the_critique_cannot_be_read():
    model, tools = policy(feedback_turns("never"), lambda s, c: "hmm, maybe"), DictToolbox()
    traj = run(SelfRefineAgent(model, tools, SETTINGS))
    assert tools.calls == [("search", "film")] and traj.metadata["guided"]["steps"][0]["retries"] == 0
    assert traj.metadata["guided"]["steps"][0]["critiques"][0]["sufficient"] is None


def test_step_back_writes_a_view_before_each_action():
    views = iter(["The question needs a birthplace: film, then director, then town.", "Answer from the director."])

    def side(system, context):
        assert system == STEP_BACK_SYSTEM
        return next(views)

    model, tools = policy(feedback_turns("never"), side), DictToolbox()
    traj = run(StepBackAgent(model, tools, SETTINGS))
    assert kinds(traj) == [("step_back", False), ("turn", True), ("step_back", False), ("turn", True)]
    turn_context = model.requests[1][0][-1].content
    assert "Stepping back before you act:\nThe question needs a birthplace" in turn_context
    assert [r["step_back"] for r in traj.metadata["guided"]["steps"]] == [
        "The question needs a birthplace: film, then director, then town.", "Answer from the director."]


def test_critic_runs_a_verification_search_and_retries_on_grounded_feedback():
    def side(system, context):
        assert system == CRITIQUE_SYSTEM
        if "write one search query" in context:
            return json.dumps({"query": "Nightfall Harbor director"})
        return json.dumps({"correct": False, "feedback": "the film is Nightfall Harbor, search it"})

    model, tools = policy(feedback_turns("The check found: the film is Nightfall Harbor"), side), DictToolbox()
    traj = run(CriticAgent(model, tools, SETTINGS, max_retries=1))
    # verification search first, then the retried action; the finish is not checked
    assert tools.calls == [("search", "Nightfall Harbor director"), ("search", "Nightfall Harbor")]
    check = traj.metadata["guided"]["steps"][0]["checks"][0]
    assert check["query"] == "Nightfall Harbor director" and check["correct"] is False
    assert check["doc_ids"] == ["d-Nightfall_Harbor_director"]
    assert traj.metadata["guided"]["extra_tool_calls"] == 1 and traj.n_tool_calls == 1
    assert "d-Nightfall_Harbor_director" in traj.docs_seen
    assert kinds(traj) == [("turn", False), ("verify_query", False), ("critique", False), ("retry", True),
                           ("turn", True)]
    assert "returned:\n[1] (d-Nightfall_Harbor_director)" in model.requests[3][0][-1].content


def test_best_of_n_samples_scores_and_answers_greedily():
    answers = {5: "Anvers", 5 + 7919: "Kestrow", 5 + 2 * 7919: None}

    def turns(i, context):
        return "Action: search[Nightfall Harbor]" if i == 0 else "Action: finish[x]"

    def respond(messages, sampling):
        content = messages[-1].content
        if FORCE_MESSAGE in content and sampling.temperature == 0.0:  # the greedy final answer
            return "Action: finish[Kestrow Bay]"
        assert sampling.temperature == 0.7
        if FORCE_MESSAGE in content:  # a sample that ran out of turns
            return "no idea"
        turn = turn_index(messages)
        if turn == 0:
            return "Action: search[Nightfall Harbor]"
        answer = answers[sampling.seed - turn]  # ReAct seeds turn t of an episode with seed + t
        return f"Action: finish[{answer}]" if answer else "no idea"

    scored = []

    def score(messages, sampling):
        assert messages[0].content == SCORER_SYSTEM
        scored.append(messages[1].content)
        return json.dumps({"score": 9 if "Final answer: Kestrow" in messages[1].content else 4})

    model, tools = ScriptedChatModel(respond), DictToolbox()
    agent = BestOfNAgent(model, tools, SETTINGS, scorer=ScriptedChatModel(score), n=3, temperature=0.7)
    traj = run(agent)
    summary = traj.metadata["best_of_n"]
    assert [c["answer"] for c in summary["candidates"]][:2] == ["Anvers", "Kestrow"]
    assert [c["score"] for c in summary["candidates"]] == [4, 9, None]  # the unanswered sample is not scored
    assert len(scored) == 2 and summary["chosen"] == 1 and not summary["fallback"]
    assert traj.final_answer == "Kestrow Bay" and traj.finish_reason == "answer"  # the greedy answer
    assert [s.action for s in traj.steps] == [GOOD] and traj.n_tool_calls == 1
    cost = traj.metadata["guided"]["cost"]
    assert cost["scorer"]["calls"] == 2 and cost["policy"]["calls"] >= 3 * 2 + 1


def test_best_of_n_falls_back_when_the_scorer_fails():
    def respond(messages, sampling):
        content = messages[-1].content
        if FORCE_MESSAGE in content:
            raise TransientLLMError("down")
        return "Action: finish[Kestrow]" if "1. Action:" in content else "Action: search[Nightfall Harbor]"

    agent = BestOfNAgent(ScriptedChatModel(respond), DictToolbox(), SETTINGS,
                         scorer=ScriptedChatModel([TransientLLMError("down")] * 10), n=2)
    traj = run(agent)
    assert traj.metadata["best_of_n"]["fallback"] and traj.metadata["best_of_n"]["chosen"] == 0
    assert traj.metadata["best_of_n"]["greedy_answer_failed"] and traj.final_answer == "Kestrow"
    assert traj.metadata["guided"]["cost"]["scorer"]["failures"] == 2


@pytest.mark.parametrize("method", ["self_refine_rubric", "best_of_n_rubric", "step_back_rubric", "critic_rubric"])
def test_plugin_mode_injects_the_rubric_without_verification(method, repo_root):
    params = load_params(repo_root / "params.yaml")
    spec = params.methods[method]
    asked, seen = [], []

    def respond(messages, sampling):
        seen.append(messages[-1].content)
        content = messages[-1].content
        if messages[0].content in (CRITIQUE_SYSTEM,):
            return json.dumps({"sufficient": True, "correct": True, "query": "x", "feedback": ""})
        if messages[0].content in (STEP_BACK_SYSTEM, SCORER_SYSTEM):
            return json.dumps({"score": 5}) if messages[0].content == SCORER_SYSTEM else "a view"
        return "Action: finish[Kestrow]" if re.search(r"^1\. Action:", content, re.MULTILINE) else f"Action: {GOOD}"

    def roles(name):
        asked.append(name)
        return generator() if name.startswith("rubric_generator") else ScriptedChatModel(respond, name=name)

    agent = build_agent(spec.agent, roles, DictToolbox(), SETTINGS, agent_options(params, spec))
    assert isinstance(agent.generator, RubricGenerator)
    traj = run(agent)
    assert "rubric_generator_trained" in asked and not any(r == "verifier" for r in asked if spec.agent != "best_of_n")
    assert traj.final_answer == "Kestrow" and traj.steps[0].rubric is not None
    assert any("Looks up the film Nightfall Harbor" in c for c in seen)
    assert "drafts" not in traj.metadata["guided"]["steps"][0]  # no Co-ReAct verification
