"""The ReAct search agent: reason, act with a tool (``search[query]``, ``browse[doc_id]``, ``finish[answer]``, taught
by a system prompt with one worked example), observe, repeat, then answer; and the ``AGENTS`` registry, from which
:func:`build_agent` builds a method's agent (``evaluate --method NAME`` picks it from ``params.methods``). Budgets:
``max_turns`` turns and ``max_search_calls`` tool calls (a tool call past it is refused with a request for the
answer); observations are cut to ``observation_max_chars``; a policy call that fails after the middleware's retries
ends the episode with ``finish_reason="llm_failure"``, never a guessed answer. Variants override the loop's seams
(:class:`ReActAgent`) instead of copying it.

    agent = ReActAgent(policy=pool.role("policy"), toolbox=toolbox, settings=params.agent)
    trajectory = asyncio.run(agent.run(question))
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

from components.agents.params import AgentParams, MethodParams
from components.agents.parsing import ParsedAction, parse_turn
from components.clipping import clip
from components.llm.base import ChatModel, ChatOutcome, Message, PolicyCall, Sampling, assistant, system, user
from components.method_registry import load_methods
from components.params import Params
from components.registry import Registry
from components.schemas import Question, Step, ToolCall, Trajectory

AGENTS: Registry[type] = Registry("agent")

SYSTEM_PROMPT = """\
You answer questions by looking facts up in an encyclopedia. You cannot rely on memory: every name in \
these questions is only described in the encyclopedia.

Each turn, write one line starting with "Thought:" (what you know so far and what you need next), then \
one line starting with "Action:" containing exactly one of:
  search[words]    look up one entity at a time, starting with the one named in the question
  browse[doc_id]   read the full paragraph of a search result
  finish[...]      give the final answer itself inside the brackets (a short name, year, number, or
                   yes/no), e.g. finish[1987]
After each action you receive an Observation. Read it, take the new name it gives you, and search for \
that name next: never repeat a search you already made. Stop as soon as you can answer.

Example
Question: Which river flows through the home town of the architect of the Velmora Library?
Thought: I need the architect of the Velmora Library first.
Action: search[Velmora Library]
Observation: [1] (d7) Velmora Library: The Velmora Library was designed by architect Ossian Threll ...
Thought: The architect is Ossian Threll. Now I need his home town.
Action: search[Ossian Threll]
Observation: [1] (d12) Ossian Threll: Ossian Threll was born in the town of Kestrow ...
Thought: He comes from Kestrow. Now the river of Kestrow.
Action: search[Kestrow]
Observation: [1] (d30) Kestrow: Kestrow is a town on the banks of the river Ammel ...
Thought: The river is the Ammel.
Action: finish[Ammel]
"""

# A short prompt for a policy that learned the format by SFT: fewer tokens per turn to train and to serve.
COMPACT_PROMPT = """\
Answer the question by looking facts up in an encyclopedia; every name in it is fictional, so search for it.
Each turn, write one Thought: line (what you know, what you need next) and one Action: line with exactly one of
search[name], browse[doc_id] or finish[...] with the short answer itself inside the brackets.
Search the entity the question names first, then each new name the observations give you; answer as soon as you can.
"""

SYSTEM_PROMPTS = {"teaching": SYSTEM_PROMPT, "compact": COMPACT_PROMPT}

FORMAT_REMINDER = (
    "I could not read an action in your reply. Reply with a Thought: line and then exactly one "
    "Action: line, such as Action: search[name] or Action: finish[answer]."
)
REPEAT_NOTE = (
    "(You already made exactly this call; its result is repeated below. Use the new names in it and "
    "look up the next entity, or answer.)\n"
)
# The answer slot is described, not shown as a bracketed word: a small policy copies a placeholder such as
# finish[answer] literally and answers "answer".
FORCE_MESSAGE = (
    "You have no steps left. Based only on the observations above, give your best final answer now: one "
    "line that starts with Action: finish[ and puts the short answer itself inside the brackets."
)
BUDGET_MESSAGE = (
    "The search budget is used up. Give your final answer now: Action: finish[ followed by the short answer "
    "itself and a closing bracket."
)


@dataclass
class EpisodeState:
    """What the loop carries between turns; agents built on ReAct (Co-ReAct, RubricEM) extend it.
    ``toolbox`` is the question's view of the tools (question-scoped retrieval); ``calls`` every policy
    call of the episode, in order."""

    question: Question
    toolbox: Any = None
    steps: list[Step] = field(default_factory=list)
    docs_seen: list[str] = field(default_factory=list)
    tool_calls: int = 0
    calls: list[PolicyCall] = field(default_factory=list)

    @property
    def last_observation(self) -> str:
        return self.steps[-1].observation if self.steps else ""


@dataclass
class Proposal:
    """One proposed turn: the raw reply, its parse, the call's accounting and tag, and extra fields for
    the :class:`Step` (a rubric, verification verdicts, retries)."""

    raw: str
    parsed: ParsedAction
    call: PolicyCall | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    step_fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_text(cls, raw: str, **step_fields: Any) -> Proposal:
        return cls(raw=raw, parsed=parse_turn(raw), step_fields=step_fields)


class PolicyFailure(Exception):
    """A policy call failed after the middleware's retries; the episode ends with ``llm_failure``."""


