"""The ``lab`` section of params.yaml: the nano policy's size, the world it learns, its SFT and GRPO budgets, and the
simulated judges' quality dial. Read by :mod:`components.lab` only; nothing outside the lab looks at it, so its
values change no other stage's run key. A pydantic leaf (it imports only ``params_section``), composed in
``components.params.Params`` like the methods' sections.

    python -m components.lab.experiment --set lab.judge.flip_rate=0.2
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from components.params_section import Section


class NanoParams(Section):
    """The nano policy: a Qwen2 built from this config (random init) over a tokenizer fitted to the world."""

    vocab_size: int = Field(default=4096, ge=300, description="BPE vocabulary fitted to the rendered trajectories "
                            "(byte-level, so unseen names still encode).")
    hidden_size: int = Field(default=128, ge=16, description="Model width.")
    num_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_heads: int = Field(default=4, ge=1, description="Attention heads.")
    num_kv_heads: int = Field(default=2, ge=1, description="Key/value heads (grouped-query attention).")
    intermediate_size: int = Field(default=384, ge=16, description="MLP width.")
    max_positions: int = Field(default=2048, ge=64, description="Longest row (prompt and episode) in tokens.")
    initializer_range: float = Field(default=0.02, gt=0, description="Std of the random init (transformers' default).")
    embedding_std: float | None = Field(default=None, gt=0, description="Std of the token embeddings' init (tied, so "
                                        "the LM head's too); None: initializer_range. The final RMSNorm caps a logit at "
                                        "about sqrt(hidden_size) x the token's embedding norm, so at width 128 and std "
                                        "0.02 a perfectly copied name gets at most a few percent of the mass.")

    class_direction: float = Field(default=0.0, ge=0, description="Norm of a random direction shared at init by "
                                   "every token of one class (a whole name, a whole document id, a whole number; "
                                   "components.lab.nano.TOKEN_CLASSES), one direction per class; 0: none. An "
                                   "inductive bias for copying: one attention head can then find the names in its "
                                   "context before each name's own embedding has been trained.")

    @model_validator(mode="after")
    def _heads_divide(self) -> NanoParams:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"lab.nano: hidden_size {self.hidden_size} must split into num_heads {self.num_heads}, "
                             f"which num_kv_heads {self.num_kv_heads} must divide")
        return self


class LabJudgeParams(Section):
    """The simulated judges' quality dial (components/llm/backends/simulated.py): each verdict is the oracle's,
    then biased, then flipped."""

    flip_rate: float = Field(default=0.0, ge=0, le=1, description="Chance that a verdict is inverted (a yes/no "
                             "flipped, a pairwise winner swapped, a score mirrored, a ranking reversed).")
    position_bias: float = Field(default=0.0, ge=0, le=1, description="Chance that a pairwise or slate judgment "
                                 "picks the first-shown option whatever the oracle says.")
    bias: Literal["none", "length", "keyword"] = Field(default="none", description="A systematic bias: `length` "
                                                       "prefers the longer trajectory, `keyword` the one that writes "
                                                       "`keyword` (and passes any answer or criterion holding it).")
    bias_rate: float = Field(default=0.0, ge=0, le=1, description="Chance that the systematic bias decides a "
                             "judgment instead of the oracle.")
    keyword: str = Field(default="certainly", min_length=1, description="The word the keyword bias rewards.")
    seed: int = Field(default=0, description="Seed of the dial's coin flips (each judgment's flips are a function of "
                      "this seed and the prompt, so a repeated call gets the same verdict).")


class LabGrid(Section):
    """One grid of the lab sweep: training variants x judge dials x seeds (``python -m flows.lab --grid NAME``)."""

    variants: list[str] = Field(min_length=1, description="Its variants (grpo first: the matched baseline).")
    dials: dict[str, dict[str, Any]] = Field(
        min_length=1, description="Its judges: a name -> lab.judge settings over the defaults. The first is the one "
                                  "the outcome-only variants run under.")
    seeds: list[int] | None = Field(default=None, description="Seeds of every cell (None: lab.sweep.seeds).")
    variant_seeds: dict[str, list[int]] = Field(default_factory=dict, description="A variant's own seeds instead of "
                                                "`seeds` (a slow variant run on fewer; the page says so).")
    variant_dials: dict[str, list[str]] = Field(default_factory=dict, description="A variant's own judges, names of "
                                                "`dials`, instead of all of them (a slow variant under fewer).")
    steps: int | None = Field(default=None, ge=1, description="GRPO steps of its cells (None: lab.sweep.steps).")
    overrides: list[str] = Field(default_factory=list, description="`key=value` settings of its cells, applied after "
                                 "lab.sweep.overrides (a grid's own grpo.lr, say).")


    @model_validator(mode="after")
    def _known_dials(self) -> LabGrid:
        for variant, names in self.variant_dials.items():
            unknown = [n for n in names if n not in self.dials]
            if unknown:
                raise ValueError(f"variant_dials.{variant}: {unknown} are not dials of this grid ({', '.join(self.dials)})")
        return self


def _grids() -> dict[str, LabGrid]:
    return {"session": LabGrid(variants=["grpo", "dapo", "arbor", "ss_grpo", "arco"],
                               dials={"perfect": {}, "noisy": {"flip_rate": 0.25},
                                      "biased": {"bias": "length", "bias_rate": 0.5}})}


class LabSweepParams(Section):
    """The lab sweep (``python -m flows.lab``): the cells of one of its grids, each a ``train_policy`` run under
    ``--overlay lab`` with the same steps and rollout budget, then ``evaluate@<variant>`` on the test split."""

    grids: dict[str, LabGrid] = Field(
        default_factory=_grids, description="Named grids: session (the default: sized for a session), full (the "
        "nightly sweep's: every variant and judge), intro (the main job's comparison); --grid picks one.")
    outcome_only: list[str] = Field(
        default_factory=lambda: ["grpo", "dapo", "grpo_arbor", "dapo_arbor", "scaffold_grpo", "grpo_arco"],
        description="Variants whose reward asks no judge: run under the first dial only and compared with every "
                    "dial's cells (a run that asks a judge anyway is an error in the report).")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="Seeds of a grid's cells "
                             "unless it names its own.")
    steps: int = Field(default=40, ge=1, description="GRPO steps of every cell.")
    eval_every: int = Field(default=10, ge=1, description="Steps between a cell's dev evaluations (its curve).")
    threshold: float = Field(default=0.05, ge=0, le=1, description="The dev EM gain over its start a cell's 'steps "
                             "to threshold' waits for.")
    workers: int = Field(default=2, ge=1, description="Cells run at once (each on run.torch_threads threads).")
    overrides: list[str] = Field(default_factory=list, description="`key=value` settings of every cell (its "
                                 "questions, evaluation size), after the dial and the seed.")
    out_dir: str = Field(default="sweep", description="The sweep's folder under run.out_dir: <dial>/seed_<s>/ (a "
                         "cell shared by two grids, same variant, dial settings and seed, is run once).")


class LabParams(Section):
    world_seed: int | None = Field(default=None, description="Seed of the world the nano policy is evaluated and "
                                   "trained on by GRPO (None: params.seed, the prepare stage's world); its questions "
                                   "are data.n_train + n_dev + n_test, split in that order as the prepare stage does.")
    sft_worlds: int = Field(default=6, ge=0, description="Other worlds (seeds world_seed+1..) whose oracle episodes "
                            "the nano policy is trained on, beside the train split of its own world.")
    sft_questions_per_world: int = Field(default=300, ge=1, description="Questions drawn in each of those worlds.")
    sft_own_world: bool = Field(default=False, description="Also train on oracle episodes of the lab world's train "
                                "split (the facts of test questions can then be memorised; off by default).")
    sft_own_questions: int | None = Field(default=None, ge=1, description="With sft_own_world, the SFT reads only the "
                                          "first this many questions of the lab world's train split and GRPO trains "
                                          "on the rest, questions whose episodes the policy has not fitted (None: the "
                                          "SFT reads the whole split and GRPO trains on it too).")
    sft_opening_worlds: int = Field(default=0, ge=0, description="Further worlds (seeds world_seed+101..) whose "
                                    "questions add only their oracle episode's opening turn (the question, then a "
                                    "search for the name it asks about): short rows that are nearly all copying, "
                                    "the skill the nano policy is slowest to form.")
    sft_document_rows: int = Field(default=0, ge=0, description="Times each paragraph of the worlds the SFT reads "
                                   "(the lab world's included) is added as a row trained whole: the world's corpus as "
                                   "pretraining, so the nano knows its facts and the names it copies (0: off).")
    sft_protocols: list[Literal["react", "scaffold"]] = Field(
        default_factory=lambda: ["react"], min_length=1, description="The protocols the SFT rows are written in, "
        "each over the same questions: `react` (the lab agent's Thought/Action turns) and `scaffold` (RubricEM's "
        "Plan/Research/Review/Answer replies, components/lab/scaffold.py, its tags one token each), so a nano "
        "trained on both speaks to RubricEM's variants too.")
    sft_threads: int | None = Field(default=None, ge=1, description="Threads of the nano's SFT, which runs alone "
                                    "(None: run.torch_threads, the cells' one thread each).")
    nano: NanoParams = Field(default_factory=NanoParams)
    judge: LabJudgeParams = Field(default_factory=LabJudgeParams)
    grpo_steps: int = Field(default=100, ge=1, description="GRPO steps of a lab run.")
    grpo_worlds: int = Field(default=0, ge=0, description="0: the lab experiment's GRPO trains on the lab world's "
                             "train questions the SFT held out; N: on the questions of the first N SFT worlds that "
                             "the SFT did not read (of grpo_questions_per_world drawn there), so no question repeats "
                             "and a search path fitted to one question cannot pay; their names are the nano's tokens, "
                             "their paragraphs its document rows.")
    grpo_questions_per_world: int = Field(default=500, ge=1, description="With grpo_worlds, the questions drawn in "
                                          "each of those worlds; GRPO gets those not among the SFT's "
                                          "sft_questions_per_world (about 270-290 of 500 in the default worlds).")
    eval_every: int = Field(default=10, ge=1, description="GRPO steps between greedy dev evaluations (the curve).")
    sweep: LabSweepParams = Field(default_factory=LabSweepParams)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="GRPO seeds of the lab "
                             "experiment (one run each, on the same SFT start).")
