"""Co-ReAct branching-point collection by depth-wise expansion (paper section 3.1, appendix A).

For one question, starting from the empty prefix, at each depth:
1. sample a candidate pool: every candidate policy at every temperature (``samples_per_temperature``
   each), parsed into normalised actions; unparseable samples and failed calls are counted, not kept;
2. de-duplicate and pick a slate of k actions by MMR with BM25 similarity (``components.methods.coreact.slates``);
3. ask the council: each judge sees its own random permutation under neutral labels, rankings are
   aggregated by Borda over the valid votes (``components.methods.coreact.council``); with
   ``judge_reference`` every judge also sees the gold answer and hop chain;
4. commit the consensus top action, run its tool, and go one level deeper.

Every point is recorded; only kept ones train the rubric generator. A point is dropped when
- ``too_few_distinct``: fewer than k distinct actions in the pool (no slate can be formed);
- ``too_few_valid_judges``: fewer than ``min_valid_judges`` valid rankings (a hard filter);
- ``final_answer``: the consensus winner is a final answer, so this is not a tool-calling step; the
  trajectory has answered and expansion stops.
When a point is dropped for the first two reasons the prefix still has to grow: the first parsed sample
of the first policy at the lowest temperature (the closest thing to the policy's default action) is
committed instead. Expansion also stops at ``max_depth`` or when the agent's tool budget is spent.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from components.agents.parsing import parse_turn
from components.agents.react import EpisodeState, Proposal, ReActAgent
from components.methods.coreact.slates import select_slate, slate_context
from components.judges.render import render_prefix
from components.methods.coreact.council import judge_slate, reference_notes
from components.llm.base import ChatModel, Sampling
from components.methods.coreact.params import CollectParams
from components.schemas import BranchingPoint, Candidate, Question


def question_seed(base_seed: int, index: int) -> int:
    """The seed of the question at ``index`` in the collection's question list."""
    return base_seed + 7919 * index


def depth_seed(q_seed: int, depth: int) -> int:
    """The seed of one depth of a question: its pool's samples and its judges' permutations."""
    return q_seed + 1009 * depth


@dataclass
class PoolStats:
    samples: int = 0
    unparseable: int = 0
    failed_calls: int = 0


@dataclass
class QuestionResult:
    question_id: str
    points: list[BranchingPoint] = field(default_factory=list)
    pool: PoolStats = field(default_factory=PoolStats)
    stop: str = "max_depth"


class BranchingCollector:
    def __init__(self, agent: ReActAgent, candidate_policies: list[ChatModel], judges: list[ChatModel],
                 settings: CollectParams, seed: int = 0, judge_sampling: Sampling | None = None):
        self.agent = agent
        self.policies = candidate_policies
        self.judges = judges
        self.settings = settings
        self.seed = seed
        self.judge_sampling = judge_sampling or Sampling(temperature=0.0, max_tokens=384)

    async def sample_pool(self, state: EpisodeState, seed: int, stats: PoolStats) -> list[Candidate]:
        requests = [(p, t) for p in self.policies for t in sorted(self.settings.temperatures)]
        n = self.settings.samples_per_temperature
        outs = await asyncio.gather(*(
            p.chat(self.agent.messages(state), self.agent.sampling(temperature=t, seed=seed + 97 * i, n=n))
            for i, (p, t) in enumerate(requests)
        ))
        pool = []
        for (policy, temperature), out in zip(requests, outs):
            if not out.ok:
                stats.failed_calls += 1
                continue
            for j, raw in enumerate(out.texts):
                stats.samples += 1
                parsed = parse_turn(raw)
                if parsed.kind == "invalid":
                    stats.unparseable += 1
                    continue
                pool.append(Candidate(action=parsed.text, raw=raw, model=getattr(policy, "role", policy.name),
                                      temperature=temperature, sample_index=j))
        return pool

    async def judge(self, point: BranchingPoint, question: Question, seed: int) -> None:
        """Ask the council about ``point``'s slate and set its votes, Borda scores, consensus and whether it is
        kept; ``seed`` draws the judges' permutations. Used when expanding and when relabelling a point."""
        s = self.settings
        outcome = await judge_slate(self.judges, question.question, render_prefix(point.prefix),
                                    [point.candidates[i].action for i in point.slate], rng_seed=seed,
                                    min_valid=s.min_valid_judges, sampling=self.judge_sampling,
                                    reference=reference_notes(question) if s.judge_reference else None,
                                    orders=s.judge_orders)
        point.votes, point.borda_scores = outcome.votes, list(outcome.scores)
        point.consensus, point.kept, point.drop_reason = [], True, None
        if not outcome.kept:
            point.kept, point.drop_reason = False, "too_few_valid_judges"
            return
        point.consensus = list(outcome.consensus)
        if point.candidates[point.slate[point.consensus[0]]].action.startswith("finish["):
            point.kept, point.drop_reason = False, "final_answer"

    async def relabel(self, point: BranchingPoint, question: Question, question_seed: int) -> BranchingPoint:
        """``point`` judged again by this collector's council, with the seed ``expand`` gives its depth.
        Prefixes, pools, slates and the committed action stay as collected: only the labels change."""
        point = point.model_copy(deep=True)
        if point.slate:
            await self.judge(point, question, depth_seed(question_seed, point.depth))
        return point

    async def expand(self, question: Question, question_seed: int) -> QuestionResult:
        s = self.settings
        result = QuestionResult(question.id)
        state = self.agent.start(question)
        for depth in range(s.max_depth):
            if state.tool_calls >= self.agent.settings.max_search_calls:
                result.stop = "search_budget"
                break
            seed = depth_seed(question_seed, depth)
            pool = await self.sample_pool(state, seed, result.pool)
            if not pool:
                result.stop = "empty_pool"
                break
            point = BranchingPoint(question_id=question.id, question=question.question, depth=depth,
                                   prefix=list(state.steps), candidates=pool)
            last_obs = state.last_observation
            selection = select_slate([c.action for c in pool], k=s.slate_size, lam=s.mmr_lambda,
                                     context=slate_context(question.question, last_obs))
            point.n_distinct = selection.n_distinct
            committed = 0  # fallback: the pool is ordered policy-first, lowest temperature first
            if not selection.enough:
                point.kept, point.drop_reason = False, "too_few_distinct"
            else:
                point.slate = list(selection.indices)
                await self.judge(point, question, seed)
                if point.consensus:
                    committed = point.slate[point.consensus[0]]
            point.committed = committed
            result.points.append(point)
            if point.drop_reason == "final_answer":
                result.stop = "final_answer"
                break
            chosen = pool[committed]
            await self.agent.commit(state, Proposal.from_text(chosen.raw))
            if chosen.action.startswith("finish["):
                result.stop = "final_answer"
                break
        return result
