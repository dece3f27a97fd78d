"""Co-ReAct inference (paper 3.3): Rubric -> Reason -> Act -> Verify -> Observe, on the ReAct seams.
:class:`GuidedAgent` is the unchanged ReAct loop plus what Co-ReAct and the test-time baselines of
:mod:`components.methods.coreact.baselines` share inside :meth:`propose`: a rubric written before each turn that may
call a tool and shown as a checklist, the token budget (paper: 6,000) after which the next turn must answer, and a
record per proposed step in ``trajectory.metadata["guided"]``. :class:`CoReActAgent` (registered ``coreact``) adds
verify and retry. Importing this module registers ``coreact`` and the baselines (``self_refine``, ``best_of_n``,
``step_back``, ``critic``).

    agent = build_agent("coreact", pool.role, toolbox, params.agent, agent_options(params, params.methods["coreact"]))
    trajectory = asyncio.run(agent.run(question, seed=7))
    trajectory.metadata["guided"]["steps"][0]["drafts"]     # verdicts of each verified draft
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.agents.params import MethodParams
from components.agents.parsing import ParsedAction, parse_turn
from components.agents.react import AGENTS, SYSTEM_PROMPT, EpisodeState, PolicyFailure, Proposal, ReActAgent
from components.judges.render import render_prefix
from components.llm.base import ChatModel, Message, Sampling, user
from components.methods.coreact.params import CoReActParams, RubricGeneratorParams
from components.methods.coreact.rubric_generator import RubricGenerator, render_rubric
from components.methods.coreact.verifier import Verification, VerifierMode, verify_action
from components.schemas import Question, Rubric, Trajectory

__all__ = ["CoReActAgent", "GuidedAgent", "GuidedState", "agent_options", "join_guidance"]

TOOLS = ("search", "browse")
TOKEN_BUDGET_MESSAGE = (
    "Your research has used up its token budget. Give your final answer now: one line that starts with "
    "Action: finish[ and puts the short answer itself inside the brackets."
)


def join_guidance(*parts: str | None) -> str | None:
    kept = [p.strip() for p in parts if p and p.strip()]
    return "\n\n".join(kept) or None


def rubric_guidance(rubric: Rubric | None) -> str | None:
    if rubric is None:
        return None
    return ("A reviewer wrote this checklist for your next action; meet as much of it as you can:\n"
            + render_rubric(rubric))


@dataclass
class GuidedState(EpisodeState):
    """The ReAct state plus the guided agents' bookkeeping."""

    context_tokens: int = 0  # prompt + completion tokens of the policy's last turn
    budget_hit: bool = False
    extra_tool_calls: int = 0  # tool calls outside the steps (CRITIC's verification searches)
    records: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, role: str, ok: bool, prompt_tokens: int = 0, completion_tokens: int = 0, *, calls: int = 1,
              failures: int | None = None) -> None:
        """``calls`` LLM calls of ``role``; ``failures`` of them failed (default: all when not ``ok``, else none)."""
        c = self.cost.setdefault(role, {"calls": 0, "failures": 0, "prompt_tokens": 0, "completion_tokens": 0})
        c["calls"] += calls
        c["failures"] += failures if failures is not None else (0 if ok else calls)
        c["prompt_tokens"] += prompt_tokens
        c["completion_tokens"] += completion_tokens

    def count_outcome(self, role: str, outcome: Any) -> None:
        self.count(role, outcome.ok, getattr(outcome, "prompt_tokens", 0), getattr(outcome, "completion_tokens", 0))


