"""The trainers' sections of params.yaml: ``lora``, ``grpo`` (components.training.grpo.trainer.GRPOTrainer),
``dapo`` (the dapo variant over grpo, components/variants.py), ``train_policy`` with its ``deepspeed`` block,
and ``sft`` (components.training.sft.trainer). A pydantic leaf (it imports only ``params_section``), composed
in ``components.params.Params``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from components.params_section import Section, drop_when_off


class LoRAParams(Section):
    r: int = Field(default=8, ge=0, description="LoRA rank of every trained policy (0 = full fine-tuning).")
    alpha: int = Field(default=16, ge=1, description="LoRA alpha.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="LoRA dropout.")


def _checkpoint_min_tokens() -> Any:
    """The field of SFT and GRPO that exempts short micro-batches from activation recomputation."""
    return Field(
        default=0, ge=0, description="With gradient_checkpointing: a micro-batch of fewer padded tokens (rows x its "
        "longest row) keeps its activations instead, so short rows (ReAct turns) do not pay for the recomputation "
        "that long rows (scaffold episodes) need. 0: every micro-batch recomputes.")


class GRPOParams(Section):
    """The configuration of ``components.training.grpo.trainer.GRPOTrainer``: one set of names and defaults.
    What the speed options cost and buy: docs/performance.md ("Which speed option when")."""

    # rollout
    group_size: int = Field(default=4, ge=1, description="Rollouts per prompt (G).")
    prompts_per_step: int = Field(default=2, ge=1, description="Prompts (groups) per step.")
    temperature: float = Field(default=1.0, ge=0, description="Rollout sampling temperature (0: greedy).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Rollout nucleus sampling.")
    top_k: int = Field(default=0, ge=0, description="Rollout top-k (0: off).")
    max_new_tokens: int = Field(default=128, ge=1, description="Tokens per sampled continuation (per turn for agents).")
    shuffle: bool = Field(default=True, description="Seeded shuffle of the prompt order each epoch.")
    dynamic_sampling_max_rounds: int | None = Field(
        default=None, ge=0, json_schema_extra={"keyed_when_set": True},
        description="DAPO's dynamic sampling (Yu et al. 2025, 3.2): extra rounds of prompts a step may draw to replace "
        "groups whose scores have no variance; 0: no refill; None: the variant's choice (dapo refills, grpo does not).")

    # loss and clipping
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over each batch of rollouts.")
    mini_batch_size: int | None = Field(default=None, ge=1, description="Rows per optimizer step; None: the whole batch.")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="Clip range of the importance ratio (low side).")
    clip_eps_high: float | None = Field(default=None, gt=0, description="High clip range (DAPO clip-higher); None: clip_eps.")
    dual_clip_c: float | None = Field(
        default=None, gt=1, json_schema_extra={"keyed_when_set": True},
        description="Dual-clip PPO (Ye et al. 2019; verl's clip_ratio_c): a negative-advantage token's loss is capped "
        "at -dual_clip_c * A however far its ratio rose. None: off.")
    kl_coef: float = Field(default=1e-3, ge=0, description="k3 KL coefficient to the frozen reference (0 skips it).")
    kl_clamp: float | None = Field(
        default=None, gt=0, json_schema_extra={"keyed_when_set": True},
        description="Cap on each token's k3 KL term, no gradient beyond it (verl clamps its low_var_kl to 10). None: off.")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = Field(
        default="token_mean", description="Loss aggregation; seq_mean_token_sum is RubricEM Eq. 1."
    )
    old_logprobs: Literal["auto", "recompute", "engine"] = Field(
        default="auto",
        description="Log-probs of the sampling policy: auto skips the extra forward pass when the update is exactly "
        "on-policy (one epoch, one mini-batch), recompute always runs it, engine trusts the rollout engine's.",
    )
    tis_cap: float | None = Field(
        default=None, gt=0, json_schema_extra={"keyed_when_set": True},
        description="Token-level truncated importance sampling (ARBOR B.2): each token's loss weighted by "
        "min(pi_old / pi_rollout, tis_cap), for an engine that scores tokens unlike the trained weights. None: off.",
    )
    skip_zero_advantage: bool = Field(
        default=False,
        description="Leave episodes with a zero advantage on every token out of the update (DAPO's dynamic sampling "
        "within the step): they carry only the KL term. Changes token_mean's denominator.",
    )

    # rewards and advantages
    format_penalty: float | None = Field(
        default=None, le=0, json_schema_extra={"keyed_when_set": True},
        description="Every variant's outcome reward for a format-invalid episode (components/rewards/outcome.py). "
        "None: ARBOR's R_base, -1; 0 where right answers are rare and -1 would teach answering anything (the lab).")
    std_normalize: bool = Field(default=True, description="Divide group-centred rewards by the group std (False: Dr. GRPO).")
    adv_eps: float = Field(default=1e-6, gt=0, description="Epsilon in the std division.")
    adv_std: Literal["population", "sample"] = Field(
        default="population", description="The group std advantages divide by: population (numpy's, RubricEM's "
        "open-instruct) or sample (Bessel's: verl, TRL, slime). Left out of dumps (and run keys) while population.")

    # optimiser
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warm-up, in trainer steps.")
    total_steps: int | None = Field(default=None, ge=1, description="Linear LR decay to 0 at this step; None: constant.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    steps: int = Field(default=20, ge=1, description="Trainer steps of a run (not keyed: a finished run can be extended).")

    # checkpoints
    checkpoint_every: int = Field(default=10, ge=0, description="Steps between checkpoints (0: only explicit saves).")
    keep_last: int | None = Field(default=2, ge=1, description="Checkpoints kept; None keeps all.")

    # speed (execution only: not keyed)
    micro_batch_size: int | None = Field(default=None, ge=1, description="Rows per forward/backward (gradient accumulation).")
    micro_batch_tokens: int | None = Field(
        default=None, ge=1, description="Instead of micro_batch_size: length-sorted micro-batches of at most this many "
        "padded tokens (verl's dynamic batch size).")
    prefix_packing: bool = Field(
        default=True, description="With micro_batch_tokens: micro-batches as shared-prefix packs, a prefix rows share "
        "computed once (components/training/speed/prefix_pack.py); the same numbers to float rounding.")
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute each decoder layer's activations in the backward pass: the same update "
        "in less memory, for more time.")
    checkpoint_min_tokens: int = _checkpoint_min_tokens()
    fused_lora: bool = Field(
        default=True, description="The LoRA linears' leaner forward (components/training/speed/fused_lora.py): peft's update "
        "to the bit when lora.alpha / lora.r is a power of two; for every LoRA model the run trains.")

    # speed at int8 rounding (keyed once on)
    int8_base: bool = Field(
        default=False, description="The frozen base's matmuls of the run's LoRA models in int8 (CPU only; "
        "components/training/speed/int8_base.py). Left out of dumps (and so of run keys) while off.")

    @model_serializer(mode="wrap")
    def _int8_keyed_when_set(self, handler):
        out = drop_when_off(handler(self), self, "int8_base")
        if self.adv_std == "population":  # every run keyed before the option divided by the population std
            out.pop("adv_std", None)
        return out

    @model_validator(mode="after")
    def _tis_reads_engine_logprobs(self) -> GRPOParams:
        if self.tis_cap is not None and self.old_logprobs == "engine":
            raise ValueError("tis_cap weights tokens by the trainer's old log-probs over the engine's; with "
                             "old_logprobs: engine the two are the same (the weight is 1): use auto or recompute")
        return self


class DAPOParams(Section):
    """The ``dapo`` variant: DAPO as Yu et al. 2025 define it, applied over the grpo block for ``train_policy@dapo``
    only (components.variants.variant_params); grpo and every other variant are untouched. The paper profile holds
    the DAPO paper's values, from its released recipe (verl recipe/dapo)."""

    clip_eps_low: float = Field(default=0.2, gt=0, lt=1, description="eps_low of the decoupled clip (Sec. 3.1, "
                                "Eq. 8; verl clip_ratio_low): the run's grpo.clip_eps.")
    clip_eps_high: float = Field(default=0.28, gt=0, description="eps_high, clip-higher (Sec. 3.1; verl "
                                 "clip_ratio_high): the run's grpo.clip_eps_high.")
    kl_coef: float = Field(default=0.0, ge=0, description="The KL term's coefficient: DAPO drops it (Sec. 2.3): the "
                           "run's grpo.kl_coef.")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = Field(
        default="token_mean", description="Token-level policy-gradient loss (Sec. 3.3): the run's grpo.loss_agg.")
    dual_clip_c: float | None = Field(
        default=10.0, gt=1, description="The released recipe's dual clip (verl clip_ratio_c; the paper names none): "
        "the run's grpo.dual_clip_c. None: off.")
    max_num_gen_batches: int = Field(
        default=10, ge=1, description="Dynamic sampling (Sec. 3.2): generation rounds a step may take, the first "
        "included, until it holds grpo.prompts_per_step groups whose outcomes differ (verl's "
        "algorithm.filter_groups.max_num_gen_batches). Each refill here draws only the prompts still missing, where "
        "verl draws gen_batch_size (3x the batch in the recipe) and cuts the excess, and a step that reaches the "
        "bound trains on the groups it has (verl raises). grpo.dynamic_sampling_max_rounds, when set, wins.")
    overlong_buffer_tokens: int | None = Field(
        default=4096, ge=1, description="L_cache of the soft overlong punishment (Sec. 3.4, Eq. 13; verl "
        "overlong_buffer.len): an episode whose policy-generated tokens, every turn together, pass "
        "L_max - L_cache loses up to overlong_penalty_factor linearly over the last L_cache tokens of its budget "
        "(components/rewards/overlong.py). None: no length shaping.")
    overlong_penalty_factor: float = Field(default=1.0, ge=0, description="The penalty at L_max (verl "
                                           "overlong_buffer.penalty_factor; Eq. 13: 1).")
    max_response_tokens: int | None = Field(
        default=None, ge=1, description="L_max: the episode's token budget the shaping measures against. None: "
        "agent.max_tokens x agent.max_turns, the most the ReAct agent's turns can generate (the rollout's cap, as "
        "DAPO's 20,480 is its rollout's max_response_length).")

    @model_validator(mode="after")
    def _buffer_fits(self) -> DAPOParams:
        if (self.overlong_buffer_tokens is not None and self.max_response_tokens is not None
                and self.overlong_buffer_tokens > self.max_response_tokens):
            raise ValueError(f"overlong_buffer_tokens ({self.overlong_buffer_tokens}) exceeds max_response_tokens "
                             f"({self.max_response_tokens})")
        return self


