"""The lab's worlds and the compact oracle episodes the nano policy learns from.

A lab world is the embedded world generator's (``params.world`` sizes; ``data.n_train + n_dev + n_test`` questions
split in that order, as the prepare stage splits them, or ``n_questions`` questions in one train split) with a BM25
index and the toolbox the stages build (``retrieval.top_k`` hits of ``retrieval.snippet_chars`` characters, browsed
paragraphs cut at ``agent.observation_max_chars``, in ``retrieval.scope``; the lab overlay makes them compact). A compact episode is the world oracle's plan
(:func:`components.warmstart.oracle.plan_turns`: the same searches, browses and answer) with each thought cut to a
few words (the fact just learned: ``Thought: Torvel Ashmere``; ``Thought: start`` on the first turn; the compared
values before a comparison's answer) and a name inside an action's brackets set off by spaces (:func:`spaced`), replayed through the unchanged ReAct agent with the lab's short system prompt
(:data:`LAB_PROMPT`) and checked by rejection sampling like any warm-start episode. What changed against the
embedded warm start: the system prompt (one line instead of a worked example), the thoughts (a few words instead of
a sentence), the spaced action arguments, the observations (fewer, shorter hits), and the chat template
(:mod:`components.lab.nano`).

The same plan in another agent's replies is another :class:`Protocol` (RubricEM's scaffold:
:mod:`components.lab.scaffold`).

    lab = build_lab_world(params, seed=1234)              # lab.splits["train" | "dev" | "test"]
    episodes, failures = compact_episodes(lab, lab.splits["train"][:50], params.agent)
    rows = sft_rows(episodes, params.agent)          # [(text, trainable), ...] per episode (chat history)
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from components.agents.params import AgentParams
from components.agents.react import ReActAgent
from components.llm.base import Message
from components.params import Params
from components.retrieval.bm25 import BM25Index
from components.retrieval.scope import world_question_paragraphs
from components.retrieval.tools import Toolbox, make_toolbox
from components.schemas import Question, Trajectory
from components.training.sft.trajectories import trajectory_rows
from components.warmstart.oracle import PlannedTurn, ReplayPolicy, plan_turns
from components.warmstart.rejection import problems
from components.world import World, generate_world
from components.world.oracle import OracleError
from components.world.params import WorldParams

__all__ = ["LAB_PROMPT", "REACT", "LabWorld", "Protocol", "WorldsToolbox", "build_lab_world", "compact_episodes",
           "compact_replies", "compact_thoughts", "lab_agent", "render_chat", "sft_rows", "spaced", "unread_questions"]

LAB_PROMPT = "Answer by looking names up. One Thought: line, then Action: search[name], browse[doc_id] or finish[answer]."


def render_chat(messages: list[Message], add_generation_prompt: bool) -> str:
    """The lab's chat template in Python (:data:`components.lab.nano.CHAT_TEMPLATE` renders the same text)."""
    text = "".join(f"<|{m.role}|>{m.content}<|end|>\n" for m in messages)
    return text + ("<|assistant|>" if add_generation_prompt else "")


@dataclass
class LabWorld:
    seed: int
    world: World
    questions: list[Question]
    toolbox: Toolbox

    splits: dict[str, list[Question]]


def _generate(w: WorldParams, seed: int, n_questions: int) -> World:
    return generate_world(seed=seed, n_people=w.n_people, n_films=w.n_films, n_cities=w.n_cities,
                          n_companies=w.n_companies, distractors_per_entity=w.distractors_per_entity,
                          question_mix=w.question_mix, n_questions=n_questions)


def build_lab_world(params: Params, seed: int, n_questions: int | None = None) -> LabWorld:
    """The world of ``seed`` with its toolbox (module doc)."""
    r, d = params.retrieval, params.data
    sizes = {"train": n_questions, "dev": 0, "test": 0} if n_questions else {
        "train": d.n_train, "dev": d.n_dev, "test": d.n_test}
    world = _generate(params.world, seed, sum(sizes.values()))
    drawn = world.split(**sizes)
    scoped = {q.id: q for q in world_question_paragraphs(world, [q for qs in drawn.values() for q in qs])}
    splits = {name: [scoped[q.id] for q in qs] for name, qs in drawn.items()}
    questions = [q for qs in splits.values() for q in qs]
    index = BM25Index(world.documents, snippet_chars=r.snippet_chars)
    toolbox = make_toolbox(index, world.documents, top_k=r.top_k, snippet_chars=r.snippet_chars,
                           browse_chars=params.agent.observation_max_chars, scope=r.scope)
    return LabWorld(seed, world, questions, toolbox, splits)


class WorldsToolbox:
    """Questions of several lab worlds behind one toolbox: an episode on a question gets its own world's tools
    (``for_question``, the agent's entry point), so one rollout batch can mix worlds."""

    def __init__(self, by_question: dict[str, Toolbox]):
        self.by_question = by_question

    def for_question(self, question: Question) -> Toolbox:
        return self.by_question[question.id].for_question(question)


