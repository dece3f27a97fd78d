"""ARCO's judgments and the judge bench (:mod:`components.judges.bench.registry`): not asked, and why
(registered on import by ``plugin.py``, listed on the results page)."""

from __future__ import annotations

from components.judges.bench.registry import BenchGap

CRITERIA_SCORES = BenchGap(
    name="arco_criteria", method="arco",
    reason=("ARCO's step criteria are scored by mu, a trained 0.5B with a score head, not by a judge role; the "
            "1.5B teacher only writes criteria in the warm-up. Benching it needs a trained mu checkpoint "
            "(train_policy@arco) scored on the set's steps, not a judge call")).register()