class DeepSpeedParams(Section):
    """DeepSpeed ZeRO for the trainers' updates, by way of accelerate (components/training/stepper.py)."""

    zero_stage: Literal[2, 3] | None = Field(
        default=None, description="null: plain torch updates (the embedded path). 2: ZeRO-2, optimizer state and "
        "gradients sharded across processes; 3: parameters too. For full fine-tuning (lora.r: 0) of a policy whose "
        "optimizer state does not fit one GPU; launch with `accelerate launch --num_processes N -m tasks.<stage>`. "
        "Needs the [gpu] extra. Keyed once set (its checkpoints hold ZeRO's optimizer state).")
    offload_optimizer: bool = Field(default=False, description="ZeRO-Offload: optimizer state in host memory.")
    offload_params: bool = Field(default=False, description="ZeRO-3 only: parameters in host memory between uses.")
    param_persistence_threshold: int = Field(
        default=100_000, ge=0, description="ZeRO-3 only: parameters of at most this many elements stay whole on "
        "every rank after their first use (DeepSpeed's stage3_param_persistence_threshold); 0 shards every one.")

    def keyed(self) -> dict[str, Any] | None:
        """What a run key holds of this section: nothing while ``zero_stage`` is unset (earlier runs keep their
        keys), and never the persistence threshold (it moves memory and communication, not the weights)."""
        return None if self.zero_stage is None else self.model_dump(exclude={"param_persistence_threshold"})

    @model_validator(mode="after")
    def _offload_params_needs_stage_3(self) -> DeepSpeedParams:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("offload_params needs zero_stage: 3 (only ZeRO-3 shards the parameters)")
        return self


