"""Listwise GRPO of the rubric generator (paper 3.2.2) as data for the one GRPO trainer: which branching points
train (:func:`usable_points`: kept by ``collect``, a slate of 2 or more actions, a consensus that is not flat), the
held-out split by question (:func:`split_points`), the single-turn prompts that the trainer passes through to
:class:`~components.methods.coreact.generator_reward.RubricReward` (:func:`prompt_items`), the trainer's
configuration, and the held-out Spearman before and after training (:func:`held_out_spearman`,
:func:`paired_change`).

    train, held_out = split_points(usable_points(points)[0], 0.25, seed=1234)
    items = prompt_items(train, render, max_criteria=4, max_chars=160)
    config = generator_config(params.grpo, params.rubric_generator, len(train))
    before, rubrics_before = held_out_spearman(engine, prompt_items(held_out, render, 4, max_chars=160),
                                               RubricReward(evaluator, params.rubric_generator), 256)
    # ... train, measure again into rubrics_after, then:
    change = paired_change(rubrics_before, rubrics_after)   # {"delta_mean": ..., "wilcoxon_p": ...}
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import bootstrap, wilcoxon

from components.llm.base import Message
from components.methods.coreact.generator_reward import RubricReward, consensus_scores, point_key
from components.methods.coreact.params import RubricGeneratorParams
from components.methods.coreact.rubric_generator import generator_messages
from components.schemas import BranchingPoint
from components.training.engines.rollout import RolloutEngine, SamplingParams
from components.training.params import GRPOParams

__all__ = ["generator_config", "held_out_spearman", "paired_change", "prompt_items", "split_points", "usable_points"]

Render = Callable[[list[Message], bool], str]


def usable_points(points: Sequence[BranchingPoint]) -> tuple[list[BranchingPoint], dict[str, int]]:
    """The points a rubric can be rewarded on, and how many were left out for each reason."""
    kept, dropped = [], Counter()
    for p in points:
        if not p.kept:
            dropped["not_kept"] += 1
        elif len(p.slate) < 2:
            dropped["slate_too_small"] += 1
        elif len(set(consensus_scores(p))) < 2:
            dropped["flat_consensus"] += 1
        else:
            kept.append(p)
    return kept, dict(dropped)


def split_points(points: Sequence[BranchingPoint], held_out_fraction: float,
                 seed: int) -> tuple[list[BranchingPoint], list[BranchingPoint]]:
    """(train, held out), split by question: ``round(fraction * questions)`` questions held out, at least one
    when the fraction is positive and there are two or more questions."""
    questions = sorted({p.question_id for p in points})
    random.Random(seed).shuffle(questions)
    n = round(held_out_fraction * len(questions))
    if held_out_fraction > 0 and len(questions) > 1:
        n = min(max(n, 1), len(questions) - 1)
    held = set(questions[:n])
    return [p for p in points if p.question_id not in held], [p for p in points if p.question_id in held]


def prompt_items(points: Sequence[BranchingPoint], render: Render, max_criteria: int,
                 observation_chars: int = 400, *, max_chars: int,
                 format_reward: str = "schema") -> list[dict[str, Any]]:
    return [{"prompt": render(generator_messages(p.question, p.prefix, max_criteria, observation_chars,
                                                 max_chars=max_chars, format_reward=format_reward), True),
             "point": p} for p in points]


def generator_config(grpo: GRPOParams, s: RubricGeneratorParams, n_train_points: int) -> GRPOParams:
    """``grpo`` with the rubric generator's (``s``) own values; steps cover ``epochs`` passes over the points.
    Checkpoints follow ``rubric_generator.checkpoint_every``, not ``grpo``'s: an embedded run has 3-6 steps of
    ~6 minutes, and with grpo's 10 a run killed at step 5 (out of memory) had saved nothing to resume. Its
    micro-batches never keep their activations (``grpo.checkpoint_min_tokens`` is measured for policy rows). Its
    advantages divide by the std ``rubric_generator.adv_std`` names (the released code's verl: the sample std)."""
    steps = max(1, math.ceil(s.epochs * n_train_points / s.prompts_per_step))
    return grpo.model_copy(update={
        "adv_std": s.adv_std,
        "group_size": s.group_size, "prompts_per_step": s.prompts_per_step, "lr": s.lr, "kl_coef": s.kl_coef,
        "temperature": s.temperature, "top_p": s.top_p, "max_new_tokens": s.max_tokens, "steps": steps,
        "checkpoint_every": s.checkpoint_every, "micro_batch_tokens": s.micro_batch_tokens,
        "checkpoint_min_tokens": 0,  # every micro-batch recomputes: its 2048-token ones peaked at 15.3 GB doing so
    })


def held_out_spearman(engine: RolloutEngine, items: Sequence[dict[str, Any]], scorer: RubricReward,
                      max_new_tokens: int, *, samples: int = 0, temperature: float = 0.7,
                      top_p: float = 1.0) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The greedy rubric of each item from the engine's current weights (decoded batch-invariant, so that it
    depends on the weights and the prompt only), plus ``samples`` sampled ones at
    ``temperature``/``top_p``, scored listwise: the summary (greedy keys, and ``sampled_*`` when ``samples`` > 0),
    and per rubric its point, text, rho (None: not evaluated), whether it parsed and whether it was the greedy one.
    The summary is the mean rho over the points whose rubric parsed and was evaluated, with the parse rate, the
    mean listwise reward and the evaluator's failures beside it (the same measure before and after training,
    whatever the training reward). The sampled rubrics, drawn as the Co-ReAct agent draws them, give the policy's
    expected held-out rho, which moves before a few steps of LoRA change the greedy text."""
    if not items:
        return {"points": 0.0}, []
    prompts = [it["prompt"] for it in items]
    with engine.batch_invariant():  # batched llama.cpp decoding changed 8 of 20 greedy rubrics between two runs
        greedy = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    runs = [("greedy", items, greedy)]
    if samples > 0:
        sampled = engine.generate([p for p in prompts for _ in range(samples)], SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p))
        runs.append(("sampled", [it for it in items for _ in range(samples)], sampled))

    async def score_all(its, gens):
        return await asyncio.gather(*(scorer.score(it["point"], g.text or "") for it, g in zip(its, gens, strict=True)))

    summary, rubrics = {"points": float(len(items))}, []
    for kind, its, gens in runs:
        parts = asyncio.run(score_all(its, gens))
        prefix = "" if kind == "greedy" else "sampled_"
        summary.update({f"{prefix}{k}": v for k, v in _summarize(parts).items()})
        rubrics += [{"point": point_key(it["point"]), "greedy": kind == "greedy", "rubric": g.text or "",
                     "evaluator_failed": p is None, "parsed": p is not None and p.format > 0,
                     "rho": None if p is None else p.rho, "reward": None if p is None else p.total}
                    for it, g, p in zip(its, gens, parts, strict=True)]
    return summary, rubrics


def paired_change(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], *, confidence: float = 0.95,
                  seed: int = 0, unparsed_as_chance: bool = False) -> dict[str, float]:
    """How training moved held-out agreement, point by point (rubric records as :func:`held_out_spearman`
    returns them): each point's mean rho over its evaluated rubrics, greedy and sampled, before and after; the
    differences' mean, a percentile bootstrap interval of it (``confidence``, seeded), the two-sided Wilcoxon
    signed-rank p (zero differences dropped) and the counts of points up, down and unchanged. A point evaluated
    on one side only is left out; with fewer than 2 paired points, or all differences zero, the interval and p
    are NaN. ``unparsed_as_chance``: a rubric that did not parse (``parsed`` False, the evaluator not failed)
    counts as rho 0, what it is worth to the agent: an untrained generator writes many (a parse rate of 0.55
    before training against 1.0 after, on 20 held-out points), so both views are reported (``change`` and
    ``change_unparsed_as_chance``)."""
    def rho_of(r: dict[str, Any]) -> float | None:
        if r.get("rho") is not None:
            return float(r["rho"])
        unparsed = r.get("parsed") is False and not r.get("evaluator_failed")
        return 0.0 if unparsed_as_chance and unparsed else None

    def per_point(records: Sequence[dict[str, Any]]) -> dict[str, float]:
        rhos: dict[str, list[float]] = {}
        for r in records:
            if (rho := rho_of(r)) is not None:
                rhos.setdefault(r["point"], []).append(rho)
        return {k: sum(v) / len(v) for k, v in rhos.items()}

    b, a = per_point(before), per_point(after)
    paired = sorted(set(a) & set(b))
    diffs = np.array([a[k] - b[k] for k in paired])
    out = {"points_paired": float(len(diffs)), "before_mean": float("nan"), "after_mean": float("nan"),
           "delta_mean": float("nan"), "delta_ci_low": float("nan"), "delta_ci_high": float("nan"),
           "wilcoxon_p": float("nan"), "points_up": float((diffs > 0).sum()), "points_down": float((diffs < 0).sum()),
           "points_same": float((diffs == 0).sum())}
    if not len(diffs):
        return out
    out.update(before_mean=float(np.mean([b[k] for k in paired])), after_mean=float(np.mean([a[k] for k in paired])),
               delta_mean=float(diffs.mean()))
    if len(diffs) >= 2 and np.any(diffs != 0):
        if np.ptp(diffs) > 0:
            ci = bootstrap((diffs,), np.mean, confidence_level=confidence, method="percentile",
                           rng=np.random.default_rng(seed)).confidence_interval
            out.update(delta_ci_low=float(ci.low), delta_ci_high=float(ci.high))
        else:  # every point moved by the same amount: the interval is that amount
            out.update(delta_ci_low=float(diffs[0]), delta_ci_high=float(diffs[0]))
        out["wilcoxon_p"] = float(wilcoxon(diffs, zero_method="wilcox").pvalue)
    return out


def _summarize(parts: Sequence[Any]) -> dict[str, float]:
    scored = [p for p in parts if p is not None]
    evaluated = [p for p in scored if p.rho is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    return {
        "spearman": mean([p.rho for p in evaluated]),
        "spearman_with_unparsed": mean([p.rho if p.rho is not None else 0.0 for p in scored
                                        if p.rho is not None or p.format == 0]),
        "evaluated": float(len(evaluated)),
        "parse_rate": sum(p.format > 0 for p in scored) / max(len(scored), 1),
        "rank_reward": mean([p.rank for p in evaluated]),
        "flat_rate": mean([float(p.flat) for p in evaluated]),
        "reward": mean([p.total for p in scored]),
        "evaluator_failed": float(len(parts) - len(scored)),
    }
