"""RubricEM's Plan / Research / Review / Answer scaffold agent (paper 3.2, B.1): its prompts and the ReAct-seam
agent that runs it. The format itself (tags, stage and turn parsers, validator) is
:mod:`components.methods.rubricem.scaffold_format`.

One episode, as the policy writes it (tool outputs come from the environment)::

    <think>..</think><structured_plan><deep_analysis>..</deep_analysis><rubric>..</rubric>
    <research_plan>..</research_plan></structured_plan><call_tool name="search">Velmora Library</call_tool>
    <tool_output>..</tool_output>
    <think>..</think><state_evaluation>..</state_evaluation><call_tool name="browse">d7</call_tool>
    <tool_output>..</tool_output>
    <think>..</think><state_evaluation>..</state_evaluation><review><rubric_review>.. <cite id="d7">..</cite>
    </rubric_review><writing_plan>..</writing_plan></review><answer>Ammel</answer>

The agent tags each reply with the stages it spans (``PolicyCall.spans``: stage k's tokens carry segment id k).

    agent = ScaffoldAgent(policy, toolbox, params.agent, guidance=bank_guidance)   # or AGENTS.get("scaffold")
    trajectory = asyncio.run(agent.run(question))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.agents.parsing import ParsedAction
from components.agents.react import AGENTS, EpisodeState, PolicyFailure, Proposal, ReActAgent
from components.methods.rubricem.scaffold_format import (
    PLAN,
    STAGES,
    complete_reply,
    parse_scaffold_turn,
    stage_spans,
)
from components.judges.render import tool_output
from components.llm.base import Message, Sampling, assistant, system, user
from components.schemas import Question, Step, ToolCall, Trajectory

SYSTEM_PROMPT = """\
You answer questions by researching an encyclopedia. Every name in these questions exists only in the \
encyclopedia, so look each fact up. You work in four stages and mark each with tags.

PLAN (first reply only; never answer in it)
<think>short free notes on what the question asks</think>
<structured_plan>
<deep_analysis>what is asked, which facts are missing, how many lookups it needs</deep_analysis>
<rubric>the checklist a correct answer must meet: each fact to find, and mistakes to avoid</rubric>
<research_plan>the lookups in order, starting with the entity named in the question</research_plan>
</structured_plan>
<call_tool name="search">the first lookup</call_tool>

RESEARCH (each reply after a <tool_output>)
<think>what the new output tells you</think>
<state_evaluation>which rubric items are settled, which are open, whether the plan still holds (if not, \
write a revised <structured_plan> here)</state_evaluation>
then one tool call: <call_tool name="search">words</call_tool> or <call_tool name="browse">doc id</call_tool>

REVIEW and ANSWER (once the evidence settles every rubric item)
<think>...</think>
<state_evaluation>...</state_evaluation>
<review>
<rubric_review>each rubric item with its evidence, citing the document: <cite id="d12">the fact</cite></rubric_review>
<writing_plan>the answer and why it follows from the evidence</writing_plan>
</review>
<answer>the short answer itself: a name, year, number, or yes/no</answer>

Rules: one tool call or one answer per reply; stop right after </call_tool> or </answer>; never write \
<tool_output> yourself; cite only document ids a tool showed you.

