"""ARCO's params section ``arco`` (the rubric model mu, its heads and losses, the released setup). Composed
into ``components.params.Params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.params_section import Section, SharedOverrides, shared_overrides_field


class ArcoSetup(Section):
    """ARCO's released HotpotQA setup. These keys belong to shared sections (retrieval, agent, data) whose paper
    values other methods use, so they are kept here; an ARCO run under the paper profile must apply them
    (components.methods.arco.model_setup.setup_overrides gives the --set flags, and the variant refuses a mismatch)."""

    retrieval_scope: Literal["corpus", "question"] = Field(default="question", description="retrieval.scope: the "
                                                           "agent searches only the question's own paragraphs.")
    top_k: int = Field(default=1, ge=1, description="retrieval.top_k: hits per search call.")
    max_steps: int = Field(default=3, ge=1, description="agent.max_turns: steps per episode.")
    n_train: int = Field(default=2000, ge=1, description="data.n_train: training questions.")
    n_dev: int = Field(default=500, ge=1, description="data.n_dev: development questions.")


class ArcoParams(Section):
    """ARCO: the rubric model mu (generation head + score head on one LoRA backbone), its teacher warm-up, the
    decomposition constraint and the co-evolution with the policy (components/methods/arco/variants.py)."""
    shared: SharedOverrides = shared_overrides_field()

    k: int = Field(default=3, ge=1, description="K: criteria mu writes per step (paper: 3).")
    model_role: str = Field(default="trainable_policy", description="Role (an hf backend) whose weights are mu's "
                            "backbone: the same scale as the policy.")
    teacher_role: str = Field(default="teacher", description="Role that writes the warm-up criteria.")
    score_head: Literal["mlp3_tanh", "mlp2"] = Field(
        default="mlp3_tanh", description="The score head's MLP. mlp3_tanh (the released code): H-512-GELU-128-GELU-n "
        "and a tanh, each score in [-1, 1] (525,315 weights at H=896, n=3); mlp2: H-head_width-tanh-n, unbounded "
        "(114,945 at H=896, width 128, n=1). n is K under score_readout=mean_pool, else 1.")
    score_readout: Literal["mean_pool", "criterion_end"] = Field(
        default="mean_pool", description="What the score head reads. mean_pool (the released code): the last hidden "
        "state averaged over every token of the step's [prompt | criteria], one vector giving K scores (one per "
        "criterion slot), so a step is scored even when no criterion could be read from mu's reply; criterion_end: "
        "the hidden state at each criterion's last token, one score per criterion written (a reply without a "
        "readable criterion leaves its step unscored). The step reward is the mean of the scores either way.")
    head_width: int = Field(default=128, ge=1, description="Hidden width of the score head under score_head=mlp2 "
                            "(mlp3_tanh's widths are the released 512 and 128).")
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate of mu's LoRA (and of the score head "
                      "when head_lr is null).")
    head_lr: float | None = Field(default=None, gt=0, description="AdamW learning rate of the score head; null: lr.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay of mu's LoRA and score head.")
    kl_coef: float = Field(default=0.05, ge=0, description="Weight of the KL keeping the generation head near its "
                           "warm-up reference.")
    kl_estimator: Literal["full", "k3"] = Field(
        default="full", description="The generation head's KL to its reference at each criteria token. full (the "
        "released code): the exact KL(ref || mu) summed over the whole vocabulary; k3: the k3 sample estimate of "
        "KL(mu || ref) at the token mu wrote.")
    kl_reduction: Literal["step", "token"] = Field(
        default="step", description="How the per-token KL becomes the loss term. step (the released code): the mean "
        "over each step's criteria tokens, summed over a trajectory's steps, averaged over the update's "
        "trajectories; token: the mean over every criteria token of the update.")
    terminal_metric: Literal["f1", "em"] = Field(default="em", description="Terminal reward the step rewards of a "
                                                 "trajectory must sum to (the released code: EM).")
    decomposition_weighting: Literal["class_balanced", "none"] = Field(
        default="class_balanced", description="Weights of the trajectories in mu's fit loss. class_balanced (the "
        "released code): n / (2 n_pos) for a trajectory whose terminal reward is above 0.5 and n / (2 n_neg) for "
        "the others, counted over the trajectories of one update (of the warm-up: all of them), so the minority "
        "class weighs as much as the majority; none: every trajectory weighs 1.")
    dense_baseline: Literal["position_bucket", "step_index"] = Field(
        default="position_bucket", description="Baseline of the dense step advantages (reward-to-go minus it). "
        "position_bucket (the released code): the mean over the whole batch of the reward-to-go in the step's "
        "bucket (search_1, search_2, ... by the rank of a search step; terminal for the answering, the last or an "
        "unreadable step), the batch mean for a bucket of one; step_index: the mean within the group at the same "
        "step index when at least two trajectories have it, else the group's mean.")
    dense_scale: float = Field(default=0.5, gt=0, description="Factor on the dense step advantages (the released "
                               "code: 0.5).")
    dense_std: bool = Field(default=False, description="Divide the dense step advantages by the std of the "
                            "reward-to-go (of the group under step_index, of the batch under position_bucket); the "
                            "released code does not. The sparse phase follows grpo.std_normalize.")
    warmup_steps: int = Field(default=2, ge=0, description="Trainer steps whose trajectories the teacher annotates; "
                              "mu's warm-up SFT runs at the end of the last one (0: no warm-up).")
    warmup_epochs: int = Field(default=2, ge=1, description="Passes of mu's warm-up over the annotated steps.")
    sparse_epochs: float = Field(default=0.25, ge=0, description="eta: epochs over the training questions during "
                                 "which the policy learns from the outcome reward before mu's dense step rewards.")
    update_every: int = Field(default=1, ge=1, description="Once warmed up, mu is updated every this many steps.")
    update_epochs: int = Field(default=1, ge=1, description="Optimizer steps of one mu update over the step's "
                               "trajectories.")
    micro_batch: int = Field(default=4, ge=1, description="Trajectories per forward/backward of mu.")
    write_batch: int = Field(default=8, ge=1, description="Steps whose criteria mu writes in one generate call "
                             "(bounds the KV cache and kept logits of transformers' generate on CPU).",
                             json_schema_extra={"execution": True})
    engine: Literal["hf", "llamacpp"] | None = Field(
        default=None, description="What samples mu's criteria: hf (transformers' generate on mu's own weights) or "
        "llamacpp (the role's embedded base on a llama.cpp server, mu's adapter handed over after its warm-up and "
        "each update, as the policy's rollouts are); null: llamacpp when train_policy.engine is, else hf.",
        json_schema_extra={"execution": True})
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute mu's decoder activations in its backward passes (mu on its own base): "
        "the same update; a looping trajectory's steps (about 12k tokens in one micro-batch) otherwise hold every "
        "layer's activations.", json_schema_extra={"execution": True})
    micro_batch_tokens: int | None = Field(
        default=1024, ge=1, description="mu's forward over a micro-batch's steps runs as passes over length-sorted "
        "groups of at most this many padded tokens (a longer step alone); null: one pass, every step padded to the "
        "longest. The same numbers: a trajectory's step prompts grow step by step, so one pass pads most of them. "
        "With prefix_packing, the most tokens a shared-prefix pack holds.",
        json_schema_extra={"execution": True})
    prefix_packing: bool = Field(
        default=True, description="mu's passes run a micro-batch's steps as shared-prefix packs: the question and "
        "the steps before step t, which every later step's prompt repeats, are computed once, and each step's own "
        "tail and criteria attend to them through a 4D mask. The same numbers to float rounding, about 0.6x the "
        "tokens on sft_data's trajectories; false: padded passes (micro_batch_tokens).",
        json_schema_extra={"execution": True})
    checkpoint_min_tokens: int = Field(
        default=0, ge=0, description="With gradient_checkpointing, a micro-batch whose steps come to fewer than "
        "this many padded tokens keeps its activations (the same update, one forward fewer); 0: always recompute.",
        json_schema_extra={"execution": True})
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm of mu's updates.")
    gamma: float = Field(default=1.0, ge=0, le=1, description="Discount of the step rewards' reward-to-go.")
    criteria_temperature: float = Field(default=0.7, ge=0, le=2, description="Sampling temperature of mu's "
                                        "criteria (0: greedy).")
    criteria_max_tokens: int = Field(default=96, ge=8, description="Tokens mu may write for one step's criteria.")
    observation_chars: int = Field(default=300, ge=20, description="Characters of each observation in mu's and the "
                                   "teacher's prompts.")
    teacher_max_tokens: int = Field(default=1024, ge=32, description="Completion tokens of a teacher annotation.")
    setup: ArcoSetup = Field(default_factory=ArcoSetup, description="ARCO's released setup (see ArcoSetup).")
