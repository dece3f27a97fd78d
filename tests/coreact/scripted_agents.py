"""Helpers for the Co-ReAct agent and baseline tests: an in-memory toolbox, a scripted ReAct policy that answers
by turn number (and by what its context holds), and scripted generator / verifier / scorer roles."""

from __future__ import annotations

import json
import re

from components.agents.params import AgentParams
from components.agents.react import SYSTEM_PROMPTS
from components.llm.backends.scripted import ScriptedChatModel
from components.schemas import Question, ToolCall

Q = Question(id="q1", question="Where was the director of Nightfall Harbor born?", answers=["Kestrow"], source="world")
SETTINGS = AgentParams(max_turns=6, max_search_calls=3, history_format="scratchpad", temperature=0.0)
RUBRIC = {"criteria": [{"criterion": "Looks up the film Nightfall Harbor", "weight": 2},
                       {"criterion": "Uses a search action", "weight": 1}]}


class DictToolbox:
    """search returns one document named after the query."""

    def __init__(self):
        self.calls = []

    def call(self, name, argument):
        self.calls.append((name, argument))
        doc = f"d-{argument.replace(' ', '_')}"
        return ToolCall(name=name, arguments={"query": argument}, observation=f"[1] ({doc}) {argument}: about it",
                        doc_ids=[doc])


def turn_index(messages) -> int:
    """How many steps the scratchpad context already shows."""
    return len(re.findall(r"^\d+\. Action:", messages[-1].content, flags=re.MULTILINE))


def policy(turns, side=None, name="policy"):
    """``turns(i, context)`` answers the ReAct turn i; ``side(system, context)`` any other policy call."""

    def respond(messages, sampling):
        if messages[0].content in SYSTEM_PROMPTS.values():  # a ReAct turn, under any named prompt
            return turns(turn_index(messages), messages[-1].content)
        return side(messages[0].content, messages[-1].content)

    return ScriptedChatModel(respond, name=name)


def generator(rubric=RUBRIC):
    return ScriptedChatModel(lambda m, s: rubric if isinstance(rubric, str) else json.dumps(rubric), name="generator")


def verifier(verdicts, criteria=tuple(c["criterion"] for c in RUBRIC["criteria"])):
    """``verdicts(action)`` -> list of (satisfied, reason) for the proposed action, one per criterion. Answers the
    JSON checklist, or in criterion mode (one requirement per prompt) yes or no for the requirement, found by its
    text among ``criteria``."""

    def respond(messages, sampling):
        body = messages[1].content
        requirement = re.search(r"Requirement: (.+)", body)
        if requirement is not None:
            action = re.search(r"Proposed next action: (.+)", body).group(1)
            ok, _ = verdicts(action)[criteria.index(requirement.group(1))]
            return "Yes." if ok else "No, it does not."
        action = re.search(r"Proposed action: (.+)", body).group(1)
        return json.dumps({"verdicts": [{"satisfied": ok, "reason": why} for ok, why in verdicts(action)]})

    return ScriptedChatModel(respond, name="verifier")
