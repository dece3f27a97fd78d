"""release() hands freed heap back to the OS; the RSS readings are this process's."""

import sys

import pytest

from components.training.speed import process_memory as memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or memory._libc() is None,
                                reason="malloc_trim is glibc's")


def test_release_returns_fragmented_heap_to_the_os():
    blocks = [bytearray(100_000) for _ in range(3000)]  # ~300 MB below the mmap threshold: on the heap
    for b in blocks:
        b[::4096] = b"\1" * len(b[::4096])  # touch every page so it is resident
    keep = blocks[::8]  # survivors pin the heap so free() alone cannot shrink it
    del blocks
    import gc

    gc.collect()
    before = memory.rss_gb()
    assert memory.release(min_growth_gb=0) is True
    after = memory.rss_gb()
    assert before - after > 0.15, (before, after)
    assert len(keep) == 375


def test_peak_is_at_least_what_the_process_ever_held():
    held = bytearray(200_000_000)
    held[::4096] = b"\1" * len(held[::4096])
    assert memory.peak_rss_gb() >= 0.2
    assert memory.rss_gb() >= 0.2


def test_release_skips_the_collection_until_the_process_has_grown():
    import gc

    memory.release(min_growth_gb=0)  # the baseline: what the process holds now
    collections = gc.get_stats()[2]["collections"]
    assert memory.release() is False  # nothing grew: no full collection (0.2-0.5 s with torch imported)
    assert gc.get_stats()[2]["collections"] == collections
    grown = bytearray(400_000_000)
    grown[::4096] = b"\1" * len(grown[::4096])
    assert memory.release() is True and gc.get_stats()[2]["collections"] == collections + 1
    del grown
