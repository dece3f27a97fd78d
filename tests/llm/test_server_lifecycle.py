"""A model server started by a process that is killed does not outlive it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

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
