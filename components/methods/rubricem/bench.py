"""RubricEM's judgments and the judge bench (:mod:`components.judges.bench.registry`): neither is asked yet, and
each says why (registered on import by ``plugin.py``, listed on the results page)."""

from __future__ import annotations

from components.judges.bench.registry import BenchGap

STAGE_SCORES = BenchGap(
    name="rubricem_stage_scores", method="rubricem",
    reason=("the stage judge scores scaffold episodes stage by stage (plan, research, review and answer blocks "
            "the policy writes); the bench's trajectories are ReAct episodes with none of those blocks, so every "
            "stage but research would 'never happen'. The scaffold oracle (scaffold_oracle.scaffold_replies) "
            "could write the set's turns in the scaffold's tags, perturbations included; that rendering and its "
            "checks are not built yet, and are the next step for this judgment")).register()

REFLECTION_SCORES = BenchGap(
    name="rubricem_reflection", method="rubricem",
    reason=("reflection scoring judges a written reflection of an attempt; the set has no reflections and no "
            "oracle label for one")).register()
