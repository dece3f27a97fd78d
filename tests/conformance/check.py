"""The conformance suite's one check: our result beside a reference's on the same inputs, within a stated
tolerance, recorded so ``scripts/conformance_table.py`` can print every row's measured maximum difference. The
``conformance`` fixture (tests/conftest.py) hands one to any test, so engine tests elsewhere record rows too.

    def test_k3_matches_verl(conformance):
        conformance.check("k3 KL", "verl core_algos.kl_penalty low_var_kl", ours, theirs, tol=1e-6)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

ROWS: list[dict] = []


def _array(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


class Conformance:
    def __init__(self, test: str) -> None:
        self.test = test

    def check(self, component: str, reference: str, ours, theirs, *, tol: float, note: str = "") -> float:
        """Assert ``max |ours - theirs| <= tol`` (shapes equal, NaN where both are NaN) and record the row."""
        a, b = _array(ours), _array(theirs)
        assert a.shape == b.shape, f"{component}: shape {a.shape} against the reference's {b.shape}"
        both_nan = np.isnan(a) & np.isnan(b)
        assert not (np.isnan(a) ^ np.isnan(b)).any(), f"{component}: NaN where the reference has a value"
        diff = float(np.abs(np.where(both_nan, 0.0, a - b)).max()) if a.size else 0.0
        ROWS.append({"component": component, "reference": reference, "max_diff": diff, "tol": tol,
                     "test": self.test, "note": note})
        assert diff <= tol, f"{component}: max |ours - {reference}| = {diff:.3g} > {tol:g}"
        return diff

    def differs(self, component: str, reference: str, ours, theirs, *, at_least: float, note: str = "") -> float:
        """Assert a named option that departs from the reference on purpose still departs (by >= at_least):
        the test fails if the option silently collapses into the reference."""
        a, b = _array(ours), _array(theirs)
        diff = float(np.abs(a - b).max())
        ROWS.append({"component": component, "reference": reference, "max_diff": diff, "tol": None,
                     "test": self.test, "note": note or f"differs on purpose (>= {at_least:g})"})
        assert diff >= at_least, f"{component}: expected to differ from {reference} by >= {at_least:g}, got {diff:.3g}"
        return diff


def write_rows() -> None:
    """At the end of a test session: the recorded rows to ``$RUBRICFLOW_CONFORMANCE_JSON`` when it is set."""
    out = os.environ.get("RUBRICFLOW_CONFORMANCE_JSON")
    if out and ROWS:
        Path(out).write_text(json.dumps(ROWS, indent=1))
