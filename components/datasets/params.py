"""The ``data`` section of params.yaml: which questions the pipeline trains and evaluates on (components.datasets
loads the benchmarks; components.world generates the fictional one). A pydantic leaf (it imports only
``params_section``), composed in ``components.params.Params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.params_section import Section


class DataParams(Section):
    source: Literal["world", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"] = Field(
        default="world", description="Question source for train/dev/test."
    )
    benchmarks_dir: str = Field(default="../shared/data/benchmarks", description="Folder of benchmark subsets.")
    n_train: int = Field(default=40, ge=0, description="Training questions.")
    n_dev: int = Field(default=20, ge=0, description="Development questions.")
    n_test: int = Field(default=50, ge=0, description="Test questions (evaluation).")
    bamboogle_corpus: str | None = Field(
        default=None,
        description="JSONL of Documents Bamboogle searches (it ships no paragraphs); None pools the other "
        "benchmarks' paragraphs.",
    )
