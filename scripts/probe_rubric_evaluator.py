"""Does the rubric evaluator rank a slate? Scores the same rubrics with every evaluator mode
(``rubric_generator.evaluator_mode``: one call per action, as in Co-ReAct; one call for the whole slate; one yes/no
call per criterion and action) on the collected branching points, and prints how often each mode scores every
action alike (``flat``: the rank term is then chance, whatever the rubric) and how its rankings agree with the
council (Spearman rho).

    python scripts/probe_rubric_evaluator.py [--samples 2] [--rubrics generator|gold] [--modes criterion ...]
        [--scorings text probability] [--set ...]

Reads outputs/collect/branching_points.parquet. ``--rubrics generator`` (default): the rubrics come from the
``rubric_generator`` role (the untrained generator) at its sampling temperature, seeded. ``--rubrics gold``: one
rubric per point written from the question's gold chain
(:func:`~components.methods.coreact.oracle_rubrics.oracle_rubric`), the ceiling of the reward: a mode
that cannot rank the slate by a rubric naming the next hop cannot reward a generator for writing one. The
evaluator is ``rubric_generator.evaluator_role``, scored as ``rubric_generator.evaluator_scoring`` says, or once per
``--scorings`` entry (the sampled word, or P(yes): only the criterion mode has a label to score). Writes
outputs/probe/evaluator_modes[_gold].json (a mode asked in several scorings is keyed ``mode:scoring``). Every
call goes through the response cache, so a repeat is a replay.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.io import read_parquet, write_json
from components.judges.call import Tally
from components.llm.factory import LLMPool
from components.methods.coreact.generator_reward import RubricReward, evaluator_model
from components.methods.coreact.generator_training import questions_by_id
from components.methods.coreact.oracle_rubrics import oracle_rubric
from components.methods.coreact.rubric_generator import RubricGenerator
from components.methods.coreact.rubric_training import usable_points
from components.params_cli import params_from_args, stage_argparser
from components.run_files import out_path
from components.schemas import BranchingPoint

MODES = ("action", "slate", "criterion")


def summary(parts, tally: Tally) -> dict[str, float]:
    evaluated = [p for p in parts if p is not None and p.rho is not None]
    rhos = [p.rho for p in evaluated]
    return {
        "rubrics": float(len(parts)),
        "evaluated": float(len(evaluated)),
        "dropped": float(sum(p is None for p in parts)),
        "flat_rate": statistics.fmean(p.flat for p in evaluated) if evaluated else float("nan"),
        "rho_mean": statistics.fmean(rhos) if rhos else float("nan"),
        "abs_rho_mean": statistics.fmean(abs(r) for r in rhos) if rhos else float("nan"),
        "rank_mean": statistics.fmean(p.rank for p in evaluated) if evaluated else float("nan"),
        "evaluator_calls": float(tally.calls),
        "evaluator_failures": float(tally.failures + tally.unparsed),
        "evaluator_tokens": float(tally.tokens),
    }


async def probe(params, points: list[BranchingPoint], samples: int, source: str = "generator",
                modes: Sequence[str] = MODES, scorings: Sequence[str | None] = (None,)) -> dict:
    s = params.rubric_generator
    pool = LLMPool(params)
    try:
        if source == "gold":
            questions = questions_by_id(params.run)
            rubrics = [(p, oracle_rubric(p, questions[p.question_id])) for p in points]
            return {"points": len(points), "rubrics": "gold", "rubrics_parsed": len(rubrics),
                    "modes": await score_modes(params, pool, rubrics, modes, scorings)}
        generator = RubricGenerator(pool.role("rubric_generator"), max_criteria=s.max_criteria,
                                    temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                                    observation_chars=params.coreact.observation_chars,
                                    max_chars=s.max_criterion_chars)
        rubrics = []
        for p in points:
            for k in range(samples):
                out = await generator.generate(p.question, p.prefix, seed=params.seed + k)
                if out.ok:
                    rubrics.append((p, out.raw))
        return {"points": len(points), "rubrics": "generator", "samples_per_point": samples,
                "rubrics_parsed": len(rubrics), "generator_calls": generator.calls,
                "modes": await score_modes(params, pool, rubrics, modes, scorings)}
    finally:
        pool.close()


async def score_modes(params, pool: LLMPool, rubrics: list[tuple[BranchingPoint, str]],
                      modes: Sequence[str] = MODES, scorings: Sequence[str | None] = (None,)) -> dict[str, dict]:
    s, scored = params.rubric_generator, {}
    for scoring in scorings:
        settings = s if scoring is None else s.model_copy(update={"evaluator_scoring": scoring})
        evaluator = evaluator_model(pool.role, settings)
        for mode in modes:
            reward = RubricReward(evaluator, settings.model_copy(update={"evaluator_mode": mode}), seed=params.seed,
                                  observation_chars=params.coreact.observation_chars)
            tally = Tally()
            parts = [await reward.score(p, text, tally=tally) for p, text in rubrics]
            scored[mode if len(scorings) == 1 else f"{mode}:{scoring}"] = summary(parts, tally)
    return scored


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--samples", type=int, default=2, help="rubrics per branching point (seeded)")
    parser.add_argument("--rubrics", choices=["generator", "gold"], default="generator",
                        help="the untrained generator's rubrics, or one gold-chain rubric per point (the ceiling)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="evaluator modes to ask")
    parser.add_argument("--scorings", nargs="+", choices=["text", "probability"], default=None,
                        help="score the evaluator's answers each way (default: as rubric_generator.evaluator_scoring)")
    args = parser.parse_args()
    params = params_from_args(args)
    points, dropped = usable_points(read_parquet(out_path(params.run, "collect", "branching_points.parquet"), BranchingPoint))
    result = asyncio.run(probe(params, points, args.samples, args.rubrics, args.modes, args.scorings or (None,)))
    result["dropped_points"] = dropped
    name = "evaluator_modes_gold.json" if args.rubrics == "gold" else "evaluator_modes.json"
    write_json(out_path(params.run, "probe", name), result)
    cols = ["evaluated", "dropped", "flat_rate", "rho_mean", "abs_rho_mean", "rank_mean", "evaluator_calls",
            "evaluator_tokens"]
    print(f"{len(points)} points, {result['rubrics_parsed']} parsed rubrics")
    print("| mode | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for mode, row in result["modes"].items():
        print(f"| {mode} | " + " | ".join(f"{row[c]:.3g}" for c in cols) + " |")
    print(json.dumps(result["modes"], indent=1))


if __name__ == "__main__":
    main()
