"""A model server started by a process that is killed does not outlive it; servers wait passively (OpenMP)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from components.embedded.native_server import NativeLlamaServer
from components.embedded.server import LlamaServer
from tests.conftest import requires_embedded


@requires_embedded
def test_server_dies_with_a_killed_parent(repo_root, tmp_path):
    pid_file = tmp_path / "server.pid"
    script = textwrap.dedent(f"""
        import time
        from components.embedded.models import ensure_gguf
        from components.embedded.server import LlamaServer
        server = LlamaServer(ensure_gguf("qwen2.5-coder-0.5b-instruct", {str(repo_root / '.cache')!r}), n_ctx=512).start()
        open({str(pid_file)!r}, "w").write(str(server.proc.pid))
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=repo_root)
    deadline = time.time() + 120
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.5)
    server_pid = int(pid_file.read_text())
    os.kill(server_pid, 0)  # alive
    parent.send_signal(signal.SIGKILL)  # no cleanup code of the parent runs
    parent.wait()
    for _ in range(40):
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.25)
    os.kill(server_pid, signal.SIGKILL)
    raise AssertionError("the model server outlived its killed parent")


@pytest.mark.parametrize("native", [False, True])
def test_servers_wait_passively_unless_the_user_says_otherwise(native, tmp_path, monkeypatch):
    # spinning OpenMP waits made three servers decoding at once on 2 cores 4.5x slower (perf/bench_server_threads.py)
    binary = tmp_path / "llama-server"
    binary.write_text("")
    binary.chmod(0o755)
    monkeypatch.setenv("RUBRICFLOW_LLAMA_SERVER", str(binary))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    cls = NativeLlamaServer if native else LlamaServer
    assert cls(tmp_path / "m.gguf").environment()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert cls(tmp_path / "m.gguf").environment()["OMP_WAIT_POLICY"] == "ACTIVE"
