"""llama.cpp's native ``llama-server`` on 127.0.0.1: parallel slots, continuous batching, a LoRA adapter.

``scripts/setup.sh`` builds it from the llama.cpp source vendored in the pinned llama-cpp-python sdist
into ``.venv/bin/llama-server`` (``$RUBRICFLOW_LLAMA_SERVER`` overrides the path). It serves the OpenAI
API at ``/v1`` (the ``openai`` backend uses it with ``server: native``) and llama.cpp's own
``/completion`` with token-id prompts, which :mod:`components.training.engines.llamacpp` uses. Unlike
llama-cpp-python's server it decodes ``parallel`` requests at once. Adapters load at start-up only, so
a new adapter means a restart (:meth:`NativeLlamaServer.restart`, about a second for the 0.5B).

    with NativeLlamaServer(ensure_gguf("qwen2.5-coder-0.5b-instruct"), parallel=4, lora="a.gguf") as s:
        print(s.base_url)      # http://127.0.0.1:<free port>/v1
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from components.embedded.server import LlamaServer

__all__ = ["NativeLlamaServer", "NativeServerMissing", "llama_server_binary"]


class NativeServerMissing(FileNotFoundError):
    """The native llama-server binary is not built."""


def llama_server_binary() -> Path:
    """Path of the native ``llama-server``: ``$RUBRICFLOW_LLAMA_SERVER``, else ``<venv>/bin/llama-server``."""
    override = os.environ.get("RUBRICFLOW_LLAMA_SERVER")
    path = Path(override) if override else Path(sys.prefix) / "bin" / "llama-server"
    if not (path.is_file() and os.access(path, os.X_OK)):
        origin = "$RUBRICFLOW_LLAMA_SERVER" if override else "the virtual environment"
        raise NativeServerMissing(
            f"llama.cpp's native server is not at {path} ({origin}); build it with `bash scripts/setup.sh`"
        )
    return path


def _adapters(lora: str | Path | Sequence[str | Path] | None) -> tuple[Path, ...]:
    if lora is None:
        return ()
    if isinstance(lora, (str, Path)):
        return (Path(lora),)
    return tuple(Path(p) for p in lora)


class NativeLlamaServer(LlamaServer):
    """``llama-server`` for one GGUF model with ``parallel`` slots of ``n_ctx`` tokens each and optional
    LoRA adapters (llama.cpp LoRA GGUFs; see :mod:`components.embedded.lora_gguf`). Several adapters are
    applied together at scale 1, which equals serving the base with all of them merged (LoRA deltas add):
    how a policy trained as an RL adapter over a merged warm-start adapter is served."""

    def __init__(self, model_path: str | Path, alias: str | None = None, n_ctx: int = 4096, threads: int = 2,
                 parallel: int = 4, lora: str | Path | Sequence[str | Path] | None = None,
                 startup_timeout_s: float = 120.0,
                 extra_args: tuple[str, ...] = ()):
        super().__init__(model_path, alias=alias, n_ctx=n_ctx, threads=threads, startup_timeout_s=startup_timeout_s)
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        self.parallel, self.extra_args = parallel, tuple(extra_args)
        self.loras = _adapters(lora)
        self.binary = llama_server_binary()

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.binary), "--model", str(self.model_path), "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            # one KV pool split evenly: each slot holds n_ctx tokens
            "--ctx-size", str(self.n_ctx * self.parallel), "--parallel", str(self.parallel), "--cont-batching",
            "--threads", str(self.threads), "--threads-batch", str(self.threads),
        ]
        for lora in self.loras:
            if not lora.is_file():
                raise FileNotFoundError(f"LoRA adapter GGUF {lora} does not exist")
            cmd += ["--lora", str(lora)]
        return cmd + list(self.extra_args)

    LOG_PREFIX, NAME, POLL_S = "llama-native-", "llama-server", 0.1

    @property
    def health_url(self) -> str:
        return f"{self.root_url}/health"

    @property
    def lora(self) -> Path | None:
        """The last adapter (the one a trainer swaps), None when serving the base."""
        return self.loras[-1] if self.loras else None

    def restart(self, lora: str | Path | Sequence[str | Path] | None) -> float:
        """Serve ``lora`` (one adapter or several; None: the base model) from now on; returns the seconds
        the swap took. The port changes: read ``base_url`` / ``root_url`` again afterwards."""
        started = time.perf_counter()
        self.stop()
        self.loras = _adapters(lora)
        self.start()
        return time.perf_counter() - started

    def __enter__(self) -> Self:
        return self.start()