class TrainPolicyParams(Section):
    """The `train_policy@<variant>` stage: which policy it starts from and how rollouts are served."""

    engine: Literal["hf", "llamacpp", "vllm"] = Field(
        default="hf", description="Rollout engine: transformers generate (reference), the llama.cpp native server "
        "(CPU), or vLLM in the trainer's process (GPU; the [gpu] extra), which loads the warm-started base once and "
        "takes the trained LoRA after every update.")
    vllm_options: dict[str, Any] = Field(
        default_factory=lambda: {"gpu_memory_utilization": 0.35, "enable_prefix_caching": True},
        description="Keyword arguments of vllm.LLM for the vllm engine. Colocated with the trainer on one GPU, "
        "gpu_memory_utilization is vLLM's share of it (the rest holds the trainer's weights, optimizer and "
        "activations); on a node with a GPU of its own for rollouts, run it there with CUDA_VISIBLE_DEVICES and "
        "a higher share. Not part of the run key: it changes where rollouts are computed, not what is trained.")
    warm_start: dict[str, str | None] = Field(
        default_factory=lambda: {"react": "sft", "scaffold": "sft_scaffold"},
        description="Agent -> the warm-start method (a params.methods entry trained by the sft stage of that "
        "name) whose adapter is merged into the base before RL, so the KL reference is the warm-started policy, "
        "and whose prompts the agent keeps. An agent not listed, or mapped to null, starts from the base model.",
    )
    merge_warm_start: bool = Field(
        default=True, description="Merge the warm-start method's adapter into the base before RL. false: the "
        "trainable base already is the warm-started policy (a warm start trained by full fine-tuning and saved as "
        "the model the trainable_policy backend loads, e.g. the lab's nano policy at outputs/lab/sft), so no adapter "
        "is read and only the warm start's prompts carry over. Keyed through the warm start's adapter digest (none).")
    n_questions: int = Field(default=40, ge=1, description="Training questions (train split) the prompts cycle over.")
    n_ctx: int = Field(default=4096, ge=256, description="llamacpp engine: context tokens per slot.")
    eval_questions: int = Field(
        default=20, ge=0, description="Dev questions answered greedily through the rollout engine before and after "
        "training (metrics dev_before.* / dev_after.*); 0 skips.")
    eval_every: int = Field(
        default=0, ge=0, description="Also answer the eval_questions greedily every this many steps during training "
        "(metrics dev/em, dev/f1, ...; trajectories in dev_curve/): the run's learning curve. 0: before and after only.")
    first_question: int = Field(
        default=0, ge=0, description="Training questions start at this index of the train split (the ones before it "
        "held out, e.g. for the warm start's SFT: the lab's lab.sft_own_questions).")
    branch_from: str | None = Field(
        default=None, description="A checkpoint folder (ckpt/step_NNNNNN) of another run to start this run from: "
        "policy LoRA, optimizer, scheduler, RNG, data position, step history and method state, as a resume would "
        "restore them. For ablations that share a prefix (arco_frozen is arco up to the end of mu's warm-up), so "
        "the prefix is trained once. Part of the run key, by the checkpoint's manifest digest; a run that already "
        "has checkpoints of its own resumes from them instead.")
    eval_batch_invariant: bool = Field(
        default=True, description="Dev evaluation decodes each request alone with no reused prompt cache, so an "
        "answer does not flip with what else the server batches (slower; perf/eval_determinism.py measures both). "
        "Not part of the run key: it changes how the policy is measured, not how it is trained.")
    device: str = Field(
        default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="Where every trainable model (the policy of train_policy and sft, the rubric generator, ARCO's "
        "rubric model) is loaded and updated: auto (the first CUDA device when there is one, else the CPU), cpu, "
        "cuda or cuda:N (components/training/device.py). An explicit cuda on a machine without one is refused. "
        "Not part of the run key: a run may resume on another device.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Precision the trainable models' weights are loaded in: auto (bfloat16 on CUDA, "
        "float32 on the CPU) or a named dtype. The run key holds the resolved dtype when it is not float32.")
    deepspeed: DeepSpeedParams = Field(
        default_factory=DeepSpeedParams, description="DeepSpeed ZeRO for the updates of train_policy and sft.")

    def question_slice(self) -> slice:
        """The train split's questions the run trains on: ``n_questions`` from ``first_question``."""
        return slice(self.first_question, self.first_question + self.n_questions)


