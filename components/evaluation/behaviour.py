"""Search-behaviour statistics of a trajectory: tool calls, unique documents retrieved, documents cited,
and recall of the gold supporting paragraphs.

"Cited" documents are the ones the agent explicitly opened with ``browse`` plus any retrieved document
whose id it quotes in its answering turn; a ReAct answer is a short string, so this is the closest
observable notion of the evidence an answer rests on.
"""

from __future__ import annotations

from components.schemas import Question, Trajectory

BEHAVIOUR_COLUMNS = {"tool_calls_total_per_question": "tool calls", "unique_docs_retrieved": "retrieved docs",
                     "unique_docs_cited": "cited sources", "utilisation": "utilisation",
                     "verification_failure_rate": "verification failure rate", "cost.calls": "model calls"}
"""The search behaviour a method comparison shows (Co-ReAct's Table 3): evaluate's metric -> its label."""


def behaviour_stats(traj: Trajectory, question: Question) -> dict[str, float | None]:
    retrieved = list(dict.fromkeys(traj.docs_seen))
    cited = {s.tool_call.arguments.get("doc_id") for s in traj.steps
             if s.tool_call is not None and s.tool_call.name == "browse" and not s.tool_call.error}
    answer_turns = [s.raw for s in traj.steps if s.final_answer is not None]
    if answer_turns:
        cited |= {d for d in retrieved if d in answer_turns[-1]}
    cited.discard(None)
    cited &= set(retrieved)
    gold = set(question.supporting_doc_ids)
    return {
        "tool_calls": float(traj.n_tool_calls),
        "search_calls": float(sum(1 for s in traj.steps if s.tool_call is not None and s.tool_call.name == "search")),
        "unique_docs_retrieved": float(len(retrieved)),
        "unique_docs_cited": float(len(cited)),
        "gold_recall": (len(gold & set(retrieved)) / len(gold)) if gold else None,
        "turns": float(len(traj.steps)),
        "parse_errors": float(sum(1 for s in traj.steps if s.parse_error)),
        "answered": float(traj.final_answer is not None),
    }