@AGENTS.register("react")
class ReActAgent:
    """The loop, split into seams that variants override instead of copying it: :meth:`propose` asks the policy
    for one turn and parses it into a :class:`Proposal` (Co-ReAct injects a rubric, verifies and retries here;
    RubricEM runs its stage scaffold); :meth:`commit` records the turn as a :class:`Step` and runs its tool off the
    event loop; :meth:`call_policy` is the one way an agent calls the policy, tagging the call with a
    :class:`~components.llm.base.PolicyCall` (trainable or not, stage/step segments) that training reads and the
    trajectory records; :meth:`messages`, :meth:`sampling`, :meth:`force_answer` and :meth:`finish` are reused."""

    def __init__(self, policy: ChatModel, toolbox, settings: AgentParams | None = None,
                 system_prompt: str = SYSTEM_PROMPT, name: str | None = None):
        self.policy = policy
        self.toolbox = toolbox
        self.settings = settings or AgentParams()
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt)  # a named prompt or the text
        self.name = name or getattr(policy, "name", "policy")

    @classmethod
    def from_roles(cls, roles, toolbox, settings: AgentParams, options: dict[str, Any]) -> ReActAgent:
        """Build from role-bound models (``roles(name)`` returns the model of a role); ``options`` come
        from the method's entry in ``params.methods``."""
        return cls(roles("policy"), toolbox, settings, **options)

    # -- pieces subclasses and other methods reuse -------------------------------------------------------
    def start(self, question: Question) -> EpisodeState:
        scoped = getattr(self.toolbox, "for_question", None)
        return EpisodeState(question, toolbox=scoped(question) if scoped is not None else self.toolbox)

    def messages(self, state: EpisodeState) -> list[Message]:
        """What the policy sees before its next turn, in the configured history format:
        ``chat`` replays earlier turns as assistant/observation messages; ``scratchpad`` puts the question
        and a numbered action/observation history into one fresh user message (small models copy their
        own earlier assistant turns verbatim, and loop, when shown them as chat turns)."""
        head = [system(self.system_prompt)]
        if self.settings.history_format == "chat":
            msgs = head + [user(f"Question: {state.question.question}")]
            for step in state.steps:
                msgs.append(assistant(step.raw.strip()))
                if step.final_answer is None:
                    msgs.append(user(f"Observation: {step.observation}"))
            return msgs
        lines = [f"Question: {state.question.question}", ""]
        if not state.steps:
            lines.append("You have not made any step yet.")
        else:
            lines.append("Your steps so far:")
            for step in state.steps:
                lines.append(f"{step.index + 1}. Action: {step.action or '(unreadable)'}")
                lines.append(f"   Observation: {step.observation}")
        lines += ["", "Write your next Thought and Action."]
        return head + [user("\n".join(lines))]

    def sampling(self, temperature: float | None = None, seed: int | None = None, n: int = 1) -> Sampling:
        return Sampling(
            temperature=self.settings.temperature if temperature is None else temperature,
            max_tokens=self.settings.max_tokens, stop=("\nObservation:", "Observation:"), seed=seed, n=n,
        )

    def truncate(self, text: str) -> str:
        return clip(text, self.settings.observation_max_chars, " ...[truncated]", marker_within=True)

    async def act(self, state: EpisodeState, parsed: ParsedAction) -> tuple[ToolCall | None, str]:
        """Run the parsed action's tool (if any) in a worker thread (dense retrieval encodes on the CPU and
        must not block other episodes); return the tool call and the observation text."""
        if parsed.kind == "invalid":
            return None, FORMAT_REMINDER
        if state.tool_calls >= self.settings.max_search_calls:
            return None, BUDGET_MESSAGE
        repeated = any(s.action == parsed.text and s.tool_call is not None for s in state.steps)
        toolbox = state.toolbox if state.toolbox is not None else self.toolbox
        call = await asyncio.to_thread(toolbox.call, parsed.kind, parsed.argument)
        state.tool_calls += 1
        if repeated:
            call = call.model_copy(update={"observation": REPEAT_NOTE + call.observation})
        for doc_id in call.doc_ids:
            if doc_id not in state.docs_seen:
                state.docs_seen.append(doc_id)
        observation = self.truncate(call.observation)
        return call.model_copy(update={"observation": observation}), observation

    async def call_policy(self, state: EpisodeState, messages: list[Message], sampling: Sampling, *,
                          kind: str = "turn", trainable: bool = True) -> tuple[ChatOutcome, PolicyCall]:
        """Call the policy, tagged for training: the tag's segment defaults to the index of the step being
        made; callers may change the tag after the reply (``call.trainable = False`` for a rejected draft)."""
        call = PolicyCall(kind=kind, trainable=trainable, segment=len(state.steps))
        state.calls.append(call)
        return await self.policy.chat(messages, sampling, call=call), call

    async def propose(self, state: EpisodeState, seed: int | None = None) -> Proposal:
        """Ask the policy for the next turn. Raises :class:`PolicyFailure` when the call fails."""
        out, call = await self.call_policy(state, self.messages(state), self.sampling(seed=seed))
        if not out.ok:
            raise PolicyFailure(out.message)
        return Proposal(raw=out.text, parsed=parse_turn(out.text), call=call, prompt_tokens=out.prompt_tokens,
                        completion_tokens=out.completion_tokens, latency_s=out.latency_s)

    async def commit(self, state: EpisodeState, proposal: Proposal) -> Step:
        """Append one turn to the episode: the step record (and the tool's observation the policy sees next)."""
        parsed = proposal.parsed
        step = Step(index=len(state.steps), raw=proposal.raw, thought=parsed.thought, action=parsed.text,
                    parse_error=parsed.error, prompt_tokens=proposal.prompt_tokens,
                    completion_tokens=proposal.completion_tokens, latency_s=proposal.latency_s,
                    **proposal.step_fields)
        if parsed.kind == "finish":
            step.final_answer = parsed.argument
        else:
            start = time.perf_counter()
            call, observation = await self.act(state, parsed)
            step.tool_call, step.observation = call, observation
            step.latency_s += time.perf_counter() - start
        state.steps.append(step)
        return step

    def finish(self, state: EpisodeState, reason: str, started: float, answer: str | None = None,
               **metadata) -> Trajectory:
        return Trajectory(
            question_id=state.question.id, question=state.question.question, steps=state.steps,
            final_answer=answer, finish_reason=reason, docs_seen=state.docs_seen, policy=self.name,
            prompt_tokens=sum(s.prompt_tokens for s in state.steps),
            completion_tokens=sum(s.completion_tokens for s in state.steps),
            wall_s=time.perf_counter() - started,
            metadata={**metadata, "policy_calls": [
                {"kind": c.kind, "trainable": c.trainable} for c in state.calls]} if state.calls else metadata,
        )

    # -- the loop ----------------------------------------------------------------------------------------
    async def run(self, question: Question, seed: int | None = None) -> Trajectory:
        started = time.perf_counter()
        state = self.start(question)
        for turn in range(self.settings.max_turns):
            try:
                proposal = await self.propose(state, seed=None if seed is None else seed + turn)
            except PolicyFailure as exc:
                return self.finish(state, "llm_failure", started, error=str(exc))
            step = await self.commit(state, proposal)
            if step.final_answer is not None:
                return self.finish(state, "answer", started, step.final_answer)
        reason = "search_budget" if state.tool_calls >= self.settings.max_search_calls else "max_turns"
        if not self.settings.force_answer:
            return self.finish(state, reason, started)
        answer = await self.force_answer(state, seed)
        return self.finish(state, reason, started, answer, forced_answer=True)

    async def force_answer(self, state: EpisodeState, seed: int | None = None) -> str | None:
        """One last policy call that must answer; its reply is parsed like any turn (None if it does not
        answer or the call fails)."""
        messages = self.messages(state) + [user(FORCE_MESSAGE)]
        if self.settings.history_format == "scratchpad":  # keep one user message
            messages = messages[:-2] + [user(messages[-2].content.rsplit("\n", 1)[0] + "\n" + FORCE_MESSAGE)]
        out, _ = await self.call_policy(state, messages, self.sampling(seed=seed), kind="forced_answer")
        if not out.ok:
            return None
        parsed = parse_turn(out.text)
        return parsed.argument if parsed.kind == "finish" else None

    async def run_many(self, questions: list[Question], seed: int | None = None, progress=None) -> list[Trajectory]:
        """Episodes concurrently (the policy's middleware bounds the concurrency), in input order."""

        async def one(i: int, q: Question) -> Trajectory:
            traj = await self.run(q, seed=None if seed is None else seed + 1000 * i)
            if progress is not None:
                progress.update(1)
            return traj

        return list(await asyncio.gather(*(one(i, q) for i, q in enumerate(questions))))


def agent_class(name: str) -> type:
    """The agent class registered as ``name`` (or a dotted import path); the methods' agents register when
    their packages load (:func:`components.method_registry.load_methods`)."""
    if name not in AGENTS:
        load_methods()
    return AGENTS.get(name)


def agent_options(params: Params, spec: MethodParams) -> dict[str, Any]:
    """The options a method's agent is built with: the agent's defaults (its ``options_from_sections``, when it has
    one, given the params sections its parameters name) overridden by the method's own ``options``."""
    defaults = getattr(agent_class(spec.agent), "options_from_sections", None)
    if defaults is None:
        return dict(spec.options)
    sections = {name: getattr(params, name) for name in inspect.signature(defaults).parameters}
    return {**defaults(**sections), **spec.options}


def build_agent(name: str, roles, toolbox, settings: AgentParams, options: dict[str, Any] | None = None):
    """The agent registered as ``name`` (or a dotted import path), built from role-bound models."""
    return agent_class(name).from_roles(roles, toolbox, settings, dict(options or {}))
