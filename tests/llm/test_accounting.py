"""The one accounting type, :class:`components.llm.accounting.Tally`: a judgment asked through the middleware is
counted once in the role's tally and once in the caller's (the same type), a retried call counts one call and one
retry, a failed call one failure of its type; the role's metric names are those logged before the merge. Under a
second.

    .venv/bin/python -m pytest -q tests/llm/test_accounting.py
"""

from __future__ import annotations

import asyncio
from collections import Counter

from components.judges.call import JudgeCall, Tally, ask
from components.llm.accounting import Accounting
from components.llm.base import ChatModel, Completion, PermanentLLMError, Sampling, TransientLLMError, user
from components.llm.middleware import ReliableChatModel
from components.llm.params import MiddlewareParams


class Scripted(ChatModel):
    """Raises or answers from ``script`` in order, one entry per request."""

    name = "scripted"

    def __init__(self, script: list) -> None:
        self.script = list(script)

    async def _complete(self, messages, sampling) -> Completion:
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return Completion(texts=[step], model=self.name, prompt_tokens=7, completion_tokens=2)


def judged(script: list) -> tuple[ReliableChatModel, Accounting]:
    accounting = Accounting()
    settings = MiddlewareParams(max_attempts=3, cache=False, backoff_initial_s=0.0, backoff_jitter_s=0.0)
    model = ReliableChatModel(Scripted(script), role="judge", settings=settings, accounting=accounting,
                              price_prompt_per_1k=1.0)
    return model, accounting


def verdict(text: str) -> str | None:
    return text if text in {"yes", "no"} else None


CALL = JudgeCall([user("Is it so?")], verdict, Sampling(temperature=0.0, max_tokens=4))


def test_a_judged_call_a_retry_and_a_failure_are_each_counted_once():
    model, accounting = judged([TransientLLMError("busy"), "yes", PermanentLLMError("bad key"), "maybe"])
    tally = Tally()

    async def three():
        return [await ask(model, CALL, tally) for _ in range(3)]

    answered, failed, unparsed = asyncio.run(three())
    assert answered.ok and answered.value == "yes"
    assert not failed.ok and failed.kind == "call_failed" and not unparsed.ok and unparsed.kind == "unparsed"
    role = accounting.roles["judge"]
    assert type(role) is type(tally) is Tally  # one type counts both
    assert (role.calls, role.successes, role.failures, role.retries) == (3, 2, 1, 1)
    assert role.failures_by_type == Counter({"PermanentLLMError": 1})
    assert (role.prompt_tokens, role.completion_tokens, role.cost) == (14, 4, 14 / 1000)
    assert (tally.calls, tally.failures, tally.unparsed, tally.failed, tally.retries) == (3, 1, 1, 2, 0)
    assert tally.tokens == role.tokens == 18
    assert tally.by_kind() == {"call_failed": 1, "unparsed": 1}


def test_the_role_metrics_keep_their_names_and_merge_adds_every_count():
    model, accounting = judged(["yes"])
    asyncio.run(ask(model, CALL, Tally()))
    metrics = accounting.metrics()
    assert sorted(metrics) == sorted(f"llm.judge.{k}" for k in (
        "calls", "successes", "failures", "retries", "cache_hits", "prompt_tokens", "completion_tokens", "cost",
        "latency_s", "failure_rate"))
    assert metrics["llm.judge.calls"] == 1.0 and metrics["llm.judge.failure_rate"] == 0.0
    accounting.roles["judge"].logprob_calls = 1  # a role that asked for probabilities reports them too
    assert {"llm.judge.logprob_calls", "llm.judge.scored_from_text"} <= set(accounting.metrics())

    total = Tally(calls=1, failures=1, failures_by_type=Counter({"TimeoutError": 1}), cost=0.5)
    total.merge(Tally(calls=2, retries=3, failures_by_type=Counter({"TimeoutError": 1}), cost=0.25, unparsed=1))
    assert (total.calls, total.failures, total.unparsed, total.retries, total.cost) == (3, 1, 1, 3, 0.75)
    assert total.failures_by_type == Counter({"TimeoutError": 2})
