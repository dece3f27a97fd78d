"""RubricEM's Plan / Research / Review / Answer scaffold as the lab's nano policy speaks it: the world oracle's plan
(:func:`components.warmstart.oracle.plan_turns`) written as the scaffold agent's compact replies, each within the
lab's turn budget (``rubricem.scaffold_max_tokens``, 40): a plan (``<structured_plan>`` with the hop count, a one-line
rubric and the names the question gives to look up, then the first call), one ``<call_tool>`` a research reply with
the few-word thought ReAct's compact episodes write (:func:`components.lab.world.compact_thoughts`) and the hops
settled so far, then a review citing the paragraph of the last fact and the answer; a name or answer set off by
spaces as :func:`components.lab.world.spaced` does. Replayed through the unchanged scaffold agent (the registered
``scaffold``) under the lab's one-line scaffold prompt (``methods.sft_scaffold.options.system_prompt``) and checked
by rejection sampling in the scaffold's format, like the ReAct ones; :data:`TAGS` are kept whole by the tokenizer.

    episodes, skipped = compact_episodes(lab, questions, params.agent, scaffold_protocol(prompt))
    rows = sft_rows(episodes, params.agent, scaffold_protocol(prompt))
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from components.agents.params import AgentParams
from components.agents.react import agent_class
from components.lab.world import Protocol, compact_thoughts
from components.schemas import Question
from components.warmstart.oracle import PlannedTurn

__all__ = ["TAGS", "compact_scaffold_replies", "lab_scaffold_agent", "scaffold_protocol"]

TAGS = ("<think>", "</think>", "<structured_plan>", "</structured_plan>", "<deep_analysis>", "</deep_analysis>",
        "<rubric>", "</rubric>", "<research_plan>", "</research_plan>", "<state_evaluation>", "</state_evaluation>",
        '<call_tool name="search">', '<call_tool name="browse">', "</call_tool>", "<tool_output>", "</tool_output>",
        "<review>", "</review>", "<rubric_review>", "</rubric_review>", '<cite id="', "</cite>", "<writing_plan>",
        "</writing_plan>", "<answer>", "</answer>")


def lab_scaffold_agent(policy, toolbox, settings: AgentParams, system_prompt: str):
    """The scaffold agent as the lab runs it: the unchanged registered ``scaffold`` agent under ``system_prompt``."""
    return agent_class("scaffold")(policy, toolbox, settings, system_prompt=system_prompt)


def _argument(action: str) -> tuple[str, str]:
    kind, _, rest = action.partition("[")
    return kind, rest[:-1]


def _call(action: str) -> str:
    kind, argument = _argument(action)
    shown = argument if kind == "browse" else f" {argument} "  # a browse keeps its id as shown (spaced's rule)
    return f'<call_tool name="{kind}">{shown}</call_tool>'


def compact_scaffold_replies(question: Question, turns: Sequence[PlannedTurn]) -> list[str]:
    """The oracle's planned turns as compact scaffold replies (module doc)."""
    chain, n = question.gold_chain, len(question.gold_chain)
    named = [arg for kind, arg in map(_argument, (t.action for t in turns)) if kind == "search" and arg in
             question.question]
    replies = []
    for i, (thought, turn) in enumerate(zip(compact_thoughts(question, turns), turns)):
        head = f"<think> {thought}</think>"  # the thought's name after a space, as the observation shows it
        if turn.action.startswith("finish["):
            answer, last = question.answers[0], chain[-1]
            plan = "compare" if question.metadata.get("compare") else "last fact"
            replies.append(f"{head}<state_evaluation>{n} of {n}</state_evaluation><review><rubric_review>"
                           f'<cite id="{last.doc_id}"> {last.answer}</cite></rubric_review><writing_plan>{plan}'
                           f"</writing_plan></review><answer> {answer} </answer>")
        elif i == 0:
            lookups = ",".join(f" {name}" for name in dict.fromkeys(named or [_argument(turn.action)[1]]))
            replies.append(f"{head}<structured_plan><deep_analysis>{n} hops</deep_analysis><rubric>cite {n} facts"
                           f"</rubric><research_plan>{lookups}</research_plan></structured_plan>{_call(turn.action)}")
        else:
            replies.append(f"{head}<state_evaluation>{turn.hop} of {n}</state_evaluation>{_call(turn.action)}")
    return replies


def scaffold_protocol(system_prompt: str) -> Protocol:
    """The scaffold as a lab :class:`~components.lab.world.Protocol` under the lab's scaffold ``system_prompt``."""
    return Protocol("scaffold", partial(lab_scaffold_agent, system_prompt=system_prompt), compact_scaffold_replies,
                    TAGS)
