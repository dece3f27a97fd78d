"""Stop Prefect temporary servers whose flow process is gone.

A flow run without ``PREFECT_API_URL`` starts a temporary Prefect server (uvicorn) as a child process and stops
it when the run ends. A run killed with SIGKILL (or by the OOM killer) cannot, and its server lives on, about
200 MB each, until someone kills it. Importing ``tasks`` marks the process: ``OWNER_VAR`` holds its pid and
start time, which a server it starts inherits. ``run_stage`` calls ``reap_orphaned_servers`` before every stage
or flow: a temporary server whose owner is no longer running (the pid is gone or now belongs to a process that
started later) gets SIGTERM. Servers of runs still going, servers started by ``prefect server start`` and
anything not marked are left alone. Linux only (it reads /proc); elsewhere it does nothing.

    python -c "from tasks.temporary_servers import reap_orphaned_servers; print(reap_orphaned_servers())"
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

OWNER_VAR = "RUBRICFLOW_PREFECT_OWNER"
SERVER_APP = "prefect.server.api.server:create_app"
PROC = Path("/proc")


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # the fields after "pid (comm)" start at field 3


def mark_owner() -> None:
    """Mark this process as the owner of any temporary server it starts (children inherit the variable)."""
    started = start_time(os.getpid())
    if started is not None:
        os.environ[OWNER_VAR] = f"{os.getpid()}:{started}"


def _environ(entry: Path) -> dict[str, str]:
    raw = (entry / "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def orphaned_servers() -> list[int]:
    """Pids of temporary Prefect servers marked with an owner that is no longer running."""
    if not PROC.is_dir():
        return []
    orphans = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if SERVER_APP not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            mark = _environ(entry).get(OWNER_VAR)
        except OSError:  # gone meanwhile, or another user's process
            continue
        if not mark or ":" not in mark:
            continue
        owner, _, started = mark.partition(":")
        if owner.isdigit() and start_time(int(owner)) != started:
            orphans.append(int(entry.name))
    return sorted(orphans)


def reap_orphaned_servers() -> list[int]:
    """SIGTERM every orphaned temporary server; returns their pids."""
    reaped = []
    for pid in orphaned_servers():
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
        reaped.append(pid)
    return reaped
