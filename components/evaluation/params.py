"""The ``evaluation`` section of params.yaml: how ``evaluate`` scores a method (components.evaluation). A pydantic
leaf (it imports only ``params_section``), composed in ``components.params.Params``."""

from __future__ import annotations

from pydantic import Field

from components.params_section import Section


class EvaluationParams(Section):
    llm_judge: bool = Field(default=True, description="Score answers with the answer-judge role too.")
    n_questions: int = Field(default=50, ge=1, description="Questions per benchmark.")
    episode_concurrency: int | None = Field(
        default=None, ge=1,
        description="Episodes run at once; None: as many as the policy's backend serves at once (1 for a single-slot "
        "llama.cpp server, whose prompt cache interleaved episodes would evict; `parallel` for a native server).",
    )
