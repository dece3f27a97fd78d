"""ARBOR's params section ``arbor`` (rubric memory, induction, sparse pairwise judging, shaping). Composed into
``components.params.Params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.params_section import Section, SharedOverrides, shared_overrides_field


class ArborParams(Section):
    """ARBOR (rubric memory + pairwise process reward) and its baselines rar / arbor_no_memory (paper Table 4)."""
    shared: SharedOverrides = shared_overrides_field()

    shaping_lambda: float = Field(default=0.1, ge=0, description="lambda: weight of the centred rubric term in "
                                  "R_total = R_base + lambda * s.")
    alpha: float = Field(default=0.25, ge=0, le=1, description="Factor on negative centred rubric scores.")
    delta_v: float = Field(default=0.05, ge=0, description="Within-group score variance a rubric needs: admission of a "
                           "draft, the per-group filter of active rubrics, and the low-variance count of retirement.")
    rho_min: float = Field(default=0.0, ge=-1, le=1, description="Least Pearson correlation with F1: admission and "
                           "(cumulative) retirement.")
    k_consol: int = Field(default=4, ge=1, description="Drafts in the candidate pool D that trigger a consolidation.")
    kappa: int = Field(default=5, ge=1, description="Consecutive low-variance activations a common rubric may have; "
                       "one more retires it.")
    max_common: int = Field(default=6, ge=1, description="Capacity of the common pool P.")
    maturity_activations: int = Field(default=5, ge=1, description="Activations after which a common rubric's "
                                      "statistics count as mature: only a mature rubric can be replaced when P is full.")
    active_rubrics: int = Field(default=2, ge=1, description="Common rubrics activated per step (one by correlation, "
                                "the rest least-recently-used).")
    dedup_threshold: float = Field(default=0.9, gt=0, le=1, description="Cosine similarity at or above which a "
                                   "consolidated rubric duplicates one in P.")
    embedder: str = Field(default="embedded-minilm", description="Sentence embedder of the de-duplication.")
    max_drafts: int = Field(default=3, ge=1, description="Draft rubrics asked of one contrastive induction (1..N).")
    max_new_common: int = Field(default=2, ge=1, description="Common rubrics asked of one consolidation (1..N).")
    show_answer: bool = Field(default=True, description="Show the gold answer to the induction prompt.")
    rar_min_items: int = Field(default=5, ge=1, description="rar: fewest checklist items per question.")
    rar_max_items: int = Field(default=10, ge=1, description="rar: most checklist items per question.")
    judge_role: str = Field(default="rubric_evaluator", description="Role of the pairwise judge and rar's rater.")
    judge_form: Literal["winner", "verdicts", "single"] = Field(
        default="winner", description="How the pairwise judge decides an edge (components/methods/arbor/"
        "pairwise_judge.py): winner, the paper's one call naming A, B or TIE (3.4); verdicts, a yes/no per attempt "
        "with both in view; single, a yes/no per attempt seen alone, asked once per attempt. The judge bench "
        "(docs/results/judges_bench.md) ranks single best for the embedded 1.5B, which says TIE to almost every pair "
        "in the paper's form.")
    judge_scoring: Literal["text", "probability"] | None = Field(
        default=None, description="How the pairwise judge's labels are scored (components/judges/call.py): the "
        "sampled label (text) or the expectation over the label tokens' probabilities; None: as llm.scoring says "
        "for judge_role. Set here, it changes ARBOR's judge alone, not the other users of its role.")
    inducer_role: str = Field(default="rubric_evaluator", description="Role that induces drafts and writes rar's "
                              "per-question rubrics.")
    consolidator_role: str = Field(default="consolidator", description="Role that abstracts drafts into common rubrics.")
    observation_chars: int = Field(default=300, ge=20, description="Characters of each observation shown to judges.")
    judge_max_tokens: int = Field(default=32, ge=4, description="Completion tokens of a pairwise verdict.")
    writer_max_tokens: int = Field(default=768, ge=32, description="Completion tokens of an induction, "
                                   "consolidation or rar rubric call.")