Example (second reply, after searching Velmora Library)
<think>The library's architect is Ossian Threll; I still need his home town and its river.</think>
<state_evaluation>Settled: architect = Ossian Threll (d7). Open: his home town, its river. Plan holds.\
</state_evaluation>
<call_tool name="search">Ossian Threll</call_tool>
"""

FIRST_TURN = "Write your PLAN stage and the first tool call."
NEXT_TURN = ("Write your next reply: <think>, <state_evaluation>, then one <call_tool>, or the <review> and the "
             "<answer> once the evidence is enough.")
FORCE_TURN = ("You have no lookups left. Write the <review> of the evidence above and then the <answer> with the "
              "short answer itself.")
REMINDER = ("I could not read a tool call or an answer in your reply. End each reply with exactly one "
            '<call_tool name="search">words</call_tool>, <call_tool name="browse">doc id</call_tool>, or, '
            "after the <review>, <answer>the short answer</answer>.")
BUDGET = "The lookup budget is used up. Write the <review> and then <answer>the short answer</answer> now."

# ----------------------------------------------------------------------------------------- the agent


@dataclass
class ScaffoldState(EpisodeState):
    """The ReAct episode state plus the stage in force and the bank guidance injected for this episode."""

    stage: int = PLAN
    reference: str | None = None
    retrieval: dict[str, Any] = field(default_factory=dict)


@AGENTS.register("scaffold")
class ScaffoldAgent(ReActAgent):
    """The ReAct loop with the scaffold's prompt, parser and stage tags. ``guidance(question)`` returns
    ``(reference block or None, info)``: the rubric bank's injection (see :mod:`components.methods.rubricem.bank`),
    placed before the question; ``max_tokens`` overrides ``settings.max_tokens`` (scaffold turns are long)."""

    def __init__(self, policy, toolbox, settings=None, system_prompt: str = SYSTEM_PROMPT, name: str | None = None,
                 guidance=None, max_tokens: int | None = None):
        super().__init__(policy, toolbox, settings, system_prompt=system_prompt, name=name)
        self.guidance, self.max_tokens = guidance, max_tokens

    def start(self, question: Question) -> ScaffoldState:
        base = super().start(question)
        state = ScaffoldState(**vars(base))
        if self.guidance is not None:
            state.reference, state.retrieval = self.guidance(question)
        return state

    def _question_block(self, state: ScaffoldState) -> str:
        head = f"{state.reference}\n\n" if state.reference else ""
        return f"{head}Question: {state.question.question}"

    def messages(self, state: ScaffoldState, instruction: str | None = None) -> list[Message]:
        instruction = instruction or (NEXT_TURN if state.steps else FIRST_TURN)
        if self.settings.history_format == "chat":
            msgs = [system(self.system_prompt), user(f"{self._question_block(state)}\n\n{FIRST_TURN}")]
            for step in state.steps:
                msgs.append(assistant(step.raw.strip()))
                if step.final_answer is None:
                    msgs.append(user(tool_output(step.observation).strip()))
            if instruction != NEXT_TURN and state.steps:
                msgs.append(user(instruction))
            return msgs
        done = "".join(s.raw.strip() + tool_output(s.observation) for s in state.steps)
        body = f"Your work so far:\n{done}\n" if done else ""
        return [system(self.system_prompt), user(f"{self._question_block(state)}\n\n{body}{instruction}")]

    def sampling(self, temperature: float | None = None, seed: int | None = None, n: int = 1) -> Sampling:
        return Sampling(temperature=self.settings.temperature if temperature is None else temperature,
                        max_tokens=self.max_tokens or self.settings.max_tokens,
                        stop=("</call_tool>", "</answer>", "<tool_output>"), seed=seed, n=n)

    async def _reply(self, state: ScaffoldState, messages: list[Message], seed: int | None, kind: str) -> Proposal:
        out, call = await self.call_policy(state, messages, self.sampling(seed=seed), kind=kind)
        if not out.ok:
            raise PolicyFailure(out.message)
        spans = stage_spans(out.text, state.stage)
        call.segment, call.spans = spans[0][1], spans
        state.stage = spans[-1][1]
        raw = complete_reply(out.text)
        return Proposal(raw=raw, parsed=parse_scaffold_turn(raw), call=call, prompt_tokens=out.prompt_tokens,
                        completion_tokens=out.completion_tokens, latency_s=out.latency_s,
                        step_fields={"stage": STAGES[state.stage]})

    async def propose(self, state: ScaffoldState, seed: int | None = None) -> Proposal:
        return await self._reply(state, self.messages(state), seed, "turn")

    async def act(self, state: EpisodeState, parsed: ParsedAction) -> tuple[ToolCall | None, str]:
        if parsed.kind == "invalid":
            return None, REMINDER
        if state.tool_calls >= self.settings.max_search_calls:
            return None, BUDGET
        return await super().act(state, parsed)

    async def force_answer(self, state: ScaffoldState, seed: int | None = None) -> str | None:
        """One last reply that must review and answer; it is recorded as a step (its text is the review and
        answer stages the judge scores)."""
        try:
            proposal = await self._reply(state, self.messages(state, FORCE_TURN), seed, "forced_answer")
        except PolicyFailure:
            return None
        parsed = proposal.parsed
        state.steps.append(Step(index=len(state.steps), raw=proposal.raw, thought=parsed.thought, action=parsed.text,
                                parse_error=parsed.error, final_answer=parsed.argument if parsed.kind == "finish"
                                else None, prompt_tokens=proposal.prompt_tokens,
                                completion_tokens=proposal.completion_tokens, latency_s=proposal.latency_s,
                                **proposal.step_fields))
        return parsed.argument if parsed.kind == "finish" else None

    def finish(self, state: ScaffoldState, reason: str, started: float, answer: str | None = None,
               **metadata) -> Trajectory:
        if state.retrieval:
            metadata["retrieval"] = state.retrieval
        return super().finish(state, reason, started, answer, **metadata)
