"""Process memory between the phases of a training step: hand freed heap back to the OS, and report peaks.

On CPU, torch frees tensors into glibc's heap, which keeps the pages: a step that allocates a few GB of
activations in its update leaves the process that much bigger for the next rollout, and two models in one
process (ARCO's policy and mu) grow until the kernel kills the run. :func:`release` collects cycles and asks
glibc to return free pages (``malloc_trim``); it is a no-op where glibc is absent (macOS, musl).

    from components.training.memory import release, peak_rss_gb
    release()                      # after a phase that allocated a lot
    print(peak_rss_gb())           # this process's high-water mark so far
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import resource
import sys

__all__ = ["peak_rss_gb", "release", "rss_gb"]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.malloc_trim  # noqa: B018 - absent outside glibc
    except (OSError, AttributeError):
        return None
    return lib


def release() -> bool:
    """Garbage-collect, then return glibc's free heap pages to the OS; True if the trim ran."""
    gc.collect()
    lib = _libc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True


def rss_gb() -> float | None:
    """This process's resident set now, in GB (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize() / 1e9


def peak_rss_gb() -> float:
    """This process's peak resident set so far, in GB (ru_maxrss is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1e9 if sys.platform == "darwin" else 1e6)
