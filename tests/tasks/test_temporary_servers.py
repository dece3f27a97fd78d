"""Temporary Prefect servers of killed runs: a real owner process is SIGKILLed and its stand-in server (a
process whose command line names Prefect's server app) is found and stopped; servers of live owners and
unmarked ones are left alone."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.temporary_servers import OWNER_VAR, SERVER_APP, orphaned_servers, reap_orphaned_servers, start_time

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)", SERVER_APP]
OWNER = f"""
import subprocess, sys, time
import tasks  # marks this process as the owner
server = subprocess.Popen({SLEEPER!r})
print(server.pid, flush=True)
time.sleep(120)
"""


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def exec_done(pid: int) -> bool:
    """The stand-in runs its own program: until its exec, /proc shows an empty command line and no marked
    environment (a parent's Popen can return before that on a busy machine)."""
    try:
        return SERVER_APP.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_until(condition, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_killed_owners_server_is_stopped_and_live_or_unmarked_ones_are_not(repo_root):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, cwd=repo_root)
    server = None
    env = {k: v for k, v in os.environ.items() if k != OWNER_VAR}
    unmarked = subprocess.Popen(SLEEPER, env=env)
    try:
        server = int(owner.stdout.readline())
        assert wait_until(lambda: exec_done(server) and exec_done(unmarked.pid))
        assert server not in orphaned_servers() and unmarked.pid not in orphaned_servers()  # its owner is alive
        owner.kill()
        owner.wait()
        assert server in orphaned_servers() and unmarked.pid not in orphaned_servers()
        assert server in reap_orphaned_servers()
        assert wait_until(lambda: not running(server))
        assert running(unmarked.pid)
    finally:  # a stand-in left running would be reaped, with a message, by the next stage a later test runs
        owner.kill()
        unmarked.kill()
        unmarked.wait()
        if server is not None and running(server):
            os.kill(server, signal.SIGKILL)


def test_start_time_tells_a_recycled_pid_from_its_owner():
    me = start_time(os.getpid())
    assert me is not None and me.isdigit()
    assert start_time(os.getpid()) == me
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert start_time(child.pid) is None or start_time(child.pid) != me
