"""RubricEM's params section ``rubricem`` (scaffold, SS-GRPO, stagewise judge, meta-policy, bank). Composed
into ``components.params.Params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.params_section import Section, SharedOverrides, shared_overrides_field


class RubricEMParams(Section):
    """RubricEM: scaffold, SS-GRPO, stagewise evolving judge, reflection meta-policy and rubric bank (paper 3.2-3.4,
    appendices C, D, F.1.2)."""
    shared: SharedOverrides = shared_overrides_field()

    stage_lambda: list[list[float]] = Field(
        default_factory=lambda: [[1.0, 0.4, 0.6, 0.8], [0.0, 1.0, 0.4, 0.8], [0.0, 0.0, 1.0, 0.8], [0.0, 0.0, 0.0, 1.0]],
        description="Causal stage matrix Lambda (plan, research, review, answer): G_k = sum_j Lambda[k][j] R_j; "
        "zero below the diagonal, ones on it (paper F.1.2).")
    stage_caps: list[int] = Field(default_factory=lambda: [3, 2, 2, 3], min_length=4, max_length=4,
                                  description="Active judge rubrics kept per stage after pruning (C.4).")
    rubric_targets: list[tuple[int, int]] = Field(
        default_factory=lambda: [(1, 4), (1, 4), (1, 4), (2, 5)], min_length=4, max_length=4,
        description="Rubrics per stage the generation prompt aims for (targets, not quotas; C.2).")
    generator_role: str = Field(default="rubric_evaluator", description="Role that proposes stage rubrics.")
    judge_role: str = Field(default="rubric_evaluator", description="Role that scores trajectories on stage rubrics.")
    judge_scoring: Literal["trajectory", "group"] = Field(
        default="trajectory", description="trajectory: one scoring call per trajectory (paper C.3); group: a group's "
        "attempts scored side by side, once per balanced order (each attempt once at every position), averaged.")
    score_from: Literal["text", "probability"] | None = Field(
        default=None, description="How the judge's 0/1/2 rubric scores are read (components/judges/call.py): the "
        "sampled digit (text) or the expectation over the digit tokens' probabilities; None: as llm.scoring says "
        "for judge_role. Set here, it changes the stagewise judge alone, not the other users of its role.")
    reflection_judge_role: str = Field(default="reflection_judge", description="Role that scores reflections.")
    judge_max_tokens: int = Field(default=1024, ge=16, description="Completion tokens of a judge call.")
    stage_chars: int = Field(default=1500, ge=100, description="Characters of each stage shown to the judges.")
    answer_weight: float = Field(default=3.0, gt=0, description="Weight of the answer stage's persistent rubric "
                                 "(token F1 against the reference answers).")
    scaffold_max_tokens: int = Field(default=512, ge=16, description="Completion tokens per scaffold turn.")
    reflection_candidates: int = Field(default=8, ge=1, description="m: reflection candidates per sampled trajectory.")
    reflection_temperature: float = Field(default=0.7, ge=0, le=2, description="Sampling temperature of reflections.")
    reflection_max_tokens: int = Field(default=512, ge=16, description="Completion tokens of a reflection.")
    reflection_observation_chars: int | None = Field(
        default=None, ge=20, description="Characters of each tool output in the attempt a reflection is asked about "
        "(teacher rows, SFT rows and training alike); None: whole.")
    reflection_weights: dict[str, float] = Field(
        default_factory=lambda: {"diagnostic_accuracy": 0.4, "specificity": 0.3, "scope": 0.3},
        description="Reflection judge: weights of its three dimensions (D.6.2).")
    reflect_on_repeat: bool = Field(default=False, description="Also reflect in the curriculum's repeat phase "
                                    "(D.4 reflects on new queries only).")
    defer_reflection: bool = Field(default=True, description="Judge step N's reflections in the background during "
                                   "step N+1's rollouts, then write the bank and train on them before step N+1's "
                                   "task update (Phase A, D.2); false: all of it at the end of step N.")
    bank_top_k: int = Field(default=2, ge=1, description="Bank entries retrieved for cross-episode transfer.")
    bank_save_every: int = Field(default=10, ge=1, description="Steps between bank snapshots (also at checkpoints).")
    bank_embedder: str = Field(default="embedded-minilm", description="Sentence embedder of the bank's questions.")
    curriculum_window: int = Field(default=3, ge=1, description="K: fresh batches per window before they repeat.")

    @model_validator(mode="after")
    def _check(self) -> RubricEMParams:
        lam = self.stage_lambda
        if len(lam) != 4 or any(len(row) != 4 for row in lam):
            raise ValueError("stage_lambda must be 4x4 (plan, research, review, answer)")
        for k, row in enumerate(lam):
            if row[k] != 1.0 or any(row[j] != 0.0 for j in range(k)):
                raise ValueError(f"stage_lambda row {k} must have 1 on the diagonal and 0 before it, got {row}")
        if set(self.reflection_weights) != {"diagnostic_accuracy", "specificity", "scope"}:
            raise ValueError("reflection_weights must name diagnostic_accuracy, specificity and scope")
        return self
