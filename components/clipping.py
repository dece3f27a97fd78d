"""Cutting long text to a character budget with a visible mark: the one home for every prompt that shows an
observation, a trajectory or a stage only in part (judges, the council, the agents' tools, reflection).

    clip("a long observation ...", 300)                        # first 300 characters, then " [...]"
    clip(text, 2000, " ...[truncated]", marker_within=True)    # at most 2000 characters, the mark included
    clip_middle(trajectory, 4000)                              # first and last 2000 characters around "\\n[...]\\n"

Text within the budget comes back unchanged. Each caller keeps its own mark, since a trained policy has seen
its mark in every prompt and a different one would change what it reads.
"""

from __future__ import annotations

__all__ = ["clip", "clip_middle"]


def clip(text: str, limit: int, marker: str = " [...]", *, marker_within: bool = False) -> str:
    """The first ``limit`` characters of ``text`` (trailing whitespace dropped) followed by ``marker`` when the
    text is longer than ``limit``; with ``marker_within`` the result, mark included, is at most ``limit`` long."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(marker), 0) if marker_within else limit
    return text[:keep].rstrip() + marker


def clip_middle(text: str, limit: int, marker: str = "\n[...]\n") -> str:
    """The first and the last ``limit // 2`` characters of ``text`` around ``marker`` when it is longer than
    ``limit``: the beginning says what was asked, the end how it went."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + marker + (text[-half:] if half else "")
