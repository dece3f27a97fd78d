"""Co-ReAct's inject-verify-retry on the ReAct seams, with scripted policy, generator and verifier: a rejected
draft is recorded, never run and not trainable; the threshold is strict; failing generator or verifier leave
the step unguided or accepted; the token budget forces the answer; params reach the agent."""

import asyncio
from pathlib import Path

import pytest

from components.agents.react import agent_options, build_agent
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import TransientLLMError
from components.methods.coreact.agent import TOKEN_BUDGET_MESSAGE, CoReActAgent
from components.params_load import load_params
from tests.coreact.scripted_agents import SETTINGS, DictToolbox, Q, generator, policy, verifier

GOOD, BAD = "search[Nightfall Harbor]", "search[film]"


def react_turns(i, context):
    """Turn 0 proposes BAD unless the verifier's feedback is in context; then it answers."""
    if i == 0:
        return f"Thought: fix it\nAction: {GOOD}" if "did not pass" in context else f"Thought: guess\nAction: {BAD}"
    return "Thought: done\nAction: finish[Kestrow]"


def judge_bad_first(action):
    if action == BAD:
        return [(False, "searches a generic word, not the film"), (True, "")]
    return [(True, ""), (True, "")]


def run(agent):
    return asyncio.run(agent.run(Q, seed=5))


def make(turns=react_turns, verdicts=judge_bad_first, **kw):
    model, tools, gen, ver = policy(turns), DictToolbox(), kw.pop("gen", None) or generator(), kw.pop("ver", None)
    ver = ver or verifier(verdicts)
    agent = CoReActAgent(model, tools, SETTINGS, generator=kw.pop("generator_obj", None) or _gen(gen), verifier=ver,
                         **kw)
    return agent, model, tools, gen, ver


def _gen(model):
    from components.methods.coreact.rubric_generator import RubricGenerator

    return RubricGenerator(model, max_criteria=4, max_chars=160)


def test_rejected_draft_is_recorded_not_run_and_not_trainable():
    agent, model, tools, _, ver = make()
    traj = run(agent)
    assert traj.final_answer == "Kestrow" and traj.finish_reason == "answer"
    assert tools.calls == [("search", "Nightfall Harbor")]  # the rejected draft never ran
    assert traj.steps[0].action == GOOD and "Looks up the film Nightfall Harbor" in traj.steps[0].rubric
    record = traj.metadata["guided"]["steps"][0]
    assert record["retries"] == 1 and len(record["drafts"]) == 1  # the retry is taken without a second check
    rejected = record["drafts"][0]
    assert rejected["action"] == BAD and rejected["accepted"] is False
    assert rejected["fraction"] == pytest.approx(1 / 3) and rejected["satisfied"] == [False, True]
    assert [c["weight"] for c in record["rubric"]] == pytest.approx([2 / 3, 1 / 3])
    assert traj.metadata["policy_calls"] == [{"kind": "turn", "trainable": False}, {"kind": "retry", "trainable": True},
                                             {"kind": "turn", "trainable": True}]
    # what the policy saw: the rubric before its first draft, the unmet criterion and its reason before the retry
    first, retry = model.requests[0][0][-1].content, model.requests[1][0][-1].content
    assert "1. (weight 0.67) Looks up the film Nightfall Harbor" in first and "did not pass" not in first
    assert 'did not pass this checklist' in retry and "criterion 1 (Looks up the film Nightfall Harbor) not met: " \
        "searches a generic word, not the film" in retry and retry.rstrip().endswith("Write your next Thought and Action.")
    # the finish turn is not verified; the verifier saw the draft with its reasoning
    assert len(ver.requests) == 1 and "Agent's reasoning: guess" in ver.requests[0][0][1].content
    cost = traj.metadata["guided"]["cost"]
    assert cost["policy"]["calls"] == 3 and cost["verifier"]["calls"] == 1 and cost["rubric_generator"]["calls"] == 2


