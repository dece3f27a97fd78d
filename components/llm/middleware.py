"""Reliability middleware wrapped around every backend.

``ReliableChatModel(inner, role=..., settings=..., limit=...)`` adds, per call:
- bounded concurrency: a ``ConcurrencyLimit`` per backend, shared by every role bound to it (``LLMPool``
  hands the same one to each wrapper); a request holds one slot, and a backend that cannot return ``n``
  samples in one request splits the call (``inner.split`` / ``inner.join``) into requests of a slot each,
- a per-attempt timeout that starts once the attempt holds a slot (queueing never times a call out),
- retries with exponential backoff plus jitter on transient errors only (tenacity),
- a persistent response cache (sqlite, key = sha256 of model + messages + sampling, the seed only when
  sampling at temperature > 0, the log-probability options only when asked for), used only for deterministic
  calls (temperature 0 or seeded); a cached completion keeps its log-probabilities,
- accounting per role in a :class:`~components.llm.accounting.Tally`: calls, failures by type, retries, cache
  hits, tokens, cost, latency; for a role whose judgments ask for log-probabilities also how many calls asked,
  how many came back without them, and how many judgments were scored from probabilities or fell back to the
  text (``llm.<role>.logprob_*``, ``llm.<role>.scored_from_*``, absent for roles that never ask).
A call that still fails comes back as a ``ChatFailure`` and is counted; nothing is raised.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path

from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from components.llm.accounting import Accounting
from components.llm.base import (
    ChatFailure, ChatModel, ChatOutcome, ChatResult, Completion, Message, PolicyCall, Sampling, TransientLLMError,
)
from components.llm.params import MiddlewareParams


class ResponseCache:
    """sqlite-backed map from request hash to a successful completion."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        # the ranks of a data-parallel run open one cache at once: switching a new file to WAL takes no busy wait
        for attempt in Retrying(retry=retry_if_exception(lambda e: "locked" in str(e)), stop=stop_after_delay(60),
                                wait=wait_random(0.01, 0.2), reraise=True):
            with attempt:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT, created REAL)")

    # sampling options added after responses were first cached: in the key only once they differ from their
    # default, so the keys of requests that leave them alone (and the responses cached under them) stay valid
    KEYED_WHEN_SET = {"logprobs": False, "top_logprobs": 0}

    @staticmethod
    def key(model_identity: str, messages: list[Message], sampling: Sampling) -> str:
        """The request's hash. A greedy request's seed is left out: it picks nothing at temperature 0, so an
        evaluation repeated under another seed replays its greedy calls and samples only what is sampled."""
        exclude = {name for name, default in ResponseCache.KEYED_WHEN_SET.items() if getattr(sampling, name) == default}
        if sampling.temperature == 0:
            exclude.add("seed")
        payload = {
            "model": model_identity,
            "messages": [m.model_dump() for m in messages],
            "sampling": sampling.model_dump(mode="json", exclude=exclude or None),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        return Completion.model_validate_json(row[0]) if row else None

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?)", (key, completion.model_dump_json(), time.time())
            )

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()


