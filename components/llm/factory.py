"""Build the role-bound models of a run from ``params.llm``.

One backend instance and one ``ConcurrencyLimit`` per backend name (so roles bound to the same server share
its connections and its slots: ``llm.backends.NAME.max_concurrency``, else ``llm.middleware.max_concurrency``),
one middleware wrapper per role (so accounting is per role, and so is ``llm.scoring``: how the role's choice
judgments are scored, components/judges/call.py). Embedded backends start llama.cpp's server on
first use (``server: vllm``: a managed ``vllm serve``); an ``hf`` backend with ``lora`` merges its adapters into its
in-process weights; ``close()`` closes every backend's connections and stops the servers.

    with LLMPool(params) as pool:
        judge = pool.role("answer_judge")              # ReliableChatModel
        council = pool.roles("council_judges")         # list, one per bound backend
        print(pool.slots("policy", "council_judges"))  # requests these roles' backends serve at once
        print(pool.accounting.metrics())

``record_path`` puts a stage's response record (components/llm/response_record.py, tracked by DVC) in front of
the machine-wide response cache: what `dvc repro` replays.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from components.adapters import whole_model_digest
from components.llm import backends  # noqa: F401  (registers the backends)
from components.llm.accounting import Accounting
from components.llm.base import BACKENDS, ChatModel, PermanentLLMError
from components.llm.middleware import ConcurrencyLimit, ReliableChatModel, ResponseCache
from components.llm.params import BackendParams
from components.llm.response_record import RecordedCache, ResponseRecord
from components.params import Params


class LLMPool:
    def __init__(self, params: Params, *, accounting: Accounting | None = None,
                 overrides: dict[str, ChatModel] | None = None, cache_path: str | Path | None = None,
                 record_path: str | Path | None = None):
        self.params = params
        self.accounting = accounting or Accounting()
        self._overrides = dict(overrides or {})
        self._backends: dict[str, ChatModel] = {}
        self._limits: dict[str, ConcurrencyLimit] = {}
        self._servers: list = []
        self._closing: set[asyncio.Task] = set()
        mw = params.llm.middleware
        path = cache_path or Path(params.run.cache_dir) / "llm_responses.sqlite"
        self.cache = ResponseCache(path) if mw.cache else None
        if self.cache is not None and record_path is not None:  # the stage's DVC-tracked answers in front
            self.cache = RecordedCache(ResponseRecord(record_path), self.cache)

    # -- backends -------------------------------------------------------------------------------------
    def backend(self, name: str) -> ChatModel:
        if name in self._overrides:
            return self._overrides[name]
        if name not in self._backends:
            if name not in self.params.llm.backends:
                raise KeyError(f"unknown backend {name!r}; known: {sorted(self.params.llm.backends)}")
            self._backends[name] = self._build(name, self.params.llm.backends[name])
        return self._backends[name]

    def _build(self, name: str, cfg: BackendParams) -> ChatModel:
        if cfg.type == "scripted":
            raise PermanentLLMError(
                f"backend {name!r}: 'scripted' is for unit tests only; inject it with LLMPool(overrides=...)"
            )
        cls = BACKENDS.get(cfg.type)
        cache_dir = self.params.run.cache_dir
        sha = None
        if cfg.embedded:
            from components.embedded.models import embedded_sha, ensure_gguf
            sha = embedded_sha(cfg.embedded)
        if cfg.type == "openai":
            base_url, json_format = cfg.base_url, cfg.options.get("json_format", "json_schema")
            if cfg.server == "vllm" and not base_url:  # a managed `vllm serve` (components/llm/backends/vllm_serve.py)
                from components.llm.backends.vllm_serve import served_backend, shared

                server, sha = served_backend(name, cfg, self.params, sha)
                base_url = shared(server).base_url  # one per configuration for the process: not stopped with the pool
            elif cfg.embedded and not base_url:
                gguf = ensure_gguf(cfg.embedded, cache_dir)
                if cfg.server == "native":
                    from components.embedded.lora_gguf import ensure_lora_gguf
                    from components.embedded.models import sha256_file
                    from components.embedded.native_server import NativeLlamaServer
                    lora = [ensure_lora_gguf(a, cache_dir) for a in cfg.adapters]
                    if lora:  # the response cache keys on identity: a new adapter must change it
                        sha = sha256_file(lora[0]) if len(lora) == 1 else hashlib.sha256(
                            "+".join(sha256_file(p) for p in lora).encode()).hexdigest()
                    if lora and cfg.merge_lora:  # merged weights decode differently in the last bits
                        from components.embedded.lora_merge import ensure_merged_gguf
                        gguf, lora = ensure_merged_gguf(gguf, lora, cache_dir), []
                        sha = hashlib.sha256(f"merged:{sha}".encode()).hexdigest()
                    server = NativeLlamaServer(gguf, alias=cfg.model or cfg.embedded, n_ctx=cfg.n_ctx,
                                               threads=cfg.threads, parallel=cfg.parallel, lora=lora).start()
                else:
                    from components.embedded.server import LlamaServer
                    server = LlamaServer(gguf, alias=cfg.model or cfg.embedded, n_ctx=cfg.n_ctx,
                                         threads=cfg.threads).start()
                self._servers.append(server)
                base_url, json_format = server.base_url, "json_object"
            model = cls(model=cfg.model or cfg.embedded, base_url=base_url, api_key_env=cfg.api_key_env,
                        supports_n=cfg.supports_n, json_format=json_format)
        elif cfg.type == "gemini":
            model = cls(model=cfg.model, api_key_env=cfg.api_key_env)
        elif cfg.type == "hf":
            if cfg.embedded:
                from components.embedded.models import load_hf_policy
                hf_model, tok = load_hf_policy(cfg.embedded, cache_dir)
                model = cls(hf_model, tok, name=cfg.model or cfg.embedded)
            else:
                model = cls.from_pretrained(cfg.model, gguf_file=cfg.options.get("gguf_file"))
                sha = whole_model_digest(cfg.model)  # a model trained at this path (the lab's): keyed by its weights
            if cfg.adapters:  # merged in process, in order (an RL adapter over its warm start's)
                from peft import PeftModel

                sha = _with_adapters(name, sha or cfg.model, cfg.adapters)
                for adapter in cfg.adapters:
                    model.model = PeftModel.from_pretrained(model.model, adapter).merge_and_unload()
                model.model.eval()
        elif cfg.type == "llamacpp":
            path = ensure_gguf(cfg.embedded, cache_dir) if cfg.embedded else cfg.options["model_path"]
            model = cls(model_path=str(path), n_ctx=cfg.n_ctx, threads=cfg.threads, name=cfg.model or None)
        elif hasattr(cls, "from_params"):  # a backend that reads its settings from the run's params (simulated)
            model = cls.from_params(self.params, name=cfg.model or name, options=cfg.options)
        else:
            model = cls(model=cfg.model, **cfg.options)
            if cfg.type == "vllm" and cfg.adapters:  # vLLM applies one LoRA per request over its base
                if len(cfg.adapters) > 1:
                    raise PermanentLLMError(f"backend {name!r}: vLLM serves one LoRA over its base; merge"
                                            " the others into the base folder "
                                            "(components/training/engines/vllm_base.py)")
                sha = _with_adapters(name, sha or cfg.model, cfg.adapters)
                model.set_adapter(str(cfg.adapters[0]))
            if cfg.type == "vllm":
                self._servers.append(model)  # its engine is freed with the pool, as a server it started is stopped
        if sha:
            model.identity = f"{model.name}@{sha[:16]}"
        return model

    def limit(self, name: str) -> ConcurrencyLimit:
        """The one concurrency limit of backend ``name``, shared by every role bound to it."""
        if name not in self._limits:
            cfg = self.params.llm.backends.get(name)
            own = cfg.max_concurrency if cfg is not None else None
            if own is None and cfg is not None and cfg.server == "native" and not cfg.base_url:
                own = cfg.parallel  # a native server we start decodes `parallel` requests at once
            self._limits[name] = ConcurrencyLimit(own or self.params.llm.middleware.max_concurrency)
        return self._limits[name]

    def slots(self, *roles: str) -> int:
        """How many requests the backends bound to ``roles`` serve at once, all together (each backend once)."""
        names = {name for role in roles for name in self._bound(role)}
        return sum(self.limit(name).limit for name in names)

    # -- roles ------------------------------------------------------------------------------------------
    def _bound(self, role: str) -> list[str]:
        if role not in self.params.llm.roles:
            raise KeyError(f"role {role!r} is not bound in params.llm.roles; known: {sorted(self.params.llm.roles)}")
        bound = self.params.llm.roles[role]
        return [bound] if isinstance(bound, str) else list(bound)

    def _wrap(self, role: str, backend_name: str) -> ReliableChatModel:
        cfg = self.params.llm.backends.get(backend_name)
        mw = self.params.llm.middleware
        return ReliableChatModel(
            self.backend(backend_name), role=role, settings=mw, cache=self.cache, accounting=self.accounting,
            price_prompt_per_1k=cfg.price_prompt_per_1k if cfg else 0.0,
            price_completion_per_1k=cfg.price_completion_per_1k if cfg else 0.0, limit=self.limit(backend_name),
            scoring=self.params.llm.scoring.get(role.split("[")[0], "text"),  # a council member: its role's
        )

    def role(self, role: str) -> ReliableChatModel:
        names = self._bound(role)
        if len(names) != 1:
            raise KeyError(f"role {role!r} binds {len(names)} backends; use roles({role!r})")
        return self._wrap(role, names[0])

    def roles(self, role: str) -> list[ReliableChatModel]:
        names = self._bound(role)
        return [self._wrap(f"{role}[{i}]", name) for i, name in enumerate(names)]

    async def aclose(self) -> None:
        """Close every backend's connections, from inside the event loop that used them; the pool stays usable
        (a later call opens new ones)."""
        await asyncio.gather(*(model.aclose() for model in self._backends.values()))

    def close(self) -> None:
        """Close every backend's connections, stop the embedded servers and the response cache. Works outside
        an event loop and from synchronous code running inside one (the closing then finishes on that loop
        as soon as the caller yields to it)."""
        models = list(self._backends.values())
        self._backends.clear()

        async def close_all() -> None:
            await asyncio.gather(*(model.aclose() for model in models))

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        try:
            if loop is None:
                asyncio.run(close_all())
            else:
                task = loop.create_task(close_all())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        finally:
            for server in self._servers:
                server.stop()
            self._servers.clear()
            if self.cache is not None:
                self.cache.close()

    def __enter__(self) -> LLMPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _with_adapters(name: str, base: str, adapters: list[str]) -> str:
    """The identity (response-cache key part) of ``base`` with ``adapters`` applied in order; a missing adapter is
    a permanent error naming the backend."""
    from components.adapters import adapter_digest

    digests = [adapter_digest(a) for a in adapters]
    for adapter, digest in zip(adapters, digests, strict=True):
        if digest is None:
            raise PermanentLLMError(f"backend {name!r}: adapter {adapter} does not exist")
    return hashlib.sha256("+".join([base, *digests]).encode()).hexdigest()
