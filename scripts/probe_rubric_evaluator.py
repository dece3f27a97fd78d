"""Does the rubric evaluator rank a slate? Scores the same rubrics with both evaluator modes
(``rubric_generator.evaluator_mode``: one call per action, as in Co-ReAct, or one call for the whole slate) on the
collected branching points, and prints how often each mode scores every action alike (``flat``: the rank term is
then chance, whatever the rubric) and how its rankings agree with the council (Spearman rho).

    python scripts/probe_rubric_evaluator.py [--samples 2] [--set ...]

Reads outputs/collect/branching_points.parquet; the rubrics come from the ``rubric_generator`` role (the untrained
generator) at its sampling temperature, seeded; the evaluator is ``rubric_generator.evaluator_role``. Writes
outputs/probe/evaluator_modes.json. Every call goes through the response cache, so a repeat is a replay.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.coreact.rubric_generator import RubricGenerator  # noqa: E402
from components.coreact.rubric_training import usable_points  # noqa: E402
from components.io import read_parquet, write_json  # noqa: E402
from components.judges.pairwise import Tally  # noqa: E402
from components.llm.factory import LLMPool  # noqa: E402
from components.rewards.spearman import RubricReward  # noqa: E402
from components.schemas import BranchingPoint  # noqa: E402
from tasks.runtime import out_path, params_from_args, stage_argparser  # noqa: E402

MODES = ("action", "slate")


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


async def probe(params, points: list[BranchingPoint], samples: int) -> dict:
    s = params.rubric_generator
    pool = LLMPool(params)
    try:
        generator = RubricGenerator(pool.role("rubric_generator"), max_criteria=s.max_criteria,
                                    temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                                    observation_chars=params.coreact.observation_chars,
                                    max_chars=s.max_criterion_chars)
        evaluator = pool.role(s.evaluator_role)
        rubrics = []
        for p in points:
            for k in range(samples):
                out = await generator.generate(p.question, p.prefix, seed=params.seed + k)
                if out.ok:
                    rubrics.append((p, out.raw))
        result = {"points": len(points), "samples_per_point": samples, "rubrics_parsed": len(rubrics),
                  "generator_calls": generator.calls, "modes": {}}
        for mode in MODES:
            reward = RubricReward(evaluator, s.model_copy(update={"evaluator_mode": mode}), seed=params.seed,
                                  observation_chars=params.coreact.observation_chars)
            tally = Tally()
            parts = [await reward.score(p, text, tally=tally) for p, text in rubrics]
            result["modes"][mode] = summary(parts, tally)
        return result
    finally:
        pool.close()


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--samples", type=int, default=2, help="rubrics per branching point (seeded)")
    args = parser.parse_args()
    params = params_from_args(args)
    points, dropped = usable_points(read_parquet(out_path(params, "collect", "branching_points.parquet"), BranchingPoint))
    result = asyncio.run(probe(params, points, args.samples))
    result["dropped_points"] = dropped
    write_json(out_path(params, "probe", "evaluator_modes.json"), result)
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
