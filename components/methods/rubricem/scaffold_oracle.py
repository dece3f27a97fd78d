"""The world oracle's episodes in RubricEM's Plan / Research / Review / Answer scaffold (paper B.1-B.2), for the
scaffold warm start (``python -m tasks.sft_data --method sft_scaffold``).

The oracle's plan (:func:`components.warmstart.oracle.plan_turns`: which tool call serves which gold hop, with
the real observations) is rewritten reply by reply in the scaffold's tags:

- the first reply plans: a ``<rubric>`` with one item per hop, phrased without the answers it has not seen
  ("the birthplace of the person from item 1"), plus an item for the answer's form; a ``<research_plan>``
  with the lookups in order; then the first tool call;
- each research reply keeps the oracle's thought in ``<think>`` and says in ``<state_evaluation>`` which items
  the observations have settled (with the documents) and which are open;
- the last reply reviews every item with a ``<cite id="...">`` to the paragraph that states it, plans the
  answer, and gives it in ``<answer>``.

The rewritten replies are replayed as the policy of the scaffold agent, so observations, truncation and budgets
are those of an evaluation episode (:func:`components.warmstart.oracle.oracle_trajectory` does that).

    replies = scaffold_replies(question, plan_turns(question, toolbox, params.agent), random.Random("q"))
"""

from __future__ import annotations

import random
import re

from components.schemas import Question, SubQuestion
from components.warmstart import thoughts
from components.warmstart.thoughts import fact, match_hop, need

__all__ = ["planned_need", "scaffold_replies"]

_ACTION = re.compile(r"^(search|browse|finish)\[(.*)\]$", re.DOTALL)


def planned_need(chain: list[SubQuestion], k: int) -> str:
    """Hop ``k``'s need in the scaffold's plan ('the birthplace of the person from item 1')."""
    return thoughts.planned_need(chain, k, refer="the {kind} from item {item}")


def split_turn(raw: str) -> tuple[str, str, str]:
    """(thought, tool, argument) of an oracle ReAct turn ``Thought: ..\\nAction: tool[argument]``."""
    thought, _, action = raw.partition("\nAction:")
    m = _ACTION.match(action.strip())
    if m is None:
        raise ValueError(f"not an oracle turn: {raw!r}")
    return thought.removeprefix("Thought:").strip(), m.group(1), m.group(2)


def tool_call_text(tool: str, argument: str) -> str:
    return f'<call_tool name="{tool}">{argument}</call_tool>'


def _in_question(question: Question, k: int) -> bool:
    found = match_hop(question.gold_chain[k])
    return found is not None and found[0].get("x", "") in question.question


def plan_reply(question: Question, thought: str, tool: str, argument: str) -> str:
    chain = question.gold_chain
    n = len(chain)
    compare = question.metadata.get("compare")
    items = [f"{k + 1}. {planned_need(chain, k)}" for k in range(n)]
    if compare:
        i, j = compare["value_hops"]
        items.append(f"{n + 1}. the comparison of items {i + 1} and {j + 1} decides the answer; answer with the "
                     "option (or yes/no) it points to")
    items.append(f"{len(items) + 1}. the answer is short (a name, year, number or yes/no), taken from a cited "
                 "document, not a look-alike name")
    steps = []
    for k, hop in enumerate(chain):
        found = match_hop(hop)
        subject = found[0].get("x") if found else None
        if subject and _in_question(question, k):
            steps.append(f"{k + 1}. look up {subject} for item {k + 1}")
        else:
            earlier = {h.answer: j for j, h in enumerate(chain[:k])}.get(subject)  # the latest, as planned_need
            where = f"what item {earlier + 1} names" if earlier is not None else "the entity it depends on"
            steps.append(f"{k + 1}. look up {where} for item {k + 1}")
    start = [hop for k, hop in enumerate(chain) if _in_question(question, k)]
    origin = f" It starts from {match_hop(start[0])[0]['x']}." if start else ""
    analysis = (f"The question needs {n} fact{'s' if n > 1 else ''}, each found in the encyclopedia"
                f"{', one after another' if n > 1 and not compare else ''}.{origin} That is about {n} "
                f"lookup{'s' if n > 1 else ''}, plus a paragraph read when a snippet stops short.")
    return (f"<think>{thought}</think>\n<structured_plan>\n<deep_analysis>{analysis}</deep_analysis>\n"
            f"<rubric>\n" + "\n".join(items) + "\n</rubric>\n<research_plan>\n" + "\n".join(steps)
            + "\n</research_plan>\n</structured_plan>\n" + tool_call_text(tool, argument))


def _state(chain: list[SubQuestion], hop: int, retry: bool) -> str:
    n = len(chain)
    settled = [f"item {k + 1} = {h.answer} ({h.doc_id})" for k, h in enumerate(chain[:hop])]
    parts = [f"Settled: {', '.join(settled)}." if settled else "Nothing is settled yet."]
    if hop < n:
        open_items = f"item {hop + 1}" if hop + 1 == n else f"items {hop + 1} to {n}"
        parts.append(f"Open: {open_items}.")
        parts.append("The last lookup did not settle it; I adjust the lookup." if retry else "The plan holds.")
    else:
        parts.append("Every item is settled.")
    return "<state_evaluation>" + " ".join(parts) + "</state_evaluation>"


def writing_plan(question: Question, answer: str) -> str:
    """The review's writing plan: which items decide ``answer``."""
    compare = question.metadata.get("compare")
    if compare:
        i, j = compare["value_hops"]
        return f"Items {i + 1} and {j + 1} decide it: the answer is {answer}. I write it alone."
    return f"The last item answers the question: {answer}. I write it alone."


def _review(question: Question, thought: str, rng: random.Random) -> str:
    chain, answer = question.gold_chain, question.answers[0]
    lines = [f'{k + 1}. {need(h)}: <cite id="{h.doc_id}">{fact(h, rng)}</cite>' for k, h in enumerate(chain)]
    plan = writing_plan(question, answer)
    return (f"<think>{thought}</think>\n{_state(chain, len(chain), False)}\n<review>\n<rubric_review>\n"
            + "\n".join(lines) + f"\n</rubric_review>\n<writing_plan>{plan}</writing_plan>\n</review>\n"
            f"<answer>{answer}</answer>")


def scaffold_replies(question: Question, turns, rng: random.Random | None = None) -> list[str]:
    """The oracle's planned turns (``PlannedTurn``: ReAct text, hop index) as scaffold replies, one per turn."""
    rng = rng or random.Random(f"scaffold-oracle:{question.id}")
    replies: list[str] = []
    for i, turn in enumerate(turns):
        thought, tool, argument = split_turn(turn.raw)
        if tool == "finish":
            replies.append(_review(question, thought, rng))
        elif i == 0:
            replies.append(plan_reply(question, thought, tool, argument))
        else:
            retry = turns[i - 1].hop == turn.hop and tool == "search"
            replies.append(f"<think>{thought}</think>\n{_state(question.gold_chain, turn.hop, retry)}\n"
                           + tool_call_text(tool, argument))
    return replies
