"""The ReAct loop with a scripted policy and an in-memory toolbox."""

import asyncio

import pytest

from components.agents.params import AgentParams
from components.agents.react import BUDGET_MESSAGE, FORMAT_REMINDER, REPEAT_NOTE, ReActAgent
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import PermanentLLMError
from components.llm.middleware import ReliableChatModel
from components.llm.params import MiddlewareParams
from components.schemas import Question, ToolCall

Q = Question(id="q1", question="Where was the director of Nightfall Harbor born?", answers=["Kestrow"],
             source="world")


class DictToolbox:
    """search returns the doc whose title is the query; browse returns a long text."""

    def __init__(self):
        self.calls = []

    def call(self, name, argument):
        self.calls.append((name, argument))
        if name == "search":
            return ToolCall(name="search", arguments={"query": argument},
                            observation=f"[1] (d-{argument}) {argument}: about {argument}", doc_ids=[f"d-{argument}"])
        return ToolCall(name="browse", arguments={"doc_id": argument}, observation="x" * 5000, doc_ids=[argument])


def run(replies, **settings):
    policy = ScriptedChatModel(replies)
    tools = DictToolbox()
    agent = ReActAgent(policy, tools, AgentParams(**{"max_turns": 6, "max_search_calls": 3,
                                                     "observation_max_chars": 100, **settings}))
    return asyncio.run(agent.run(Q)), policy, tools


def test_full_episode_records_steps_docs_and_answer():
    traj, policy, tools = run([
        "Thought: find the film\nAction: search[Nightfall Harbor]",
        "Thought: now the director\nAction: search[Ossian Threll]",
        "Thought: read\nAction: browse[d-Ossian Threll]",
        "Thought: got it\nAction: finish[Kestrow]",
    ])
    assert traj.finish_reason == "answer" and traj.final_answer == "Kestrow"
    assert [s.action for s in traj.steps] == ["search[Nightfall Harbor]", "search[Ossian Threll]",
                                              "browse[d-Ossian Threll]", "finish[Kestrow]"]
    assert traj.docs_seen == ["d-Nightfall Harbor", "d-Ossian Threll"]
    assert traj.n_tool_calls == 3
    # the long browse observation was truncated before the policy saw it
    assert len(traj.steps[2].tool_call.observation) <= 100
    last_prompt = policy.requests[-1][0]
    assert last_prompt[-1].content.startswith("Observation: xxx") and len(last_prompt[-1].content) <= 114
    assert traj.completion_tokens > 0


def test_unparseable_turn_gets_a_reminder_and_no_tool_call():
    traj, policy, tools = run(["I think maybe something", "Action: finish[Kestrow]"])
    assert traj.steps[0].parse_error and traj.steps[0].tool_call is None
    assert policy.requests[1][0][-1].content == f"Observation: {FORMAT_REMINDER}"
    assert tools.calls == [] and traj.final_answer == "Kestrow"


def test_search_budget_is_enforced():
    traj, policy, tools = run(["Action: search[a]"] * 6, max_search_calls=2, force_answer=False)
    assert len(tools.calls) == 2
    assert traj.finish_reason == "search_budget" and traj.final_answer is None
    assert policy.requests[3][0][-1].content == f"Observation: {BUDGET_MESSAGE}"


def test_turn_budget_ends_the_episode():
    traj, _, _ = run(["no action"] * 6, max_turns=3, force_answer=False)
    assert traj.finish_reason == "max_turns" and len(traj.steps) == 3


def test_policy_failure_ends_with_llm_failure_not_an_answer():
    policy = ReliableChatModel(ScriptedChatModel([PermanentLLMError("bad request", 400)]), role="policy",
                               settings=MiddlewareParams(cache=False))
    traj = asyncio.run(ReActAgent(policy, DictToolbox()).run(Q))
    assert traj.finish_reason == "llm_failure" and traj.final_answer is None
    assert "bad request" in traj.metadata["error"]


