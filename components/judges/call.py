"""One way to make a judgment call: a counted LLM call whose reply is parsed, or a failure counted as such.

    tally = Tally()
    verdict = await tally.ask(judge, messages, Sampling(temperature=0.0), parse=parse_winner)
    # None when the call failed after the middleware's retries or the reply did not parse; never a score
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from components.llm.base import ChatModel, Message, Sampling

__all__ = ["Tally"]

T = TypeVar("T")


@dataclass
class Tally:
    """A caller's own count of its LLM calls (the middleware counts per role; this counts per step)."""

    calls: int = 0
    failures: int = 0  # the call failed after retries
    unparsed: int = 0  # the call returned something that is not a valid reply
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, outcome: Any) -> None:
        self.calls += 1
        if getattr(outcome, "ok", False):
            self.prompt_tokens += outcome.prompt_tokens
            self.completion_tokens += outcome.completion_tokens
        else:
            self.failures += 1

    async def ask(self, model: ChatModel, messages: list[Message], sampling: Sampling,
                  parse: Callable[[str], T | None]) -> T | None:
        """One counted call: ``parse`` of the reply, or None when the call failed (after the middleware's
        retries) or ``parse`` rejected the reply (counted as unparsed)."""
        outcome = await model.chat(messages, sampling)
        self.add(outcome)
        if not outcome.ok:
            return None
        parsed = parse(outcome.text)
        if parsed is None:
            self.unparsed += 1
        return parsed

    def merge(self, other: Tally) -> None:
        for name in ("calls", "failures", "unparsed", "prompt_tokens", "completion_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
