"""``openai`` backend: any OpenAI-compatible chat-completions server over HTTP (vLLM in production,
llama.cpp's server for the embedded default). Uses aiohttp directly so that every failure maps onto the
middleware's transient/permanent split; the middleware owns retries, so none happen here. A server that
ignores ``n`` (llama.cpp) gets ``n`` single requests with derived seeds (``split``, then ``join``; through
the middleware each takes its own concurrency slot). The session is one per event loop, closed inside that loop
(``per_loop.PerLoop``), unless the caller passes its own.

aiohttp rather than httpx (issue 49.5): a call through httpx cost about 1.1-1.5 ms of client CPU against a
loopback server, through aiohttp about 0.3-0.6 ms (``perf/bench_judge_client.py`` times both side by side); at 32
calls in flight that overhead is paid by one event loop and was most of the judge client's missed target. A proxy
named in the environment (``HTTP_PROXY``, ``NO_PROXY``, ...) is read once, when the backend is made, and is used
as httpx used it; ``~/.netrc`` is not read (requests carry their own ``Authorization``).

A request with ``Sampling.logprobs`` sends ``logprobs: true, top_logprobs: k`` and reads each choice's
``logprobs.content`` (``[{"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}, ...]``), the shape
OpenAI, vLLM, llama.cpp's server and llama-cpp-python's server all return; a reply without it, or with one
that cannot be read, has ``logprobs`` None (the text is still used).

    model = OpenAIChatModel(model="Qwen/Qwen3-14B", base_url="http://127.0.0.1:8000/v1")
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from components.llm.backends.per_loop import PerLoop
from components.llm.base import (
    BACKENDS, ChatModel, Completion, Logprobs, Message, PermanentLLMError, Sampling, TokenLogprob, TransientLLMError,
    classify_status,
)


def read_logprobs(choices: list[dict]) -> Logprobs | None:
    """Each choice's ``logprobs.content`` as tokens, or None when any choice has none or one that cannot be read."""
    out = []
    try:
        for choice in choices:
            content = (choice.get("logprobs") or {}).get("content")
            if not isinstance(content, list):
                return None
            out.append([TokenLogprob(token=t["token"], logprob=float(t["logprob"]),
                                     top=tuple((a["token"], float(a["logprob"])) for a in t.get("top_logprobs") or ()))
                        for t in content])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return out


@BACKENDS.register("openai")
class OpenAIChatModel(ChatModel):
    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        api_key_env: str | None = None,
        supports_n: bool = False,
        json_format: str = "json_schema",
        client: aiohttp.ClientSession | None = None,
    ):
        if not base_url:
            raise PermanentLLMError("openai backend needs a base_url")
        self.name = model
        self.model = model
        self.base_url = base_url.rstrip("/")
        if api_key is None and api_key_env and not os.environ.get(api_key_env):
            # a named key that is missing is a configuration error, not an anonymous request
            raise PermanentLLMError(f"openai backend {model!r}: environment variable {api_key_env} is not set")
        key = api_key or (os.environ.get(api_key_env) if api_key_env else None) or "EMPTY"  # vLLM: no key
        self.headers = {"Authorization": f"Bearer {key}"}
        self.supports_n = supports_n
        # "json_schema": OpenAI / vLLM style; "json_object": llama.cpp's {"type": "json_object", "schema": ...}
        self.json_format = json_format
        self._client = client
        self.url = f"{self.base_url}/chat/completions"
        self.proxy, self.proxy_auth = env_proxy(self.url)
        # the middleware enforces the per-call timeout; the session's only stops a stuck connect
        self._clients = PerLoop(lambda: aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0)),
                                lambda c: c.close())

    async def _http(self) -> aiohttp.ClientSession:
        return self._client if self._client is not None else await self._clients.get()

    def split(self, sampling: Sampling) -> list[Sampling]:
        """The requests ``sampling`` takes on this server: itself, or ``n`` single samples seeded
        ``seed + i`` when the server ignores ``n``."""
        if sampling.n == 1 or self.supports_n:
            return [sampling]
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(sampling.n)]
        return [sampling.model_copy(update={"n": 1, "seed": seed}) for seed in seeds]

    def _body(self, messages: list[Message], sampling: Sampling) -> dict:
        body: dict = {
            "model": self.model,
            "messages": [m.model_dump() for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "n": sampling.n,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.logprobs:  # top_logprobs always sent: llama-cpp-python's server reports nothing without it
            body["logprobs"] = True
            body["top_logprobs"] = sampling.top_logprobs
        if sampling.json_schema is not None:
            if self.json_format == "json_object":
                body["response_format"] = {"type": "json_object", "schema": sampling.json_schema}
            else:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": sampling.json_schema, "strict": True},
                }
        return body

    async def _request(self, body: dict) -> Completion:
        try:
            client = await self._http()
            async with client.post(self.url, json=body, headers=self.headers, proxy=self.proxy,
                                   proxy_auth=self.proxy_auth) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:  # refused, reset, cut short, a stuck connect
            raise TransientLLMError(f"{type(exc).__name__}: {exc}") from None
        text = raw.decode("utf-8", errors="replace")
        if status != 200:
            raise classify_status(status)(f"HTTP {status} from {self.base_url}: {text[:300]}", status_code=status)
        try:
            data = json.loads(raw)
            choices = data["choices"]
            texts = [c["message"]["content"] or "" for c in choices]
            finish = [c.get("finish_reason") or "" for c in choices]
            usage = data.get("usage") or {}
            logprobs = read_logprobs(choices) if body.get("logprobs") else None
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # ValueError: not JSON, or not UTF-8
            # a truncated or garbled body usually comes from an overloaded proxy or server: retry it
            raise TransientLLMError(f"malformed response body ({type(exc).__name__}): {text[:200]!r}") from None
        if not texts:
            raise TransientLLMError("response had no choices")
        return Completion(
            texts=texts, model=data.get("model") or self.model, finish_reasons=finish, logprobs=logprobs,
            prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
        )

    @staticmethod
    def join(parts: list[Completion]) -> Completion:
        """One completion from the answers to ``split``'s requests, in request order (log-probabilities only when
        every part has them)."""
        if len(parts) == 1:
            return parts[0]
        logprobs = None if any(p.logprobs is None for p in parts) else [s for p in parts for s in p.logprobs]
        return Completion(
            texts=[t for p in parts for t in p.texts], model=parts[0].model, logprobs=logprobs,
            finish_reasons=[f for p in parts for f in p.finish_reasons],
            prompt_tokens=sum(p.prompt_tokens for p in parts), completion_tokens=sum(p.completion_tokens for p in parts),
        )

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        requests = self.split(sampling)
        if len(requests) == 1:  # the usual case: no task to gather
            return await self._request(self._body(messages, requests[0]))
        return self.join(await asyncio.gather(*(self._request(self._body(messages, r)) for r in requests)))

    async def aclose(self) -> None:
        """Close the sessions this backend opened (a session passed in belongs to the caller)."""
        await self._clients.aclose()


def env_proxy(url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for ``url`` (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, ...), or None."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None
