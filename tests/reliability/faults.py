"""A loopback OpenAI-compatible server that fails a seeded share of calls, and the judges' real middleware
pointed at it.

:class:`FaultServer` runs :class:`tests.llm.fake_openai_server.FakeOpenAIServer` and decides every request's
behaviour itself: an honest reply (``Judge.good`` of the request's messages) or, with probability ``rate``, one
fault drawn uniformly from :data:`KINDS`:

- transport faults, which the middleware retries: HTTP 429 and 500, a reply later than the call's timeout, a
  response body cut in half, a body that is not JSON (a proxy's HTML page), an empty body;
- answer faults, valid responses whose answer is not a valid verdict, which the judge interface records as
  ``unparsed`` (never retried): a value out of range (``Judge.bad``: a score of 7 on a 0-2 scale, a label that
  is not offered), the wrong length (a ranking of 3 for a slate of 4), an empty answer, the honest answer cut in
  half.

A request whose prompt holds :data:`DOOMED` fails with HTTP 500 every time (a group whose judging fails
entirely). The draw is keyed on the request's content and on how many times that request was made before, so
a run faults the same calls whatever the order the requests arrive in. The server keeps, per logical call (the
same body asked again is a retry of it), the kind of every attempt: :meth:`FaultServer.final` is the ground
truth a judge's records are checked against.

    server = FaultServer(Judge(good, bad), rate=0.3, seed=0)
    with server:
        model = server.model("answer_judge")                  # ReliableChatModel over OpenAIChatModel
        ...
    server.failed_calls()        # {"call_failed": 1, "unparsed": 4}: the calls whose last attempt was a fault
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

from components.llm.accounting import Accounting
from components.llm.backends.openai_http import OpenAIChatModel
from components.llm.middleware import ReliableChatModel
from components.llm.params import MiddlewareParams
from tests.llm.fake_openai_server import FakeOpenAIServer

TRANSPORT = ("http_429", "http_500", "timeout", "truncated_body", "malformed_body", "empty_body")
ANSWER = ("out_of_range", "wrong_length", "empty_answer", "truncated_answer")
KINDS = TRANSPORT + ANSWER
DOOMED = "DOOMED"
TIMEOUT_S = 1.5  # long enough that an honest reply on a loaded 2-core machine is never late

SETTINGS = MiddlewareParams(max_concurrency=8, timeout_s=TIMEOUT_S, max_attempts=4, backoff_initial_s=0.001,
                            backoff_max_s=0.004, backoff_jitter_s=0.001, cache=False)
"""The project's middleware with its default attempts (4) and no response cache, its waits shortened."""


@dataclass
class Judge:
    """What the server answers one kind of judgment: ``good(messages)`` the honest reply to a request's messages
    (dicts with ``role`` and ``content``), ``bad(kind, messages, good)`` a valid response whose answer is out of
    range (``kind="out_of_range"``) or of the wrong length (``"wrong_length"``)."""

    good: Callable[[list[dict]], str]
    bad: Callable[[str, list[dict], str], str]


