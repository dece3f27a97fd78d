"""Process memory between the phases of a training step: hand freed heap back to the OS, and report peaks.

On CPU, torch frees tensors into glibc's heap, which keeps the pages: a step that allocates a few GB of
activations in its update leaves the process that much bigger for the next rollout, and two models in one
process (ARCO's policy and mu) grow until the kernel kills the run. :func:`release` collects cycles and asks
glibc to return free pages (``malloc_trim``); the trim is a no-op where glibc is absent (macOS, musl).

A full collection costs 0.2-0.5 s in a process that imported torch and transformers, and more in a long-lived
one (the test suite): after a phase that grew the resident set by less than ``min_growth_gb`` since the last
release (a tiny model's step) :func:`release` does nothing.

    from components.training.speed.process_memory import release, peak_rss_gb
    release()                      # after a phase that allocated a lot
    release(min_growth_gb=0)       # always (a finished run)
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


_baseline_gb = 0.0  # the resident set after the last release, lowered when it shrinks in between


def release(min_growth_gb: float = 0.25) -> bool:
    """Garbage-collect, then return glibc's free heap pages to the OS; True if the trim ran. Skipped (False)
    while the resident set is less than ``min_growth_gb`` above what it was after the last release."""
    global _baseline_gb
    now = rss_gb()
    if now is not None and min_growth_gb > 0 and now - _baseline_gb < min_growth_gb:
        _baseline_gb = min(_baseline_gb, now)
        return False
    gc.collect()
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)
    _baseline_gb = rss_gb() or 0.0
    return lib is not None


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
