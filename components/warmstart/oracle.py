"""Oracle trajectories for world questions: the gold chain followed through the real tools, recorded by
the agent itself (ReAct, or RubricEM's scaffold), so they are in the exact format a policy is trained and
evaluated in.

``plan_turns`` walks the question's gold chain with the toolbox the agent will use. For each hop it
searches the hop's paragraph title (once more with the kind of entity, "Corumbre city", when look-alike
names outrank it), unless the fact is already visible in an earlier observation (no
call) or the paragraph was already listed in a search result (then it browses that id); when the
search result's snippet stops before the fact it browses the paragraph. Each turn gets a short thought
written from the facts just learned and the next sub-question (``thoughts``); the last turn finishes
with the gold answer. ``oracle_trajectory`` replays those turns (rewritten in the scaffold's tags for the
scaffold agent, see ``scaffold_oracle``) as the policy of the agent,
which calls the tools and records the ``Trajectory`` (real observations, truncation, budgets) exactly
as in an evaluation episode; the result is checked (the agent's observations must be the planned
ones, and ``rejection.problems`` must find nothing).

    traj = asyncio.run(oracle_trajectory(question, toolbox.for_question(question), params.agent))
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from components.agents.params import AgentParams
from components.agents.react import agent_class
from components.llm.base import ChatModel, Completion, Message, PermanentLLMError, Sampling
from components.schemas import Question, SubQuestion, Trajectory
from components.warmstart.formats import warm_start_format
from components.warmstart.rejection import problems
from components.warmstart.thoughts import Thoughts, conclusion, entity_kind
from components.world.oracle import OracleError, hop_titles


class OracleEpisodeError(OracleError):
    """A question the oracle cannot turn into a valid episode; ``kind`` says why (for the stage's counts)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class PlannedTurn:
    raw: str
    observation: str | None  # the tool observation as the policy sees it; None for the finish turn
    hop: int = 0  # the gold-chain hop this turn works on (hops before it are settled); len(chain) to finish
    action: str = ""  # "search[..]", "browse[..]" or "finish[..]"


def _visible(observation: str, limit: int) -> str:
    """The part of an observation the policy sees after the agent's truncation (conservatively)."""
    return observation if len(observation) <= limit else observation[: limit - 15]


def _doc_text(observation: str, doc_id: str, browsed: bool) -> str:
    """What an observation shows of one document: the whole text of a browse, the hit line of a search."""
    if browsed:
        return observation
    return "\n".join(line for line in observation.splitlines() if f"({doc_id})" in line.split(":", 1)[0])


def plan_turns(question: Question, toolbox, settings: AgentParams, rng: random.Random | None = None) -> list[PlannedTurn]:
    """The oracle's turns for ``question`` through ``toolbox`` (raises OracleEpisodeError when the gold
    chain cannot be followed, e.g. a search that does not list the hop's paragraph)."""
    if not question.gold_chain:
        raise OracleEpisodeError("no_chain", f"{question.id}: no gold chain to follow")
    rng = rng or random.Random(f"oracle:{question.id}")
    thoughts = Thoughts(rng, question.gold_chain, question.metadata.get("compare"))
    titles = hop_titles(question)
    limit = settings.observation_max_chars
    visible: dict[str, str] = {}  # doc id -> what the observations so far showed of it
    turns: list[PlannedTurn] = []
    learned: list[SubQuestion] = []  # hops resolved since the last turn: the next thought states them

    def call(kind: str, argument: str, thought: str, hop: int) -> str:
        out = toolbox.call(kind, argument)
        if out.error:
            raise OracleEpisodeError("tool_error", f"{question.id}: {kind}[{argument}] failed: {out.error}")
        seen = _visible(out.observation, limit)
        for doc_id in out.doc_ids:
            part = _doc_text(seen, doc_id, browsed=kind == "browse")
            if part:
                visible[doc_id] = visible.get(doc_id, "") + "\n" + part
        action = f"{kind}[{argument}]"
        turns.append(PlannedTurn(f"Thought: {thought}\nAction: {action}", seen, hop, action))
        return seen

    for k, (hop, title) in enumerate(zip(question.gold_chain, titles)):
        doc_id = hop.doc_id
        if doc_id is None:
            raise OracleEpisodeError("no_chain", f"{question.id} hop {k}: the gold chain names no paragraph")
        if hop.answer in visible.get(doc_id, ""):
            learned.append(hop)
            continue
        if doc_id in visible:
            call("browse", doc_id, thoughts.browse(learned, hop, title, doc_id, shown_before=True), k)
        else:
            thought = thoughts.first(title) if not turns else thoughts.search(learned, hop, title)
            call("search", title, thought, k)
            kind = entity_kind(title, question.gold_chain)
            if doc_id not in visible and kind in ("film", "city", "company"):
                # look-alike names outranked the entity: say what kind of entity it is
                call("search", f"{title} {kind}", thoughts.refine(title, kind), k)
            if doc_id not in visible:
                raise OracleEpisodeError(
                    "not_retrieved", f"{question.id} hop {k}: search[{title}] does not list paragraph {doc_id}")
            if hop.answer not in visible[doc_id]:
                call("browse", doc_id, thoughts.browse([], hop, title, doc_id, shown_before=False), k)
        if hop.answer not in visible[doc_id]:
            raise OracleEpisodeError(
                "not_visible", f"{question.id} hop {k}: {hop.answer!r} is not visible in paragraph {doc_id}")
        learned = [hop]
    answer = question.answers[0]
    hop_answers = [h.answer for h in question.gold_chain]
    final = conclusion(hop_answers, question.metadata.get("compare"), answer, rng)
    turns.append(PlannedTurn(f"Thought: {thoughts.finish(learned, final)}\nAction: finish[{answer}]", None,
                             len(question.gold_chain), f"finish[{answer}]"))
    return turns


class ReplayPolicy(ChatModel):
    """A policy that answers each call with the next planned turn (and fails once they run out)."""

    def __init__(self, turns: list[str], name: str = "oracle"):
        self.turns, self.name, self.calls = list(turns), name, 0

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        if self.calls >= len(self.turns):
            raise PermanentLLMError(f"the oracle planned {len(self.turns)} turns; the agent asked for more")
        text = self.turns[self.calls]
        self.calls += 1
        return Completion(texts=[text], model=self.name)


async def oracle_trajectory(question: Question, toolbox, settings: AgentParams,
                            rng: random.Random | None = None, agent: str = "react",
                            options: dict | None = None) -> Trajectory:
    """The oracle episode of ``question``, recorded by the agent registered as ``agent`` (``react``, or
    ``scaffold`` with the turns rewritten by :func:`components.methods.rubricem.scaffold_oracle.scaffold_replies`)
    through ``toolbox`` (already scoped to the question when the scope is ``question``); ``options`` are the
    agent's keyword options. OracleEpisodeError when it is not a valid, grounded, correct episode within the
    agent's budgets."""
    turns = plan_turns(question, toolbox, settings, rng)
    tool_turns = len(turns) - 1
    if len(turns) > settings.max_turns or tool_turns > settings.max_search_calls:
        raise OracleEpisodeError("over_budget", f"{question.id}: the oracle needs {tool_turns} tool calls and "
                                 f"{len(turns)} turns; the budget is {settings.max_search_calls} calls, "
                                 f"{settings.max_turns} turns")
    replies = warm_start_format(agent).replies(question, turns)
    runner = agent_class(agent)(ReplayPolicy(replies), toolbox, settings, **{**(options or {}), "name": "oracle"})
    traj = await runner.run(question)
    shown = [s.observation for s in traj.steps if s.final_answer is None]
    planned = [t.observation for t in turns if t.observation is not None]
    if len(shown) != len(planned) or any(p not in s for p, s in zip(planned, shown)):
        raise OracleEpisodeError("mismatch", f"{question.id}: the agent's observations differ from the planned ones")
    found = problems(traj, question, min_f1=1.0, agent=agent)
    if found:
        raise OracleEpisodeError("rejected", f"{question.id}: oracle episode rejected: {found}")
    return traj


async def oracle_episodes(
    worlds: Sequence, n_oracle: int, settings: AgentParams, agent: str = "react", options: dict | None = None,
) -> tuple[list[tuple[Trajectory, Question]], Counter]:
    """Up to ``n_oracle`` oracle episodes of ``agent`` spread evenly over ``worlds`` (``TrainingWorld``s),
    taking each world's questions in order and skipping the ones the oracle cannot do (counted by kind)."""
    episodes: list[tuple[Trajectory, Question]] = []
    failures: Counter = Counter()
    for w, world in enumerate(worlds):
        quota = n_oracle // len(worlds) + (1 if w < n_oracle % len(worlds) else 0)
        taken = 0
        for q in world.questions:
            if taken >= quota:
                break
            try:
                traj = await oracle_trajectory(q, world.toolbox.for_question(q), settings,
                                               random.Random(f"oracle:{world.seed}:{q.id}"), agent, options)
            except OracleError as exc:
                failures[getattr(exc, "kind", "no_chain")] += 1
                continue
            traj.metadata.update(world_seed=world.seed, question_type=q.type, answers=q.answers)
            episodes.append((traj, q))
            taken += 1
    return episodes, failures