class GuidedAgent(ReActAgent):
    """ReAct with optional rubric injection, the token budget and per-step records. With a rubric generator a
    rubric for the next step is written before each turn that may call a tool and appended to the policy's context
    as a checklist (the baselines' plug-in mode is exactly this); once the policy's last context plus its reply
    reaches ``token_budget`` tokens the next turn must answer (a tool call proposed then is not run); one record per
    proposed step (rubric, drafts, verdicts, retries, a baseline's critiques) and the episode's calls and tokens per
    role go to ``trajectory.metadata["guided"]``, and ``Step.rubric`` holds the rubric shown before the step. A
    generator that fails or writes an unparseable rubric leaves the step unguided (recorded with its error).
    Subclasses change :meth:`decide`, the step's decision mechanism; ``RUBRIC_BY_DEFAULT`` says whether the
    agent builds a generator when its options do not say (``plugin``); ``ROLE_OPTIONS`` maps constructor
    keywords to the roles they are bound to by default (option ``<keyword>_role`` rebinds)."""

    method = "react"
    RUBRIC_BY_DEFAULT = False
    ROLE_OPTIONS: ClassVar[dict[str, str]] = {}

    def __init__(self, policy: ChatModel, toolbox, settings=None, *, generator: RubricGenerator | None = None,
                 token_budget: int = 6000, observation_chars: int = 400, judge_max_tokens: int = 256,
                 system_prompt: str = SYSTEM_PROMPT, name: str | None = None):
        super().__init__(policy, toolbox, settings, system_prompt=system_prompt, name=name)
        self.generator, self.token_budget = generator, token_budget
        self.observation_chars, self.judge_max_tokens = observation_chars, judge_max_tokens

    # -- construction from params ---------------------------------------------------------------------------
    @classmethod
    def options_from_sections(cls, coreact: CoReActParams, rubric_generator: RubricGeneratorParams) -> dict[str, Any]:
        """This agent's defaults from the ``coreact`` and ``rubric_generator`` sections."""
        c, g = coreact, rubric_generator
        return {"token_budget": c.token_budget, "observation_chars": c.observation_chars,
                "judge_max_tokens": c.judge_max_tokens,
                "generator_settings": {"max_criteria": g.max_criteria, "temperature": g.temperature,
                                       "top_p": g.top_p, "max_tokens": g.max_tokens,
                                       "max_chars": g.max_criterion_chars,
                                       # the prompt the generator was trained with; named only when it is not
                                       # the schema one, so evaluations keyed before the option keep their keys
                                       **({} if g.format_reward == "schema" else {"format_reward": g.format_reward})}}

    @classmethod
    def from_roles(cls, roles, toolbox, settings, options: dict[str, Any]) -> GuidedAgent:
        opts = dict(options)
        generator_settings = opts.pop("generator_settings", {})
        generator_role = opts.pop("generator_role", "rubric_generator")
        if opts.pop("plugin", cls.RUBRIC_BY_DEFAULT) and "generator" not in opts:
            opts["generator"] = RubricGenerator(roles(generator_role),
                                                observation_chars=opts.get("observation_chars", 400),
                                                **generator_settings)
        for keyword, default_role in cls.ROLE_OPTIONS.items():
            role = opts.pop(f"{keyword}_role", default_role)
            if keyword not in opts:
                opts[keyword] = roles(role)
        return cls(roles("policy"), toolbox, settings, **opts)

    # -- the pieces -------------------------------------------------------------------------------------------
    def start(self, question: Question) -> GuidedState:
        return GuidedState(**vars(super().start(question)))

    def messages(self, state: EpisodeState, guidance: str | None = None) -> list[Message]:
        """The ReAct messages with ``guidance`` (a rubric, feedback, a step-back view) added to the last user
        message; in the scratchpad format it goes before the closing instruction line."""
        msgs = super().messages(state)
        if not guidance:
            return msgs
        content = msgs[-1].content
        if self.settings.history_format == "scratchpad" and "\n" in content:
            head, last = content.rsplit("\n", 1)
            content = f"{head}\n\n{guidance}\n\n{last}"
        else:
            content = f"{content}\n\n{guidance}"
        return msgs[:-1] + [user(content)]

    def history(self, state: EpisodeState) -> str:
        """The committed steps as judges and verifiers see them."""
        return render_prefix(state.steps, self.observation_chars)

    async def call_policy(self, state: GuidedState, messages: list[Message], sampling: Sampling, *,
                          kind: str = "turn", trainable: bool = True):
        out, call = await super().call_policy(state, messages, sampling, kind=kind, trainable=trainable)
        state.count_outcome("policy", out)
        return out, call

    async def side_call(self, state: GuidedState, messages: list[Message], kind: str, seed: int | None = None,
                        json_schema: dict | None = None):
        """A policy call that is part of a method's mechanism (a critique, a step-back view): greedy, never
        trainable. Returns the reply text or None when the call failed."""
        sampling = Sampling(temperature=0.0, max_tokens=self.judge_max_tokens, seed=seed, json_schema=json_schema)
        out, _ = await self.call_policy(state, messages, sampling, kind=kind, trainable=False)
        return out.text if out.ok else None

    async def draft(self, state: GuidedState, seed: int | None, guidance: str | None = None,
                    kind: str = "turn") -> Proposal:
        """One policy turn with ``guidance`` in context; raises :class:`PolicyFailure` when the call fails."""
        out, call = await self.call_policy(state, self.messages(state, guidance), self.sampling(seed=seed), kind=kind)
        if not out.ok:
            raise PolicyFailure(out.message)
        state.context_tokens = out.prompt_tokens + out.completion_tokens
        return Proposal(raw=out.text, parsed=parse_turn(out.text), call=call, prompt_tokens=out.prompt_tokens,
                        completion_tokens=out.completion_tokens, latency_s=out.latency_s)

    async def rubric_for(self, state: GuidedState, seed: int | None, record: dict[str, Any]) -> Rubric | None:
        """The generator's rubric for the next step; None without a generator, once no tool call is left, or
        when the generator failed (recorded)."""
        if self.generator is None or state.tool_calls >= self.settings.max_search_calls:
            return None
        out = await self.generator.generate(state.question.question, state.steps, seed=seed)
        state.count("rubric_generator", not out.call_failed, out.prompt_tokens, out.completion_tokens)
        record["rubric"] = [c.model_dump() for c in out.rubric.criteria] if out.ok else None
        if not out.ok:
            record["rubric_error"], record["rubric_raw"] = out.error, out.raw
        return out.rubric

    async def budget_answer(self, state: GuidedState, seed: int | None) -> Proposal:
        """The turn after the token budget is spent: it must answer; a tool call in it is not run."""
        state.budget_hit = True
        out, call = await self.call_policy(state, self.messages(state, TOKEN_BUDGET_MESSAGE), self.sampling(seed=seed),
                                           kind="forced_answer")
        if not out.ok:
            raise PolicyFailure(out.message)
        parsed = parse_turn(out.text)
        if parsed.kind != "finish":
            parsed = ParsedAction("invalid", thought=parsed.thought, error="token budget spent: expected finish[...]")
        return Proposal(raw=out.text, parsed=parsed, call=call, prompt_tokens=out.prompt_tokens,
                        completion_tokens=out.completion_tokens, latency_s=out.latency_s)

    async def decide(self, state: GuidedState, seed: int | None, rubric: Rubric | None,
                     record: dict[str, Any]) -> Proposal:
        """The step's decision mechanism; plain ReAct with the rubric in context here."""
        return await self.draft(state, seed, rubric_guidance(rubric))

    async def propose(self, state: GuidedState, seed: int | None = None) -> Proposal:
        if state.context_tokens >= self.token_budget:
            return await self.budget_answer(state, seed)
        record: dict[str, Any] = {"step": len(state.steps)}
        state.records.append(record)
        rubric = await self.rubric_for(state, seed, record)
        proposal = await self.decide(state, seed, rubric, record)
        if rubric is not None:
            proposal.step_fields["rubric"] = render_rubric(rubric)
        record["action"] = proposal.parsed.text or None
        return proposal

    def finish(self, state: GuidedState, reason: str, started: float, answer: str | None = None,
               **metadata) -> Trajectory:
        metadata["guided"] = {"method": self.method, "steps": state.records, "cost": state.cost,
                              "token_budget_hit": state.budget_hit, "extra_tool_calls": state.extra_tool_calls,
                              **metadata.get("guided", {})}
        return super().finish(state, reason, started, answer, **metadata)


