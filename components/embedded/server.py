"""Run llama.cpp's OpenAI-compatible server for an embedded GGUF model on 127.0.0.1.

The ``openai`` backend then talks to it over HTTP, exactly as it talks to vLLM in production.

    with LlamaServer(ensure_gguf("qwen2.5-coder-0.5b-instruct"), alias="qwen") as server:
        print(server.base_url)      # http://127.0.0.1:<free port>/v1
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import httpx


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message carries the tail of its log."""


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM us when the parent dies, so a killed pipeline never
    leaves a model server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the atexit hook still stops the server on a normal exit


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, model_path: str | Path, alias: str | None = None, n_ctx: int = 4096, threads: int = 2,
                 startup_timeout_s: float = 180.0):
        self.model_path = Path(model_path)
        self.alias = alias or self.model_path.stem
        self.n_ctx, self.threads, self.startup_timeout_s = n_ctx, threads, startup_timeout_s
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.log_path: Path | None = None  # set by a subclass that keeps its log (appended to), else a temporary one

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-2000:]

    # what a subclass running another server binary overrides
    LOG_PREFIX, NAME, POLL_S = "llama-server-", "llama.cpp server", 0.3

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
        ]

    def environment(self) -> dict[str, str]:
        # Passive OpenMP waits: with spinning threads (the default) a server sharing its cores with other busy
        # servers decodes several times slower (perf/bench_server_threads.py: three servers at once, 2 threads
        # each, 4.5x the tokens/s with passive waits; ~25% slower alone). Also what llama-server gets.
        return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}

    @property
    def health_url(self) -> str:
        return f"{self.base_url}/models"

    def pick_port(self) -> int:
        """The port a start listens on: a free loopback one (a subclass may fix it)."""
        return free_port()

    def start(self) -> Self:
        """Start the server on a free loopback port and wait until it answers; ServerStartError (with the
        log's tail) when it exits or does not answer within ``startup_timeout_s``."""
        self.port = self.pick_port()
        cmd = self.command()
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("a+")
        else:
            self._log = tempfile.NamedTemporaryFile("w+", prefix=self.LOG_PREFIX, suffix=".log", delete=False)  # noqa: SIM115 - open for the server's lifetime
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.environment(),
                                     start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        atexit.unregister(self.stop)  # restarts would otherwise pile up exit hooks
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"{self.NAME} exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                if httpx.get(self.health_url, timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(self.POLL_S)
        self.stop()
        raise ServerStartError(f"{self.NAME} did not answer within {self.startup_timeout_s}s:\n{self._log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc = None
        if self._log is not None:
            self._log.close()
            if self.log_path is None:
                Path(self._log.name).unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