class SFTParams(Section):
    lr: float = Field(default=1e-4, gt=0, description="Learning rate.")
    epochs: int = Field(default=1, ge=1, description="Epochs.")
    batch_size: int = Field(default=2, ge=1, description="Sequences per step.")
    micro_batch_size: int | None = Field(default=None, ge=1, description="Sequences per forward/backward; None: batch_size.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    warmup_ratio: float | None = Field(
        default=None, ge=0, lt=1, description="Instead of warmup_steps: warm-up over this fraction of the run's "
        "optimizer steps, rounded up (ARBOR B.2 and RubricEM F.1.1: 0.1); None or 0 keeps warmup_steps.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", description="After the warm-up: constant, or cosine decay to 0 at the last optimizer "
        "step (transformers' get_cosine_schedule_with_warmup, which LLaMA-Factory, the SFT framework of ARBOR B.2 "
        "and RubricEM F.1.1, uses; its warm-up starts at 0 rather than at lr / warmup).")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = Field(
        default="token_mean", description="Aggregation of the masked cross-entropy."
    )
    max_length: int = Field(default=2048, ge=16, description="Tokens per training row (longer rows are cut at the right).")
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute decoder activations in the backward pass: the same gradients, less "
        "memory for long rows (a scaffold episode), about a third more step time.")
    checkpoint_min_tokens: int = _checkpoint_min_tokens()
    checkpoint_every: int = Field(default=0, ge=0, description="Optimizer steps between checkpoints (0: at the end only).")
    int8_base: bool = Field(
        default=False, description="As grpo.int8_base: the frozen base's matmuls in int8 (CPU, LoRA only). Left out "
        "of dumps (and so of the stage's key) while off.")
    fused_lora: bool = Field(
        default=True, description="As grpo.fused_lora: the LoRA linears' leaner forward (bit for bit peft's when "
        "lora.alpha / lora.r is a power of two, as here). Not keyed.")
    prefix_packing: bool = Field(
        default=False, description="Each micro-batch as one shared-prefix pack (as grpo.prefix_packing): no padding, "
        "and a history two rows share computed once; the same loss to float rounding (perf/bench_sft_step.py). Off "
        "by default because the locked warm starts were trained padded. Not keyed; left out of dumps while off.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many optimizer steps (None: `epochs` passes).")
    samples_per_question: int = Field(default=2, ge=1, description="Teacher trajectories per question.")
    min_f1: float = Field(default=1.0, ge=0, le=1, description="Rejection sampling keeps trajectories at or above this F1.")
    n_worlds: int = Field(
        default=4, ge=0, description="sft_data: training worlds, generated with seeds seed+1 .. seed+n_worlds (never the "
        "evaluation world's seed)."
    )
    n_oracle: int = Field(default=200, ge=0, description="sft_data: oracle trajectories, spread evenly over the training worlds.")
    n_teacher_questions: int = Field(
        default=2, ge=0, description="sft_data: questions the teacher role answers (world: training worlds' questions; "
        "benchmarks: the train split)."
    )
    teacher_temperature: float = Field(
        default=0.7, ge=0, le=2, description="sft_data: temperature of teacher samples after the first (greedy) one."
    )
    reflection_rows: dict[str, int] = Field(
        default_factory=dict, description="sft_data: warm start (methods entry) -> attempts the teacher reflects on in "
        "the reflection meta-policy's format (components/methods/rubricem/warmstart_reflections.py); each valid reflection is one more "
        "SFT row. A policy that cannot write that format gives the meta-policy nothing to learn from.")

    @model_serializer(mode="wrap")
    def _int8_keyed_when_set(self, handler):
        return drop_when_off(drop_when_off(handler(self), self, "int8_base"), self, "prefix_packing")