def _payload(body: dict, text: str) -> str:
    return json.dumps({"model": body["model"], "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}]})


class _Decide:
    """The server's behaviour queue, never empty: each pop answers the request just received (the fake server
    appends a request's body and pops its behaviour under one lock)."""

    def __init__(self, owner: FaultServer):
        self.owner = owner

    def __bool__(self) -> bool:
        return True

    def pop(self, _index: int = 0) -> tuple:
        return self.owner.behaviour(self.owner.fake.requests[-1])


class FaultServer:
    def __init__(self, judge: Judge, *, rate: float = 0.3, seed: int = 0):
        self.judge, self.rate, self.seed = judge, rate, seed
        self.fake = FakeOpenAIServer()
        self.fake.behaviours = _Decide(self)
        # a deeper accept queue than socketserver's 5: a connection left waiting in a full queue times out in the
        # client without the server ever seeing the attempt, which this server must count
        self.fake.httpd.socket.listen(128)
        self.attempts: dict[str, list[str]] = {}  # logical call -> kind of each attempt ("ok" or a fault)
        self.prompts: dict[str, str] = {}  # logical call -> its last message
        self.accounting = Accounting()
        self._lock = threading.Lock()
        self._models: list[ReliableChatModel] = []

    # -- the server side ----------------------------------------------------------------------------------
    @staticmethod
    def key(body: dict) -> str:
        asked = {k: body.get(k) for k in ("model", "messages", "temperature", "seed", "max_tokens", "response_format")}
        return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]

    def behaviour(self, body: dict) -> tuple:
        key = self.key(body)
        messages = body["messages"]
        with self._lock:
            seen = self.attempts.setdefault(key, [])
            self.prompts[key] = messages[-1]["content"]
            rng = random.Random(f"{self.seed}:{key}:{len(seen)}")
            if any(DOOMED in m["content"] for m in messages):
                kind = "doomed"
            else:
                kind = rng.choice(KINDS) if rng.random() < self.rate else "ok"
            seen.append(kind)
        if kind in ("doomed", "http_500"):
            return ("status", 500)
        if kind == "http_429":
            return ("status", 429)
        if kind == "timeout":
            return ("sleep", TIMEOUT_S + 1.0)
        if kind == "malformed_body":
            return ("malformed", "<html><body>502 Bad Gateway</body></html>")
        if kind == "empty_body":
            return ("malformed", "")
        good = self.judge.good(messages)
        if kind == "ok":
            return ("ok", good)
        if kind == "truncated_body":
            whole = _payload(body, good)
            return ("malformed", whole[: len(whole) // 2])
        if kind == "empty_answer":
            return ("ok", "")
        if kind == "truncated_answer":
            return ("ok", good[: len(good) // 2])
        return ("ok", self.judge.bad(kind, messages, good))

    # -- the ground truth ---------------------------------------------------------------------------------
    def final(self) -> dict[str, str]:
        """Each logical call's last attempt: ``ok``, or the fault it ended on."""
        return {key: kinds[-1] for key, kinds in self.attempts.items()}

    def failed_keys(self) -> list[str]:
        return [key for key, kind in self.final().items() if kind != "ok"]

    def failed_prompts(self) -> list[str]:
        return [self.prompts[key] for key in self.failed_keys()]

    def failed_calls(self) -> dict[str, int]:
        """The calls that ended on a fault, by the kind of failure the judge interface should record."""
        out = {"call_failed": 0, "unparsed": 0}
        for kind in self.final().values():
            if kind != "ok":
                out["unparsed" if kind in ANSWER else "call_failed"] += 1
        return out

    def injected(self) -> Counter:
        """Faults injected, by kind, over every attempt (``doomed`` for the always-failing prompts)."""
        return Counter(kind for kinds in self.attempts.values() for kind in kinds if kind != "ok")

    def retried_attempts(self) -> int:
        """Attempts after the first, over every logical call: what the middleware must count as retries."""
        return sum(len(kinds) - 1 for kinds in self.attempts.values())

    # -- the client side ----------------------------------------------------------------------------------
    def model(self, role: str, name: str | None = None) -> ReliableChatModel:
        """The role's model as a run builds it: the ``openai`` backend behind the reliability middleware."""
        inner = OpenAIChatModel(model=name or role, base_url=self.fake.base_url)
        model = ReliableChatModel(inner, role=role, settings=SETTINGS, accounting=self.accounting)
        self._models.append(model)
        return model

    def retries(self) -> int:
        """Retries the middleware counted, over every role."""
        return sum(stats.retries for stats in self.accounting.roles.values())

    async def aclose(self) -> None:
        for model in self._models:
            await model.aclose()

    def __enter__(self) -> Self:
        self.fake.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.fake.__exit__(*exc)
