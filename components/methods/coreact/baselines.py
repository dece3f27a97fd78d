"""The test-time baselines Co-ReAct is compared with (paper 4.1), as agents on the same ReAct loop, tools, token
budget and records (:class:`~components.methods.coreact.agent.GuidedAgent`); each changes only how a step is decided.

- ``self_refine`` (Madaan et al.): the policy critiques its own proposed action; when it calls the action
  insufficient, the draft is rejected (not trainable) and the policy proposes again with its own feedback,
  at most ``max_retries`` times.
- ``best_of_n`` (Snell et al.): ``n`` trajectories sampled at ``temperature``; an external ``scorer`` role rates
  each answered one (1-10); the best one's evidence is kept and the final answer is asked again greedily.
- ``step_back`` (Zheng et al.): before each action the policy writes a higher-level view of what the question
  needs (a separate, untrained call), which is placed in the context of the turn.
- ``critic`` (Gou et al.): after each proposed tool call the policy writes a verification query, the search
  tool runs it (counted in ``extra_tool_calls``, its documents join ``docs_seen``; it does not use the agent's
  search budget), and the policy judges the proposal against that evidence; a failed check triggers a retry
  with the grounded feedback, at most ``max_retries`` times.

**Plug-in mode** (paper 4.6): option ``plugin: true`` gives any of them the rubric generator
(``generator_role``); the rubric is injected before each step into the baseline's own context, with no Co-ReAct
verification or retry. A mechanism call that fails or cannot be read leaves the draft as it is (recorded);
it never rejects it.

    agent = build_agent("critic", pool.role, toolbox, params.agent, agent_options(params, params.methods["critic"]))
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from components.agents.parsing import parse_turn
from components.agents.react import AGENTS, FORCE_MESSAGE, Proposal
from components.judges.render import render_prefix
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import outer_json
from components.methods.coreact.agent import TOOLS, GuidedAgent, GuidedState, join_guidance, rubric_guidance
from components.methods.coreact.params import CoReActParams, RubricGeneratorParams
from components.schemas import Question, Rubric, Trajectory

__all__ = ["BestOfNAgent", "CriticAgent", "SelfRefineAgent", "StepBackAgent", "parse_json_reply"]

CRITIQUE_SYSTEM = (
    "You are a careful research agent reviewing the step you are about to take. You answer questions by "
    "searching an encyclopedia (search[words]), reading paragraphs (browse[doc_id]) and answering "
    "(finish[answer]). Decide whether the proposed step is the most useful next step: it should look up a fact "
    "the answer still depends on, use names found in earlier observations, not repeat an earlier call, and "
    "answer only when the evidence supports the answer."
)
STEP_BACK_SYSTEM = (
    "You plan research before acting. Take a step back from the details: say in one or two sentences what "
    "kind of fact the question ultimately asks for and which chain of lookups leads to it from what is known "
    "so far. Do not write an action."
)
SCORER_SYSTEM = (
    "You grade finished research attempts. An agent answered a question by searching an encyclopedia; you see "
    "its actions, what they returned and its final answer. Rate from 1 to 10 how well the evidence the agent "
    "found supports its final answer (10: every fact the answer depends on was looked up and the answer "
    "follows from it; 1: the answer has no support). Reply with JSON only: {\"score\": <1-10>}."
)
SELF_REFINE_SCHEMA = {"type": "object", "properties": {"sufficient": {"type": "boolean"}, "feedback": {"type": "string"}},
                      "required": ["sufficient", "feedback"], "additionalProperties": False}
QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
                "additionalProperties": False}
CRITIC_SCHEMA = {"type": "object", "properties": {"correct": {"type": "boolean"}, "feedback": {"type": "string"}},
                 "required": ["correct", "feedback"], "additionalProperties": False}
SCORE_SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}},
                "required": ["score"], "additionalProperties": False}


def parse_json_reply(text: str | None, key: str, kind: type) -> Any:
    """``obj[key]`` of the JSON object in a reply when it has type ``kind``; None otherwise (or no reply)."""
    if not text:
        return None
    try:
        obj = outer_json(text)
    except ValueError:
        return None
    value = obj.get(key) if isinstance(obj, dict) else None
    if kind is int and isinstance(value, bool):
        return None
    return value if isinstance(value, kind) else None


def _situation(agent: GuidedAgent, state: GuidedState, guidance: str | None) -> str:
    history = agent.history(state).strip() or "(nothing yet)"
    return join_guidance(f"Question:\n{state.question.question}\n\nYour steps so far:\n{history}", guidance)


def _proposed(proposal: Proposal) -> str:
    thought = " ".join(proposal.parsed.thought.split()) or "(none)"
    return f"Proposed step:\nThought: {thought}\nAction: {proposal.parsed.text}"


class _RetryingAgent(GuidedAgent):
    """A baseline with a retry budget (``params.coreact.max_retries`` unless its options say otherwise)."""

    def __init__(self, policy: ChatModel, toolbox, settings=None, *, max_retries: int = 1, **kwargs):
        super().__init__(policy, toolbox, settings, **kwargs)
        self.max_retries = max_retries

    @classmethod
    def options_from_sections(cls, coreact: CoReActParams, rubric_generator: RubricGeneratorParams) -> dict[str, Any]:
        return {**super().options_from_sections(coreact, rubric_generator), "max_retries": coreact.max_retries}


@AGENTS.register("self_refine")
class SelfRefineAgent(_RetryingAgent):
    method = "self_refine"

    async def critique(self, state: GuidedState, proposal: Proposal, guidance: str | None,
                       seed: int | None) -> dict[str, Any]:
        messages = [system(CRITIQUE_SYSTEM), user(
            f"{_situation(self, state, guidance)}\n\n{_proposed(proposal)}\n\n"
            'Is this step good enough? Reply with JSON only: {"sufficient": true or false, "feedback": '
            '"<what to change, if anything>"}')]
        text = await self.side_call(state, messages, "critique", seed, SELF_REFINE_SCHEMA)
        return {"sufficient": parse_json_reply(text, "sufficient", bool),
                "feedback": parse_json_reply(text, "feedback", str) or "", "raw": text}

    async def decide(self, state: GuidedState, seed: int | None, rubric: Rubric | None,
                     record: dict[str, Any]) -> Proposal:
        guidance = rubric_guidance(rubric)
        proposal = await self.draft(state, seed, guidance)
        critiques: list[dict[str, Any]] = []
        record["critiques"], record["retries"] = critiques, 0
        while proposal.parsed.kind != "invalid" and record["retries"] < self.max_retries:
            critique = await self.critique(state, proposal, guidance, seed)
            critiques.append({"action": proposal.parsed.text, **critique})
            if critique["sufficient"] is not False:  # good enough, or the critique could not be read
                break
            proposal.call.trainable = False
            record["retries"] += 1
            feedback = (f'You judged your proposal "Action: {proposal.parsed.text}" insufficient: '
                        f"{critique['feedback'] or 'no reason given'}\nWrite an improved Thought and Action.")
            proposal = await self.draft(state, seed, join_guidance(guidance, feedback), kind="refine")
        return proposal


@AGENTS.register("step_back")
class StepBackAgent(GuidedAgent):
    method = "step_back"

    async def decide(self, state: GuidedState, seed: int | None, rubric: Rubric | None,
                     record: dict[str, Any]) -> Proposal:
        guidance = rubric_guidance(rubric)
        messages = [system(STEP_BACK_SYSTEM), user(_situation(self, state, guidance))]
        view = await self.side_call(state, messages, "step_back", seed)
        record["step_back"] = view.strip() if view else None
        perspective = f"Stepping back before you act:\n{view.strip()}" if view and view.strip() else None
        return await self.draft(state, seed, join_guidance(guidance, perspective))


@AGENTS.register("critic")
class CriticAgent(_RetryingAgent):
    method = "critic"

    async def verification_search(self, state: GuidedState, query: str) -> tuple[str, list[str]]:
        toolbox = state.toolbox if state.toolbox is not None else self.toolbox
        call = await asyncio.to_thread(toolbox.call, "search", query)
        state.extra_tool_calls += 1
        for doc_id in call.doc_ids:
            if doc_id not in state.docs_seen:
                state.docs_seen.append(doc_id)
        return self.truncate(call.observation), list(call.doc_ids)

    async def decide(self, state: GuidedState, seed: int | None, rubric: Rubric | None,
                     record: dict[str, Any]) -> Proposal:
        guidance = rubric_guidance(rubric)
        proposal = await self.draft(state, seed, guidance)
        checks: list[dict[str, Any]] = []
        record["checks"], record["retries"] = checks, 0
        while proposal.parsed.kind in TOOLS and record["retries"] < self.max_retries:
            situation = f"{_situation(self, state, guidance)}\n\n{_proposed(proposal)}"
            ask = [system(CRITIQUE_SYSTEM), user(
                f"{situation}\n\nBefore this step is run, write one search query whose results would show whether "
                'it is right (for example, check a name it relies on). Reply with JSON only: {"query": "<words>"}')]
            query = parse_json_reply(await self.side_call(state, ask, "verify_query", seed, QUERY_SCHEMA), "query", str)
            check: dict[str, Any] = {"action": proposal.parsed.text, "query": query}
            checks.append(check)
            if not query or not query.strip():
                break
            evidence, check["doc_ids"] = await self.verification_search(state, query)
            judge = [system(CRITIQUE_SYSTEM), user(
                f"{situation}\n\nVerification search: {query}\nResults:\n{evidence}\n\nGiven these results, is the "
                'proposed step correct and useful? Reply with JSON only: {"correct": true or false, "feedback": '
                '"<what the results show>"}')]
            text = await self.side_call(state, judge, "critique", seed, CRITIC_SCHEMA)
            check["correct"] = parse_json_reply(text, "correct", bool)
            check["feedback"] = parse_json_reply(text, "feedback", str) or ""
            if check["correct"] is not False:
                break
            proposal.call.trainable = False
            record["retries"] += 1
            feedback = (f'Your proposal "Action: {proposal.parsed.text}" was checked with the search "{query}", '
                        f"which returned:\n{evidence}\nThe check found: {check['feedback'] or 'it is not right'}\n"
                        "Write a corrected Thought and Action.")
            proposal = await self.draft(state, seed, join_guidance(guidance, feedback), kind="retry")
        return proposal


@AGENTS.register("best_of_n")
class BestOfNAgent(GuidedAgent):
    """``n`` sampled trajectories, an external scorer, a greedy final answer (see the module doc). The sampled
    trajectories are run by a :class:`GuidedAgent` at ``temperature`` (the rubric injected in plug-in mode);
    the final answer is asked of the policy at the agent's own temperature (greedy by default) on the chosen
    trajectory's evidence, falling back to that trajectory's own answer when the call fails."""

    method = "best_of_n"
    ROLE_OPTIONS: ClassVar[dict[str, str]] = {"scorer": "verifier"}

    def __init__(self, policy: ChatModel, toolbox, settings=None, *, scorer: ChatModel, n: int = 4,
                 temperature: float = 0.7, **kwargs):
        super().__init__(policy, toolbox, settings, **kwargs)
        self.scorer, self.n = scorer, n
        sampled = self.settings.model_copy(update={"temperature": temperature})
        self.sampler = GuidedAgent(policy, toolbox, sampled, generator=self.generator, token_budget=self.token_budget,
                                   observation_chars=self.observation_chars, judge_max_tokens=self.judge_max_tokens,
                                   system_prompt=self.system_prompt, name=self.name)

    @classmethod
    def options_from_sections(cls, coreact: CoReActParams, rubric_generator: RubricGeneratorParams) -> dict[str, Any]:
        return {**super().options_from_sections(coreact, rubric_generator), "n": coreact.best_of_n,
                "temperature": coreact.best_of_n_temperature}

    def scorer_messages(self, trajectory: Trajectory) -> list[Message]:
        history = render_prefix([s for s in trajectory.steps if s.final_answer is None], self.observation_chars)
        return [system(SCORER_SYSTEM), user(
            f"Question:\n{trajectory.question}\n\nThe agent's steps:\n{history.strip() or '(none)'}\n\n"
            f"Final answer: {trajectory.final_answer}")]

    async def rate(self, state: GuidedState, trajectory: Trajectory) -> int | None:
        if trajectory.final_answer is None:
            return None
        sampling = Sampling(temperature=0.0, max_tokens=self.judge_max_tokens, json_schema=SCORE_SCHEMA)
        out = await self.scorer.chat(self.scorer_messages(trajectory), sampling)
        state.count_outcome("scorer", out)
        value = parse_json_reply(out.text, "score", int) if out.ok else None
        return value if value is not None and 1 <= value <= 10 else None

    async def run(self, question: Question, seed: int | None = None) -> Trajectory:
        started = time.perf_counter()
        seeds = [None if seed is None else seed + 7919 * k for k in range(self.n)]
        samples = await asyncio.gather(*(self.sampler.run(question, seed=s) for s in seeds))
        state = self.start(question)
        scores = await asyncio.gather(*(self.rate(state, t) for t in samples))
        rated = [k for k, s in enumerate(scores) if s is not None]
        answered = [k for k, t in enumerate(samples) if t.final_answer is not None]
        if rated:
            chosen = max(rated, key=lambda k: (scores[k], -k))
        else:  # nothing could be rated: the first answered sample (recorded as a fallback)
            chosen = answered[0] if answered else 0
        best = samples[chosen]
        state.steps = [s for s in best.steps if s.final_answer is None]
        state.docs_seen, state.tool_calls = list(best.docs_seen), best.n_tool_calls
        for t in samples:
            for role, c in t.metadata["guided"]["cost"].items():
                mine = state.cost.setdefault(role, {k: 0 for k in c})
                for k, v in c.items():
                    mine[k] += v
        state.records = list(best.metadata["guided"]["steps"])
        answer = await self.force_answer(state, seed)
        greedy_failed = answer is None
        if greedy_failed:
            answer = best.final_answer
        reason = "answer" if answer is not None else best.finish_reason
        summary = {"chosen": chosen, "fallback": not rated, "greedy_answer_failed": greedy_failed,
                   "candidates": [{"answer": t.final_answer, "finish_reason": t.finish_reason, "score": s,
                                   "tool_calls": t.n_tool_calls, "steps": len(t.steps)}
                                  for t, s in zip(samples, scores, strict=True)]}
        return self.finish(state, reason, started, answer, best_of_n=summary)

    async def force_answer(self, state: GuidedState, seed: int | None = None) -> str | None:
        """The greedy answer on the chosen trajectory's evidence (the ReAct forced answer, greedy)."""
        messages = self.messages(state, FORCE_MESSAGE)
        out, _ = await self.call_policy(state, messages, self.sampling(seed=seed), kind="answer")
        if not out.ok:
            return None
        parsed = parse_turn(out.text)
        return parsed.argument if parsed.kind == "finish" else None
