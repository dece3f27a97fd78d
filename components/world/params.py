"""The ``world`` section of params.yaml: the size and question mix of the fictional world (components.world.generate).
A pydantic leaf (it imports only ``params_section``), composed in ``components.params.Params``."""

from __future__ import annotations

from pydantic import Field

from components.params_section import Section


class WorldParams(Section):
    n_people: int = Field(default=80, ge=4, description="People in the fictional world.")
    n_films: int = Field(default=30, ge=2, description="Films.")
    n_cities: int = Field(default=20, ge=2, description="Cities.")
    n_companies: int = Field(default=15, ge=2, description="Companies.")
    distractors_per_entity: int = Field(default=1, ge=0, description="Look-alike paragraphs per entity.")
    question_mix: dict[str, float] = Field(
        default_factory=lambda: {"bridge": 0.3, "comparison": 0.25, "inference": 0.2, "compositional": 0.25},
        description="Share of each question type.",
    )
