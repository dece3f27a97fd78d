"""A recorded ReAct episode rewritten as a RubricEM scaffold episode (Plan / Research / Review / Answer), turn by
turn, in the tags the scaffold oracle writes (:mod:`.scaffold_oracle`): what the stagewise judge needs to score the
judge bench's trajectories (gold and perturbed, :mod:`components.judges.bench.trajectories`) stage by stage. Unlike
:func:`.scaffold_oracle.scaffold_replies`, each reply states only what the recorded episode did, so a perturbation
shows in the stage it touches (:func:`scaffold_episode`).

    episode = scaffold_episode(question, trajectory, labels["hop_steps"])
    split_stages(scaffold_text(episode)).blocks        # components.judges.render.scaffold_text
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from components.methods.rubricem.scaffold_oracle import plan_reply, split_turn, tool_call_text, writing_plan
from components.schemas import Question, SubQuestion, Trajectory
from components.warmstart.thoughts import fact, need

__all__ = ["scaffold_episode"]


def _state(chain: Sequence[SubQuestion], settled: set[int]) -> str:
    done = [f"item {k + 1} = {h.answer} ({h.doc_id})" for k, h in enumerate(chain) if k in settled]
    open_items = [str(k + 1) for k in range(len(chain)) if k not in settled]
    parts = [f"Settled: {', '.join(done)}." if done else "Nothing is settled yet."]
    if open_items:
        parts.append(f"Open: item{'s' if len(open_items) > 1 else ''} {', '.join(open_items)}.")
    else:
        parts.append("Every item is settled.")
    return "<state_evaluation>" + " ".join(parts) + "</state_evaluation>"


def _review(question: Question, thought: str, answer: str, settled: set[int], facts: Sequence[str]) -> str:
    chain = question.gold_chain
    lines = [f'{k + 1}. {need(h)}: <cite id="{h.doc_id}">{facts[k]}</cite>' if k in settled
             else f"{k + 1}. {need(h)}: not found in what I read." for k, h in enumerate(chain)]
    plan = writing_plan(question, answer)
    return (f"<think>{thought}</think>\n{_state(chain, settled)}\n<review>\n<rubric_review>\n" + "\n".join(lines)
            + f"\n</rubric_review>\n<writing_plan>{plan}</writing_plan>\n</review>\n<answer>{answer}</answer>")


def scaffold_episode(question: Question, trajectory: Trajectory, hop_steps: Sequence[int | None]) -> Trajectory:
    """``trajectory`` (oracle-style ReAct turns ``Thought: ..\\nAction: tool[arg]``) with each turn's text
    rewritten in the scaffold's tags; steps, observations and the final answer are kept. The first tool turn plans
    as the oracle does (the plan depends on the question only), then calls the tool; each later tool turn keeps its
    thought in ``<think>`` and says in ``<state_evaluation>`` which items the earlier observations settled
    (``hop_steps``: the turn that first showed each hop, None if none did) and which are open, a lookup after every
    item is settled kept as it was (a detour); the finish turn reviews every item (a ``<cite>`` of the paragraph
    for a settled one, "not found" for an open one) and its ``<answer>`` is the episode's own, a wrong one
    included; an episode that ends without a finish has no review and no answer stage. Fact phrasings are drawn
    from one rng per question, item by item, so two episodes of a question phrase a fact they both found alike."""
    chain = question.gold_chain
    if len(hop_steps) != len(chain):
        raise ValueError(f"{question.id}: {len(hop_steps)} hop steps for a chain of {len(chain)} hops")
    rng = random.Random(f"scaffold-episode:{question.id}")
    facts = [fact(h, rng) for h in chain]
    steps = []
    for i, step in enumerate(trajectory.steps):
        thought, tool, argument = split_turn(step.raw)
        settled = {k for k, s in enumerate(hop_steps) if s is not None and s < i}
        if tool == "finish":
            raw = _review(question, thought, step.final_answer or argument, settled, facts)
        elif i == 0:
            raw = plan_reply(question, thought, tool, argument)
        else:
            raw = f"<think>{thought}</think>\n{_state(chain, settled)}\n{tool_call_text(tool, argument)}"
        steps.append(step.model_copy(update={"raw": raw}))
    return trajectory.model_copy(update={"steps": steps})
