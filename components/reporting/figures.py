"""A results page's figures, committed beside it: the writer of ``docs/results/<page>.md`` also writes
``docs/results/<page>.json`` (:func:`write_figures`), the numbers the page shows and what they were computed from,
and names it on the page (:func:`figures_line`), so a reader can trace every figure to a tracked file although
``outputs/`` is git-ignored. tests/reporting/test_results_traceable.py holds every page to it.

    .venv/bin/python -m pytest -q tests/reporting/test_results_traceable.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.io import atomic_path

__all__ = ["figures_line", "figures_path", "write_figures"]


def figures_path(page: str | Path) -> Path:
    """Where the figures of ``page`` are kept: beside it, ``<page>.json``."""
    return Path(page).with_suffix(".json")


def write_figures(page: str | Path, figures: Any) -> Path:
    """Write ``figures`` (JSON-serialisable) beside ``page``, atomically; returns the file."""
    path = figures_path(page)
    with atomic_path(path) as fh:
        fh.write(json.dumps(figures, indent=1, default=str) + "\n")
    return path


def figures_line(page: str | Path) -> str:
    """The sentence that names the page's figures file (a relative link: the file sits beside the page)."""
    name = figures_path(page).name
    return f"Figures: [`{name}`]({name}), committed beside this page; every number here is read from it."
