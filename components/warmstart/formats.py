"""The turn formats a warm start can be written in: how the oracle's planned turns become an agent's replies,
and what rejection sampling checks of that agent's turns. ReAct's format is registered in ``rejection``; a
method whose agent has its own format registers it from its package (RubricEM's scaffold does).

    FORMATS.register("scaffold")(WarmStartFormat(replies=scaffold_replies, problems=scaffold_rejections))
    warm_start_format("react").replies(question, turns)   # the oracle's ReAct turns, as written
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from components.method_registry import load_methods
from components.registry import Registry
from components.schemas import Question, Trajectory


@dataclass(frozen=True)
class WarmStartFormat:
    replies: Callable[[Question, Sequence[Any]], list[str]]  # the oracle's planned turns -> the agent's replies
    problems: Callable[[Trajectory], list[tuple[str, str]]]  # (reason, detail) for every turn-format problem


FORMATS: Registry[WarmStartFormat] = Registry("warm-start format")


def warm_start_format(agent: str) -> WarmStartFormat:
    """The format registered for ``agent``, after every method has registered its own."""
    if agent not in FORMATS:
        load_methods()
    if agent not in FORMATS:
        raise ValueError(f"a warm start is written in one of the formats {FORMATS.names()}, not {agent!r}")
    return FORMATS.get(agent)