def test_criterion_verifier_asks_once_per_criterion_and_rejects_by_the_same_threshold():
    agent, model, tools, _, ver = make(verifier_mode="criterion")
    traj = run(agent)
    assert tools.calls == [("search", "Nightfall Harbor")] and traj.final_answer == "Kestrow"
    rejected = traj.metadata["guided"]["steps"][0]["drafts"][0]
    assert rejected["satisfied"] == [False, True] and rejected["fraction"] == pytest.approx(1 / 3)
    assert rejected["accepted"] is False and rejected["reasons"] == ["", ""]
    # one yes/no call per criterion, free text, on the action alone; the feedback names the unmet criterion
    assert len(ver.requests) == 2 and all(s.json_schema is None for _, s in ver.requests)
    asked = sorted(m[1].content.split("Requirement: ")[1].split("\n")[0] for m, _ in ver.requests)
    assert asked == ["Looks up the film Nightfall Harbor", "Uses a search action"]
    retry = model.requests[1][0][-1].content
    assert "- criterion 1 (Looks up the film Nightfall Harbor) not met\n" in retry and "criterion 2" not in retry
    cost = traj.metadata["guided"]["cost"]["verifier"]
    assert cost["calls"] == 2 and cost["failures"] == 0


def test_criterion_verifier_that_fails_or_hedges_accepts_and_is_counted():
    hedging = ScriptedChatModel(lambda m, s: "Probably.", name="verifier")
    agent, _, tools, _, _ = make(ver=hedging, verifier_mode="criterion")
    traj = run(agent)
    draft = traj.metadata["guided"]["steps"][0]["drafts"][0]
    assert draft["accepted"] is None and "does not start with yes or no" in draft["error"]
    assert tools.calls == [("search", "film")]
    cost = traj.metadata["guided"]["cost"]["verifier"]
    assert cost["calls"] == 2 and cost["failures"] == 0  # an unusable reply is not a failed call
    down = ScriptedChatModel([TransientLLMError("verifier down")] * 10)
    agent, _, tools, _, _ = make(ver=down, verifier_mode="criterion")
    traj = run(agent)
    assert traj.metadata["guided"]["steps"][0]["drafts"][0]["accepted"] is None and tools.calls == [("search", "film")]
    assert traj.metadata["guided"]["cost"]["verifier"]["calls"] == 2
    assert traj.metadata["guided"]["cost"]["verifier"]["failures"] == 2


def test_threshold_is_strict_and_an_accepted_draft_is_not_retried():
    half = [(True, ""), (False, "no")]
    equal = {"criteria": [{"criterion": "Looks up the film", "weight": 1}, {"criterion": "Uses search", "weight": 1}]}
    agent, _, tools, _, _ = make(verdicts=lambda a: half, gen=generator(equal))
    traj = run(agent)
    assert traj.metadata["guided"]["steps"][0]["drafts"][0]["fraction"] == 0.5
    assert traj.metadata["guided"]["steps"][0]["retries"] == 1  # 0.5 does not exceed tau = 0.5
    agent, _, tools, _, _ = make(verdicts=lambda a: half, tau=0.4, gen=generator(equal))
    traj = run(agent)
    record = traj.metadata["guided"]["steps"][0]
    assert record["retries"] == 0 and record["drafts"][0]["accepted"] is True and tools.calls == [("search", "film")]
    assert all(c["trainable"] for c in traj.metadata["policy_calls"])


def test_failed_verifier_accepts_and_failed_generator_leaves_the_step_unguided():
    down = ScriptedChatModel([TransientLLMError("verifier down")] * 5)
    agent, model, tools, _, _ = make(ver=down)
    traj = run(agent)
    record = traj.metadata["guided"]["steps"][0]
    assert record["retries"] == 0 and record["drafts"][0]["accepted"] is None
    assert "verifier call failed" in record["drafts"][0]["error"] and tools.calls == [("search", "film")]
    assert traj.metadata["guided"]["cost"]["verifier"]["failures"] == 1

    ver = verifier(judge_bad_first)
    agent, model, tools, _, _ = make(gen=generator("here are some ideas"), ver=ver)
    traj = run(agent)
    record = traj.metadata["guided"]["steps"][0]
    assert record["rubric"] is None and "no JSON object" in record["rubric_error"]
    assert traj.steps[0].rubric is None and ver.requests == [] and tools.calls == [("search", "film")]
    assert "checklist" not in model.requests[0][0][-1].content
    assert agent.generator.unparsed == 2 and agent.generator.failed_calls == 0