def test_repeated_call_is_flagged_to_the_policy():
    traj, policy, tools = run(["Action: search[a]", "Action: search[a]", "Action: finish[x]"])
    assert not traj.steps[0].tool_call.observation.startswith(REPEAT_NOTE)
    assert traj.steps[1].tool_call.observation.startswith(REPEAT_NOTE[:40])
    assert len(tools.calls) == 2


def test_scratchpad_format_shows_one_fresh_user_message_with_numbered_history():
    traj, policy, _ = run(["Thought: a\nAction: search[Nightfall Harbor]", "gibberish", "Action: finish[Kestrow]"],
                          history_format="scratchpad")
    assert traj.final_answer == "Kestrow"
    last = policy.requests[-1][0]
    assert [m.role for m in last] == ["system", "user"]
    text = last[1].content
    assert text.startswith(f"Question: {Q.question}")
    assert "1. Action: search[Nightfall Harbor]\n   Observation: [1] (d-Nightfall Harbor)" in text
    assert f"2. Action: (unreadable)\n   Observation: {FORMAT_REMINDER}" in text
    first = policy.requests[0][0][1].content
    assert "You have not made any step yet." in first


def test_chat_format_replays_turns_and_observations():
    traj, policy, _ = run(["Action: search[x]", "Action: finish[y]"])
    roles = [m.role for m in policy.requests[-1][0]]
    assert roles == ["system", "user", "assistant", "user"]
    assert policy.requests[-1][0][-1].content.startswith("Observation: [1] (d-x)")


def test_forced_answer_after_the_budget_keeps_the_finish_reason():
    from components.agents.react import FORCE_MESSAGE

    traj, policy, tools = run(["Action: search[a]", "Action: search[b]", "Action: finish[Kestrow]"],
                              max_turns=2, history_format="scratchpad")
    assert traj.final_answer == "Kestrow" and traj.finish_reason == "max_turns"
    assert traj.metadata["forced_answer"] is True
    assert [c["kind"] for c in traj.metadata["policy_calls"]] == ["turn", "turn", "forced_answer"]
    forced = policy.requests[-1][0]
    assert [m.role for m in forced] == ["system", "user"] and forced[1].content.endswith(FORCE_MESSAGE)
    assert "2. Action: search[b]" in forced[1].content


def test_forced_answer_that_is_not_an_answer_gives_none():
    traj, _, _ = run(["Action: search[a]", "Thought: hmm\nAction: search[c]"], max_turns=1)
    assert traj.final_answer is None and traj.metadata["forced_answer"] is True


def test_placeholder_answers_are_not_answers():
    from components.agents.parsing import parse_turn

    for text in ("Action: finish[answer]", "Action: finish[<answer>]", "Action: finish[...]", "Final Answer: answer"):
        parsed = parse_turn(text)
        assert parsed.kind == "invalid" and "placeholder" in parsed.error, text
    assert parse_turn("Action: finish[Answer Bay]").argument == "Answer Bay"
    from components.agents.react import BUDGET_MESSAGE, FORCE_MESSAGE

    for message in (BUDGET_MESSAGE, FORCE_MESSAGE):  # no copyable bracketed slot in what the policy is told
        assert "finish[answer]" not in message and "finish[<" not in message


def test_agent_registry_builds_react_and_refuses_unknown_names():
    from components.agents.react import AGENTS, build_agent
    from components.registry import RegistryError

    policy, roles = ScriptedChatModel(["Action: finish[x]"]), []

    def role(name):
        roles.append(name)
        return policy

    agent = build_agent("react", role, DictToolbox(), AgentParams(), {"name": "base"})
    assert isinstance(agent, ReActAgent) and agent.policy is policy and agent.name == "base"
    assert roles == ["policy"] and "react" in AGENTS.names()
    assert asyncio.run(agent.run(Q)).final_answer == "x"
    with pytest.raises(RegistryError, match="unknown agent"):
        build_agent("nope", role, None, AgentParams())