@AGENTS.register("coreact")
class CoReActAgent(GuidedAgent):
    """Inject, verify, retry. ``verify=False`` is the "w/o verification" ablation. An independent ``verifier`` role
    checks a proposed tool call against the rubric (:mod:`components.methods.coreact.verifier`: one checklist call,
    or one yes/no call per criterion with ``coreact.verifier_mode: criterion``); the step is accepted when the
    weighted fraction of satisfied criteria exceeds ``tau``, otherwise the draft is marked not trainable, recorded,
    and the policy proposes again with the unmet criteria and the verifier's reasons pinned in context, at most
    ``max_retries`` times (the last retry is taken as it is). A verifier that fails leaves the draft accepted
    (recorded with its error), never rejected."""

    method = "coreact"
    RUBRIC_BY_DEFAULT = True
    ROLE_OPTIONS: ClassVar[dict[str, str]] = {"verifier": "verifier"}

    def __init__(self, policy: ChatModel, toolbox, settings=None, *, verifier: ChatModel | None = None,
                 tau: float = 0.5, max_retries: int = 1, verify: bool = True,
                 verifier_mode: VerifierMode = "checklist", **kwargs):
        super().__init__(policy, toolbox, settings, **kwargs)
        if verify and verifier is None:
            raise ValueError("coreact: verify is on but no verifier model was given")
        self.verifier, self.tau, self.max_retries, self.verify = verifier, tau, max_retries, verify
        self.verifier_mode = verifier_mode

    @classmethod
    def options_from_sections(cls, coreact: CoReActParams, rubric_generator: RubricGeneratorParams) -> dict[str, Any]:
        return {**super().options_from_sections(coreact, rubric_generator), "tau": coreact.tau,
                "max_retries": coreact.max_retries, "verifier_mode": coreact.verifier_mode}

    @classmethod
    def from_roles(cls, roles, toolbox, settings, options: dict[str, Any]) -> CoReActAgent:
        if options.get("verify") is False:  # do not start a verifier that will never be asked
            options = {**options, "verifier": None}
        return super().from_roles(roles, toolbox, settings, options)

    async def check(self, state: GuidedState, proposal: Proposal, rubric: Rubric) -> Verification:
        v = await verify_action(self.verifier, state.question.question, self.history(state), proposal.parsed.thought,
                                proposal.parsed.text, rubric, tau=self.tau, max_tokens=self.judge_max_tokens,
                                mode=self.verifier_mode)
        state.count("verifier", not v.call_failed, v.prompt_tokens, v.completion_tokens, calls=v.calls,
                    failures=v.failed_calls)
        return v

    async def decide(self, state: GuidedState, seed: int | None, rubric: Rubric | None,
                     record: dict[str, Any]) -> Proposal:
        guidance = rubric_guidance(rubric)
        proposal = await self.draft(state, seed, guidance)
        if rubric is None or not self.verify:
            return proposal
        drafts: list[dict[str, Any]] = []
        record["drafts"], record["retries"] = drafts, 0
        while proposal.parsed.kind in TOOLS and record["retries"] < self.max_retries:
            verdict = await self.check(state, proposal, rubric)
            drafts.append({"raw": proposal.raw, "action": proposal.parsed.text, **verdict.record()})
            if verdict.failed or verdict.accepted:
                break
            proposal.call.trainable = False  # the rejected draft stays in the record, not in the loss
            record["retries"] += 1
            feedback = (f'Your previous proposal, "Action: {proposal.parsed.text}", did not pass this checklist:\n'
                        f"{verdict.feedback()}\nWrite a new Thought and Action that meets the unmet criteria.")
            proposal = await self.draft(state, seed, join_guidance(guidance, feedback), kind="retry")
        return proposal