def unread_questions(worlds: Sequence[LabWorld], settings: WorldParams,
                     read: int) -> tuple[list[Question], WorldsToolbox]:
    """The questions of each of ``worlds`` (built as ``settings`` say) that are not among the first ``read`` its seed
    draws (what the SFT reads there), interleaved world by world, their ids prefixed with their world's seed (every
    world numbers its questions alike), and the toolbox that serves each its world."""
    per_world, tools = [], {}
    for lab in worlds:
        known = {q.question for q in _generate(settings, lab.seed, read).questions}
        mine = [q.model_copy(update={"id": f"w{lab.seed}:{q.id}"}) for q in lab.questions if q.question not in known]
        tools |= {q.id: lab.toolbox for q in mine}
        per_world.append(mine)
    return [q for group in zip(*per_world) for q in group], WorldsToolbox(tools)


def lab_agent(policy, toolbox, settings: AgentParams) -> ReActAgent:
    """The ReAct agent as the lab runs it: the unchanged loop with :data:`LAB_PROMPT`."""
    return ReActAgent(policy, toolbox, settings, system_prompt=LAB_PROMPT)


def compact_thoughts(question: Question, turns: Sequence[PlannedTurn]) -> list[str]:
    """A few-word thought per planned turn (module doc): ``start``, the fact just learned, ``read`` before a browse,
    ``refine`` before a second search for the same hop, the compared values (or the answer) before the finish."""
    chain, out = question.gold_chain, []
    for i, turn in enumerate(turns):
        if turn.action.startswith("finish["):
            values = [h.answer for h in chain[-2:]] if question.metadata.get("compare") else [chain[-1].answer]
            thought = ", ".join(values)
        elif i == 0:
            thought = "start"
        elif turn.action.startswith("browse["):
            thought = "read"
        elif turns[i - 1].hop == turn.hop:  # a refined search for the same hop
            thought = "refine"
        else:
            thought = chain[turn.hop - 1].answer if turn.hop > 0 else "start"
        out.append(thought)
    return out


def compact_replies(question: Question, turns: Sequence[PlannedTurn]) -> list[str]:
    """The oracle's planned turns with a few-word thought each (module doc)."""
    return [f"Thought: {thought}\nAction: {spaced(turn.action)}"
            for thought, turn in zip(compact_thoughts(question, turns), turns)]


def spaced(action: str) -> str:
    """``search[Corus Ulawyn]`` as ``search[ Corus Ulawyn ]`` (finish too; a browse keeps its id as shown): the name
    then starts with a space, as everywhere in questions and observations, so the byte-level tokens the nano policy
    copies are the very tokens it reads (the parser strips the spaces)."""
    kind, _, rest = action.partition("[")
    return action if kind == "browse" else f"{kind}[ {rest[:-1]} ]"


@dataclass(frozen=True)
class Protocol:
    """How the nano policy speaks: the agent it runs under (``agent(policy, toolbox, settings)``), the oracle's
    planned turns written as that agent's compact replies, the warm-start format rejection sampling checks them
    in (:mod:`components.warmstart.formats`), and the tags the tokenizer keeps whole."""

    name: str
    agent: Callable[..., ReActAgent]
    replies: Callable[[Question, Sequence[PlannedTurn]], list[str]]
    tags: tuple[str, ...] = ()


REACT = Protocol("react", lab_agent, compact_replies)


async def _episode(question: Question, toolbox, settings: AgentParams, protocol: Protocol) -> Trajectory:
    tools = toolbox.for_question(question)
    turns = plan_turns(question, tools, settings, random.Random(f"lab-oracle:{question.id}"))
    if len(turns) > settings.max_turns or len(turns) - 1 > settings.max_search_calls:
        raise OracleError(f"{question.id}: over the agent's budget")
    traj = await protocol.agent(ReplayPolicy(protocol.replies(question, turns)), toolbox, settings).run(question)
    found = problems(traj, question, min_f1=1.0, agent=protocol.name)
    if found:
        raise OracleError(f"{question.id}: {found}")
    return traj


def compact_episodes(lab: LabWorld, questions: Sequence[Question], settings: AgentParams,
                     protocol: Protocol = REACT) -> tuple[list[tuple[Trajectory, Question]], Counter]:
    """Compact oracle episodes of ``questions`` in ``lab``'s world, in ``protocol``'s replies; questions the oracle
    cannot do within the agent's budgets (or whose episode rejection sampling refuses) are skipped and counted."""
    async def run() -> list:
        out = []
        for q in questions:
            try:
                out.append((await _episode(q, lab.toolbox, settings, protocol), q))
            except OracleError:
                out.append(None)
        return out

    results = asyncio.run(run())
    return [r for r in results if r is not None], Counter({"skipped": sum(r is None for r in results)})


def sft_rows(episodes: Sequence[tuple[Trajectory, Question]], settings: AgentParams,
             protocol: Protocol = REACT) -> list[list[tuple[str, bool]]]:
    """Training rows of the episodes as ``protocol``'s agent prompts the policy (chat template of the lab)."""
    agent = protocol.agent(None, None, settings)
    return [row for traj, q in episodes for row in trajectory_rows(agent, traj, q, render_chat)]