class ConcurrencyLimit:
    """At most ``limit`` holders at once, served first come first served. Unlike ``asyncio.Semaphore`` it is
    bound to no event loop, so one instance serves successive ``asyncio.run()`` calls and loops in other
    threads alike.

        limit = ConcurrencyLimit(2)
        async with limit:
            ...
    """

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {limit}")
        self.limit = limit
        self.in_use = 0
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()

    async def __aenter__(self) -> ConcurrencyLimit:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.in_use < self.limit and not self._waiters:
                self.in_use += 1
                return self
            waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter[1]
        except BaseException:
            with self._lock:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued:  # the slot was handed over just as the wait was cancelled: pass it on
                self._release()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        self._release()

    def _release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(_wake, future)
                    return  # the slot passes straight to the waiter
                except RuntimeError:  # the waiter's loop has closed; nobody is waiting there any more
                    continue
            self.in_use -= 1


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class ReliableChatModel(ChatModel):
    def __init__(
        self,
        inner: ChatModel,
        *,
        role: str,
        settings: MiddlewareParams | None = None,
        cache: ResponseCache | None = None,
        accounting: Accounting | None = None,
        price_prompt_per_1k: float = 0.0,
        price_completion_per_1k: float = 0.0,
        limit: ConcurrencyLimit | None = None,
        scoring: str = "text",
    ):
        self.inner = inner
        self.role = role
        self.scoring = scoring  # how this role's choice judgments are scored (params llm.scoring)
        self.name = inner.name
        self.settings = settings or MiddlewareParams()
        self.cache = cache if self.settings.cache else None
        self.accounting = accounting or Accounting()
        self.stats = self.accounting.for_role(role)
        self.prices = (price_prompt_per_1k, price_completion_per_1k)
        self.limit = limit or ConcurrencyLimit(self.settings.max_concurrency)
        self._sleep = asyncio.sleep  # tests may replace it to observe backoff delays

    def cache_identity(self) -> str:
        return self.inner.cache_identity()

    def record_scoring(self, scored_from: str) -> None:
        self.stats.record_scoring(scored_from)

    def _count_logprobs(self, sampling: Sampling, completion: Completion) -> None:
        if sampling.logprobs:
            self.stats.logprob_calls += 1
            self.stats.logprob_missing += completion.logprobs is None

    def _requests(self, sampling: Sampling) -> list[Sampling]:
        split = getattr(self.inner, "split", None)
        return split(sampling) if split is not None else [sampling]

    def _join(self, parts: list[Completion]) -> Completion:
        return self.inner.join(parts) if len(parts) > 1 else parts[0]

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        async with self.limit:
            try:
                async with asyncio.timeout(self.settings.timeout_s):  # unlike wait_for, no task of its own a call
                    return await self.inner._complete(messages, sampling)
            except TimeoutError:
                raise TransientLLMError(f"timed out after {self.settings.timeout_s}s") from None

    async def _with_retries(self, messages: list[Message], sampling: Sampling, tries: list[int], i: int) -> Completion:
        s = self.settings
        retrying = AsyncRetrying(
            stop=stop_after_attempt(s.max_attempts),
            wait=wait_exponential(multiplier=s.backoff_initial_s, max=s.backoff_max_s) + wait_random(0, s.backoff_jitter_s),
            retry=retry_if_exception_type(TransientLLMError),
            sleep=lambda seconds: self._sleep(seconds),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                tries[i] += 1
                return await self._complete(messages, sampling)

    async def chat(self, messages: list[Message], sampling: Sampling | None = None, *,
                   call: PolicyCall | None = None) -> ChatOutcome:  # call: a training tag; served models ignore it
        sampling = sampling or Sampling()
        messages = list(messages)
        self.stats.calls += 1
        loop = asyncio.get_running_loop()
        start = loop.time()

        key = None
        if self.cache is not None and sampling.deterministic:
            key = ResponseCache.key(self.cache_identity(), messages, sampling)
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.answered(0, 0)
                self.stats.cache_hits += 1
                self._count_logprobs(sampling, hit)
                return ChatResult(**hit.model_dump(), latency_s=loop.time() - start, cached=True)

        requests = self._requests(sampling)
        tries = [0] * len(requests)
        if len(requests) == 1:  # the usual case, awaited in place: a task per call costs the event loop time
            try:
                parts = [await self._with_retries(messages, requests[0], tries, 0)]
            except Exception as exc:  # a backend bug must not take the run down either: it is reported as a failure
                return self._failed(exc, tries, loop.time() - start)
        else:
            tasks = [asyncio.ensure_future(self._with_retries(messages, r, tries, i)) for i, r in enumerate(requests)]
            try:
                parts = await asyncio.gather(*tasks)
            except Exception as exc:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return self._failed(exc, tries, loop.time() - start)
        completion = self._join(parts)
        self._count_logprobs(sampling, completion)

        latency = loop.time() - start
        cost = (completion.prompt_tokens * self.prices[0] + completion.completion_tokens * self.prices[1]) / 1000
        self.stats.answered(completion.prompt_tokens, completion.completion_tokens, retries=sum(tries) - len(tries),
                            cost=cost, latency_s=latency)
        if key is not None:
            self.cache.put(key, completion)
        return ChatResult(**completion.model_dump(), latency_s=latency, attempts=max(tries))

    def _failed(self, exc: Exception, tries: list[int], latency: float) -> ChatFailure:
        attempts = max(tries)
        self.stats.call_failed(type(exc).__name__, retries=sum(max(t - 1, 0) for t in tries), latency_s=latency)
        return ChatFailure(
            error_type=type(exc).__name__, message=str(exc), status_code=getattr(exc, "status_code", None),
            transient=isinstance(exc, TransientLLMError), attempts=max(attempts, 1), latency_s=latency,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
