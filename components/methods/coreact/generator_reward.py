"""Co-ReAct's rubric reward (paper 3.2.1, appendix A): how well the ranking a rubric induces over a branching
point's slate agrees with the council's consensus, plus atomicity and format terms and a repetition gate,
``r = w_rank r_rank + w_atom r_atom + w_fmt r_fmt`` (``rubric_generator.reward_weights``, paper 0.75 / 0.15 / 0.10).
:class:`RubricReward` defines each term; the choices the paper leaves open are in docs/methods/coreact.md.

    reward = RubricReward(evaluator_model(pool.role, params.rubric_generator), params.rubric_generator)
    trainer = GRPOTrainer(..., reward_fn=reward, prompts=[{"prompt": text, "point": bp}, ...])
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import spearmanr

from components.judges.call import Tally, scored_as
from components.judges.orders import balanced_orders
from components.judges.render import render_prefix
from components.llm.base import ChatModel
from components.methods.coreact.params import RubricGeneratorParams
from components.methods.coreact.rubric_eval import evaluate_actions, evaluate_criteria, evaluate_slate
from components.methods.coreact.rubric_generator import COUNT_RANGE, ParsedRubric, parse_rubric
from components.schemas import BranchingPoint, Rubric
from components.training.grpo.episodes import Episode, RewardOutput, StepContext

__all__ = ["ATOMIC_MAX_WORDS", "WEIGHT_SUM_TOLERANCE", "RewardParts", "RubricReward", "atomicity", "combine",
           "consensus_scores", "evaluator_model", "format_term", "is_atomic", "listwise_rank_reward",
           "pairwise_rank_reward", "rank_correlation", "repetition_rate", "slate_actions"]

ATOMIC_MAX_WORDS = 25
WEIGHT_SUM_TOLERANCE = 0.15  # |sum of weights - 1| below this earns the weight half (reward_fn.py:92)
_JOINERS = re.compile(r"\b(?:and|or|as well as|also|both|then|while)\b|;", re.IGNORECASE)
_QUOTED = re.compile(r"\[[^\]]*\]|\([^)]*\)|\"[^\"]*\"|'[^']*'|`[^`]*`")


def evaluator_model(role: Callable[[str], ChatModel], settings: RubricGeneratorParams) -> ChatModel:
    """Co-ReAct's rubric evaluator: ``settings.evaluator_role``'s model (``role`` is e.g. ``pool.role``), scored
    as ``settings.evaluator_scoring`` says."""
    return scored_as(role(settings.evaluator_role), settings.evaluator_scoring)


# ----------------------------------------------------------------------------------------------- the terms


def rank_correlation(scores: Sequence[float], consensus: Sequence[float]) -> float:
    """Spearman's rho between a rubric's action scores and the consensus scores (higher = better on both
    sides; ties get average ranks). Undefined (either side constant) is 0."""
    if len(scores) != len(consensus) or len(scores) < 2:
        raise ValueError(f"{len(scores)} scores for {len(consensus)} consensus values (need 2 or more)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input; that case is defined as 0 here
        rho = spearmanr(scores, consensus).statistic
    return 0.0 if math.isnan(rho) else float(rho)


def listwise_rank_reward(scores: Sequence[float], consensus: Sequence[float]) -> float:
    return (rank_correlation(scores, consensus) + 1.0) / 2.0


def pairwise_rank_reward(better: float, worse: float) -> float:
    """The pair's consensus order kept (1), tied (0.5) or reversed (0) by the rubric's scores."""
    return 1.0 if better > worse else 0.5 if better == worse else 0.0


def is_atomic(text: str) -> bool:
    outside = _QUOTED.sub(" ", text)
    return len(text.split()) <= ATOMIC_MAX_WORDS and not _JOINERS.search(outside)


def atomicity(rubric: Rubric) -> float:
    return sum(is_atomic(c.text) for c in rubric.criteria) / len(rubric.criteria) if rubric.criteria else 0.0


def format_term(parsed: ParsedRubric, rule: str) -> float:
    """The format term of a parsed reply under ``rubric_generator.format_reward`` (see :class:`RubricReward`); 0 when
    it did not parse."""
    if not parsed.ok:
        return 0.0
    if rule == "schema":
        return parsed.format_score
    count_ok = COUNT_RANGE[0] <= len(parsed.rubric.criteria) <= COUNT_RANGE[1]
    return 0.5 * count_ok + 0.5 * (abs(sum(parsed.raw_weights) - 1.0) < WEIGHT_SUM_TOLERANCE)


def repetition_rate(text: str, n: int = 4) -> float:
    """``1 - distinct / total`` over the word n-grams of ``text`` (0 for texts shorter than n words)."""
    words = re.findall(r"\w+", text.lower())
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


@dataclass(frozen=True)
class RewardParts:
    """One rubric's reward and its terms; ``rank``/``rho`` are None when the rubric was not evaluated, and
    ``atomicity`` when it was not measured (the judge's count not asked for, or fewer than ``min_criteria``)."""

    total: float
    rank: float | None
    atomicity: float | None
    format: float
    repetition: float
    gated: bool = False
    rho: float | None = None
    flat: bool = False  # the evaluator scored every evaluated action alike: the rubric induced no order
    too_few: bool = False  # fewer than min_criteria criteria: not evaluated, only the format term counts


def combine(rank: float, atom: float, fmt: float, weights: Mapping[str, float], repetition: float,
            max_rate: float) -> float:
    if repetition > max_rate:
        return 0.0
    return weights["rank"] * rank + weights["atomicity"] * atom + weights["format"] * fmt


# ----------------------------------------------------------------------------------------------- points


def slate_actions(point: BranchingPoint) -> list[str]:
    return [point.candidates[i].action for i in point.slate]


def consensus_scores(point: BranchingPoint) -> list[float]:
    """The council's Borda score per slate position (or, without them, k-1 .. 0 along the consensus order)."""
    k = len(point.slate)
    if len(point.borda_scores) == k:
        return [float(s) for s in point.borda_scores]
    if sorted(point.consensus) != list(range(k)):
        raise ValueError(f"branching point {point.question_id}@{point.depth}: no Borda scores and no full consensus")
    scores = [0.0] * k
    for place, pos in enumerate(point.consensus):
        scores[pos] = float(k - 1 - place)
    return scores


def point_key(point: BranchingPoint) -> str:
    return f"{point.question_id}@{point.depth}"


def _criteria_text(parsed: ParsedRubric, raw: str) -> str:
    return "\n".join(c.text for c in parsed.rubric.criteria) if parsed.ok else raw


# ----------------------------------------------------------------------------------------------- the reward


class RubricReward:
    """The rubric generator's reward over a GRPO step (a ``reward_fn``); each episode's ``prompt`` is a mapping
    with the ``point`` (:class:`BranchingPoint`) and its ``text`` is the sampled rubric. ``pairwise`` selects
    the ablation's rank term. The same rubric text sampled twice for one point is evaluated once.

    - **rank** (listwise): Spearman's rho (average ranks for ties) between the evaluator's scores of the slate
      actions (:mod:`components.methods.coreact.rubric_eval`) and the council's Borda scores, ``r_rank = (rho +
      1) / 2``; a rubric that scores every action alike has undefined rho, taken as 0 (chance, counted as
      ``flat_rate``). Pairwise (the "w/o listwise" ablation): one pair with different Borda scores, drawn per
      (seed, step, point) and shared by the group; 1 when R orders it as the council does, 0.5 tied, 0 reversed.
    - **atomicity**: the share of criteria that check one thing; ``rule``: at most :data:`ATOMIC_MAX_WORDS` words
      and, outside brackets and quotes, none of the joiners (" and ", " or ", ";", ...); ``judge`` (the released
      code): the evaluator's atomic count over the number of criteria, averaged over its calls.
    - **format**: ``schema``: 1 for the JSON object alone, 0.5 with other text around it, 0 unparseable;
      ``count_weights`` (the released code): 0.5 for 3 to 5 criteria plus 0.5 for weights summing to 1 within
      0.15 (:func:`format_term`).

    The repetition gate sets r = 0 when the rate of repeated word n-grams of the reply (or of its criteria,
    ``repetition_scope``) exceeds ``repetition_max_rate``; a gated or unparseable rubric is not evaluated (an
    unparseable one scores 0 on all three terms), nor is one with fewer than ``min_criteria`` criteria (only its
    format term counts). An evaluator failure on any action the rubric needs leaves it unscored: the reward is
    None, the episode leaves its group, and it is counted."""

    def __init__(self, evaluator: ChatModel, settings: RubricGeneratorParams, *, pairwise: bool = False,
                 seed: int = 0, observation_chars: int = 400):
        self.evaluator, self.settings, self.pairwise, self.seed = evaluator, settings, pairwise, seed
        self.observation_chars = observation_chars

    def pair_for(self, point: BranchingPoint, step: int) -> tuple[int, int]:
        """(better, worse) slate positions of the pairwise term, drawn per (seed, step, point)."""
        borda = consensus_scores(point)
        pairs = [(i, j) for i in range(len(borda)) for j in range(len(borda)) if borda[i] > borda[j]]
        if not pairs:
            raise ValueError(f"branching point {point_key(point)}: the consensus ranks every action equal")
        return random.Random(f"{self.seed}:{step}:{point_key(point)}").choice(pairs)

    def slate_orders(self, point: BranchingPoint, k: int) -> list[list[int]]:
        """The orders the slate mode shows ``k`` actions in: balanced (each action once at every position) and
        drawn per (seed, point), so every rubric of a group sees the same orders and the evaluator's position
        bias averages out."""
        return balanced_orders(f"{self.seed}:order:{point_key(point)}", k)

    async def score(self, point: BranchingPoint, text: str, *, step: int = 0,
                    tally: Tally | None = None) -> RewardParts | None:
        """The reward of rubric ``text`` at ``point``; None when the evaluator failed on an action it needed."""
        s, text = self.settings, text or ""
        parsed = parse_rubric(text, s.max_criteria, max_chars=s.max_criterion_chars)
        gate_text = text if s.repetition_scope == "reply" else _criteria_text(parsed, text)
        repetition = repetition_rate(gate_text, s.repetition_ngram)
        if not parsed.ok:
            return RewardParts(0.0, None, 0.0, 0.0, repetition)
        judged = s.atomicity == "judge"
        atom, fmt = None if judged else atomicity(parsed.rubric), format_term(parsed, s.format_reward)
        if repetition > s.repetition_max_rate:
            return RewardParts(0.0, None, atom, fmt, repetition, gated=True)
        n = len(parsed.rubric.criteria)
        if n < s.min_criteria:
            total = combine(0.0, 0.0, fmt, s.reward_weights, repetition, s.repetition_max_rate)
            return RewardParts(total, None, None, fmt, repetition, too_few=True)
        actions, borda = slate_actions(point), consensus_scores(point)
        positions = list(self.pair_for(point, step)) if self.pairwise else list(range(len(actions)))
        prefix, shown = render_prefix(point.prefix, self.observation_chars), [actions[p] for p in positions]
        asked = {"max_tokens": s.evaluator_max_tokens, "tally": tally}
        if s.evaluator_mode == "slate":
            outcomes = await evaluate_slate(self.evaluator, point.question, prefix, shown, parsed.rubric,
                                            orders=self.slate_orders(point, len(shown)), count_atomic=judged, **asked)
        elif s.evaluator_mode == "criterion":  # params refuse atomicity: judge here (no count in a yes/no)
            outcomes = await evaluate_criteria(self.evaluator, point.question, prefix, shown, parsed.rubric, **asked)
        else:
            outcomes = await evaluate_actions(self.evaluator, point.question, prefix, shown, parsed.rubric,
                                              count_atomic=judged, **asked)
        if any(o.score is None for o in outcomes):
            return None
        if judged:
            atom = sum(o.atomic_count for o in outcomes) / len(outcomes) / n
        scores = [o.score for o in outcomes]
        rho = None if self.pairwise else rank_correlation(scores, borda)
        rank = pairwise_rank_reward(scores[0], scores[1]) if self.pairwise else (rho + 1.0) / 2.0
        total = combine(rank, atom, fmt, s.reward_weights, repetition, s.repetition_max_rate)
        return RewardParts(total, rank, atom, fmt, repetition, rho=rho, flat=len(set(scores)) == 1)

    async def __call__(self, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        tally = Tally()
        unique: dict[tuple[str, str], Any] = {}
        keys = []
        for e in episodes:
            point = _point(e)
            key = (point_key(point), (e.text or "").strip())
            keys.append(key)
            if key not in unique:
                unique[key] = self.score(point, e.text or "", step=ctx.step, tally=tally)
        results = dict(zip(unique, await asyncio.gather(*unique.values()), strict=True))
        parts = [results[k] for k in keys]
        return RewardOutput([None if p is None else p.total for p in parts], _metrics(parts, tally))


def _point(episode: Episode) -> BranchingPoint:
    prompt = episode.prompt
    point = prompt.get("point") if isinstance(prompt, Mapping) else None
    if not isinstance(point, BranchingPoint):
        raise TypeError("RubricReward needs each episode's prompt to be a mapping with a BranchingPoint under 'point'")
    return point


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _metrics(parts: list[RewardParts | None], tally: Tally) -> dict[str, float]:
    scored = [p for p in parts if p is not None]
    evaluated = [p for p in scored if p.rank is not None]
    parsed = [p for p in scored if p.format > 0]
    n = max(len(parts), 1)
    return {
        "rank_mean": _mean([p.rank for p in evaluated]),
        "rho_mean": _mean([p.rho for p in evaluated if p.rho is not None]),
        # evaluated rubrics whose actions all scored alike: their rank term is chance, whatever the rubric says
        "flat_rate": _mean([float(p.flat) for p in evaluated]),
        "atomicity_mean": _mean([p.atomicity for p in parsed if p.atomicity is not None]),
        "format_mean": _mean([p.format for p in scored]),
        "repetition_mean": _mean([p.repetition for p in scored]),
        "rubric_parse_failures": float(sum(p.format == 0 for p in scored)),
        "rubric_parse_failure_rate": sum(p.format == 0 for p in scored) / n,
        "gated": float(sum(p.gated for p in scored)),
        "too_few_criteria": float(sum(p.too_few for p in scored)),
        "evaluator_dropped": float(len(parts) - len(scored)),
        "evaluator_dropped_rate": (len(parts) - len(scored)) / n,
        # <who>/calls and <who>/tokens, as every reward names its judge's accounting (the head-to-head's training compute)
        "evaluator/calls": float(tally.calls),
        "evaluator/failures": float(tally.failed),
        # the same failures by kind: calls that failed after retries, replies that did not parse
        "evaluator/call_failures": float(tally.failures),
        "evaluator/unparsed": float(tally.unparsed),
        "evaluator/tokens": float(tally.tokens),
    }