def test_no_verification_ablation_injects_only():
    agent, model, tools, _, ver = make(verify=False)
    traj = run(agent)
    assert ver.requests == [] and tools.calls == [("search", "film")] and "drafts" not in traj.metadata["guided"]["steps"][0]
    assert "Looks up the film Nightfall Harbor" in model.requests[0][0][-1].content


def test_token_budget_forces_the_answer_and_runs_no_tool():
    def turns(i, context):
        if i == 0:
            return f"Thought: ok\nAction: {GOOD}"
        assert TOKEN_BUDGET_MESSAGE in context
        return "Thought: still\nAction: search[more]" if i == 1 else "Action: finish[Kestrow]"

    agent, _, tools, _, _ = make(turns=turns, verify=False, token_budget=20)
    traj = run(agent)
    assert tools.calls == [("search", "Nightfall Harbor")]  # one turn, then the budget (scripted tokens = words)
    assert traj.metadata["guided"]["token_budget_hit"] is True
    assert traj.steps[1].parse_error and traj.steps[1].tool_call is None  # a tool call after the budget is refused
    assert [c["kind"] for c in traj.metadata["policy_calls"]] == ["turn", "forced_answer", "forced_answer"]
    assert traj.final_answer == "Kestrow"


def test_params_reach_the_agent_and_roles_are_bound(repo_root: Path):
    params = load_params(repo_root / "params.yaml")
    asked = []

    def roles(name):
        asked.append(name)
        return {"policy": policy(react_turns), "verifier": verifier(judge_bad_first)}.get(name, generator())

    agent = build_agent("coreact", roles, DictToolbox(), SETTINGS, agent_options(params, params.methods["coreact"]))
    assert isinstance(agent, CoReActAgent) and agent.tau == params.coreact.tau and agent.max_retries == 1
    assert agent.verifier_mode == params.coreact.verifier_mode == "criterion"
    assert agent.token_budget == params.coreact.token_budget == 6000
    assert agent.generator.max_criteria == params.rubric_generator.max_criteria
    assert agent.generator.temperature == 0.7 and agent.generator.top_p == 0.95
    assert sorted(asked) == ["policy", "rubric_generator_trained", "verifier"]
    assert run(agent).final_answer == "Kestrow"
    asked.clear()
    build_agent("coreact", roles, DictToolbox(), SETTINGS, agent_options(params, params.methods["coreact_no_verify"]))
    assert sorted(asked) == ["policy", "rubric_generator_trained"]  # no verifier started for the ablation
    asked.clear()
    build_agent("coreact", roles, DictToolbox(), SETTINGS, agent_options(params, params.methods["coreact_untrained"]))
    assert "rubric_generator" in asked


def test_the_generator_is_prompted_as_its_format_term_trained_it(repo_root: Path):
    """The schema format keeps the options (and so the evaluations' run keys) as they were; count_weights asks
    the agent's generator for the released weights summing to 1."""
    def roles(name):
        return {"policy": policy(react_turns), "verifier": verifier(judge_bad_first)}.get(name, generator())

    embedded = load_params(repo_root / "params.yaml")
    options = agent_options(embedded, embedded.methods["coreact"])
    assert "format_reward" not in options["generator_settings"]
    assert build_agent("coreact", roles, DictToolbox(), SETTINGS, options).generator.format_reward == "schema"
    paper = load_params(repo_root / "params.yaml", overrides=["rubric_generator.format_reward=count_weights"])
    options = agent_options(paper, paper.methods["coreact"])
    assert options["generator_settings"]["format_reward"] == "count_weights"
    assert build_agent("coreact", roles, DictToolbox(), SETTINGS, options).generator.format_reward == "count_weights"
