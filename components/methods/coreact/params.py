"""Co-ReAct's params sections: ``collect`` (branching points, 3.1), ``coreact`` (the inject-verify-retry agent, 4.1) and
``rubric_generator`` (the generator and its listwise GRPO, 3.2). Composed into ``components.params.Params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.params_section import Section


class CollectParams(Section):
    n_questions: int = Field(default=6, ge=1, description="Training questions expanded into branching points.")
    temperatures: list[float] = Field(default_factory=lambda: [0.4, 1.0], description="Per candidate policy.")
    samples_per_temperature: int = Field(default=1, ge=1, description="Samples per (policy, temperature).")
    slate_size: int = Field(default=4, ge=2, description="k actions per slate.")
    mmr_lambda: float = Field(default=0.5, ge=0, le=1, description="MMR weight on relevance vs diversity.")
    min_valid_judges: int = Field(default=2, ge=1, description="Keep a point only with this many valid rankings.")
    max_depth: int = Field(default=4, ge=1, description="Depth-wise expansion limit per question.")
    judge_reference: bool = Field(default=False, description=(
        "Show the council each question's gold answer and hop chain (reference-guided judging); the paper's "
        "council ranks without one."))
    judge_orders: int = Field(default=1, ge=1, description=(
        "Rankings per judge and slate, each in one of its balanced orders (every action once at every position "
        "when it equals slate_size), so a judge's position bias adds the same points to every action; the "
        "paper's council ranks once per judge (1). At most slate_size."))

    @model_validator(mode="after")
    def _orders_within_slate(self) -> CollectParams:
        if self.judge_orders > self.slate_size:
            raise ValueError(f"judge_orders ({self.judge_orders}) cannot exceed slate_size ({self.slate_size}): "
                             "a slate has only that many balanced orders")
        return self


VerifierMode = Literal["checklist", "criterion"]


class CoReActParams(Section):
    """Co-ReAct inference (paper 3.3, appendix A "Co-ReAct inference") and the test-time baselines run beside it
    (4.1): what every agent of components/methods/coreact/agent.py and baselines.py reads."""

    tau: float = Field(default=0.5, ge=0, le=1, description="Verification accepts a step when the weighted fraction "
                       "of satisfied rubric criteria exceeds tau.")
    max_retries: int = Field(default=1, ge=0, description="Retries of a step that fails verification (also Self-Refine "
                             "and CRITIC's retries).")
    verifier_mode: VerifierMode = Field(
        default="checklist", description="How the verifier answers: 'checklist' = one call returning every "
        "criterion's verdict with a reason, as in the paper; 'criterion' = one yes/no call per criterion (for "
        "verifiers that answer the checklist by pattern; the retry's feedback then has no reasons).")
    token_budget: int = Field(default=6000, ge=1, description="Tokens a search trajectory may grow to (the policy's "
                              "last context plus its reply); past it the agent must answer.")
    best_of_n: int = Field(default=4, ge=1, description="Best-of-N: trajectories sampled per question.")
    best_of_n_temperature: float = Field(default=0.7, ge=0, le=2, description="Best-of-N: their sampling temperature "
                                         "(the final answer is greedy).")
    judge_max_tokens: int = Field(default=256, ge=8, description="Completion tokens of a verifier, scorer, critique or "
                                  "step-back call.")
    observation_chars: int = Field(default=400, ge=20, description="Characters of each observation shown to the rubric "
                                   "generator, the evaluator and the verifier.")


class RubricGeneratorParams(Section):
    """The Co-ReAct rubric generator and its listwise GRPO stage `train_rubric_generator` (paper 3.2, appendix A
    "GRPO hyperparameters"); temperature, top_p and max_tokens are also its inference sampling."""

    group_size: int = Field(default=4, ge=2, description="G: rubrics sampled per branching point.")
    prompts_per_step: int = Field(default=2, ge=1, description="Branching points (groups) per GRPO step.")
    epochs: int = Field(default=1, ge=1, description="Passes over the training branching points.")
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate.")
    kl_coef: float = Field(default=5e-3, ge=0, description="k3 KL coefficient to the frozen initial generator.")
    temperature: float = Field(default=0.7, ge=0, le=2, description="Sampling temperature of rubrics.")
    top_p: float = Field(default=0.95, gt=0, le=1, description="Nucleus sampling of rubrics.")
    max_tokens: int = Field(default=256, ge=16, description="Tokens per rubric.")
    max_criteria: int = Field(default=4, ge=1, description="Most criteria a rubric may have (more is a format failure).")
    max_criterion_chars: int = Field(default=160, ge=16, description="Longest criterion in characters (longer is a "
                                     "format failure; also the schema's maxLength, so structured output cannot run "
                                     "on): the 0.5B copied whole observations into criteria until max_tokens cut "
                                     "the JSON off.")
    reward_weights: dict[str, float] = Field(
        default_factory=lambda: {"rank": 0.75, "atomicity": 0.15, "format": 0.10},
        description="w1, w2, w3 of r = w1 r_rank + w2 r_atom + w3 r_fmt.")
    repetition_ngram: int = Field(default=4, ge=1, description="n of the repetition gate's n-grams.")
    repetition_max_rate: float = Field(default=0.4, ge=0, le=1, description="Rubrics whose repeated n-gram rate exceeds "
                                       "this get reward 0.")
    repetition_scope: Literal["reply", "criteria"] = Field(
        default="reply", description="What the repetition gate reads: 'reply' = the generator's whole reply, as the "
        "released code does (ZBWpro/Co-ReAct@ff5540a6 rubric_rl/reward_fn.py:240, is_repetitive(solution_str)), so a "
        "reply that loops outside its JSON is gated too; 'criteria' = the parsed criteria' text alone (the paper's "
        "'4-gram repetition rate of the rubric', appendix A).")
    atomicity: Literal["rule", "judge"] = Field(
        default="rule", description="How the atomicity term is measured: 'judge' = the evaluator's count of atomic "
        "criteria divided by their number, from the same call that scores the actions (the released code, "
        "reward_fn.py:135-145, 287, 303; the count is part of the reply's schema and a reply without it is a failed "
        "call, never an atomicity of 0; in action mode the mean over the slate's calls); 'rule' = a criterion is "
        "atomic when it has at most 25 words and no joining word outside brackets and quotes (no call; the paper "
        "does not say how it measures atomicity, 3.2.1). 'judge' needs evaluator_mode action or slate.")
    format_reward: Literal["schema", "count_weights"] = Field(
        default="schema", description="The format term: 'count_weights' = 0.5 when the rubric has 3 to 5 criteria plus "
        "0.5 when its weights as written sum to 1 within 0.15 (the released code, reward_fn.py:75-95; the generator's "
        "prompt then asks for 3 to max_criteria criteria with weights that add up to 1, as the released prompt does); "
        "'schema' = 1 for the JSON object alone, 0.5 with other text around it, 0 unparsed (the paper's 'format "
        "reward that enforces the expected schema', 3.2.1; the prompt asks for weights 1-3). An unparsed rubric "
        "scores 0 either way.")
    min_criteria: int = Field(
        default=1, ge=1, description="Rubrics with fewer criteria are not evaluated: their rank and atomicity terms "
        "are 0 and only the format term counts (the released code needs 2, reward_fn.py:271; the paper scores every "
        "rubric). A rubric that parses always has at least 1.")
    adv_std: Literal["population", "sample"] = Field(
        default="sample", description="The group std the generator's GRPO advantages divide by (grpo.adv_std for "
        "this stage): 'sample' = Bessel's G - 1, as the released code's verl does (volcengine/verl@b178a3cd "
        "verl/trainer/ppo/core_algos.py:320, torch.std; rubric_rl/train_grpo.sh:88 norm_adv_by_std_in_grpo=True); "
        "'population' = divide by G (the paper's Eq. 5 names only a std).")
    held_out_fraction: float = Field(default=0.25, ge=0, lt=1, description="Share of the questions whose branching "
                                     "points are held out to measure Spearman before and after training.")
    heldout_samples: int = Field(default=0, ge=0, description="Rubrics sampled per held-out point (at temperature "
                                 "and top_p, as the agent draws them) beside the greedy one: the held-out Spearman "
                                 "of the policy and not only of its mode.")
    evaluator_role: str = Field(default="rubric_evaluator", description="Role that scores slate actions against a "
                                "rubric.")
    evaluator_scoring: Literal["text", "probability"] | None = Field(
        default=None, description="How the evaluator's yes/no answers are scored in criterion mode (components/judges/"
        "call.py): the sampled word (text) or the probability of yes; None: as llm.scoring says for evaluator_role. "
        "Set here, it changes Co-ReAct's evaluator alone, not the other users of its role (ARBOR's and RubricEM's "
        "judges). The action and slate modes ask JSON, no label choice: text whatever this says.")
    evaluator_max_tokens: int = Field(default=128, ge=8, description="Completion tokens of an evaluator call.")
    checkpoint_every: int = Field(default=1, ge=0, description="GRPO steps between checkpoints of the generator "
                                  "(0: only at the end). Its steps are few and long, so the default keeps every one.")
    micro_batch_tokens: int = Field(default=2048, ge=64, description="Tokens per micro-batch of the generator's "
                                    "update: its prompts carry the whole trajectory prefix, and grpo's 4096 reached "
                                    "20.6 GB and was killed on a 24 GB machine.")
    warm_start: Literal["none", "oracle"] = Field(
        default="none", description="What GRPO starts from: 'none' = the untrained base, as in the paper; 'oracle' = "
        "first SFT on the training points' gold-chain rubrics (components/methods/coreact/oracle_rubrics.py), for a base "
        "that never samples a rubric naming the next hop.")
    warm_start_epochs: int = Field(default=1, ge=1, description="Passes of the oracle warm start over its rows.")
    warm_start_lr: float = Field(default=2e-4, gt=0, description="Learning rate of the oracle warm start (its other "
                                 "settings are sft's).")
    evaluator_mode: Literal["action", "slate", "criterion"] = Field(
        default="action", description="How the evaluator scores a slate: 'action' = one call per slate action, as "
        "in the paper; 'slate' = one call that sees every action and gives each criterion's verdict for all of "
        "them side by side (for evaluators that give every action alone the same verdicts); 'criterion' = one "
        "yes/no call per (criterion, action), for evaluators that answer a JSON checklist by pattern.")

    @model_validator(mode="after")
    def _check(self) -> RubricGeneratorParams:
        if set(self.reward_weights) != {"rank", "atomicity", "format"}:
            raise ValueError("reward_weights must name rank, atomicity and format")
        if any(w < 0 for w in self.reward_weights.values()) or sum(self.reward_weights.values()) <= 0:
            raise ValueError("reward_weights must be non-negative with a positive sum")
        if self.atomicity == "judge" and self.evaluator_mode == "criterion":
            raise ValueError("atomicity: judge needs evaluator_mode action or slate: the criterion mode's yes/no "
                             "replies carry no count of atomic criteria (set atomicity: rule)")
        return self
