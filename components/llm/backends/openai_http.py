"""``openai`` backend: any OpenAI-compatible chat-completions server over HTTP (vLLM in production,
llama.cpp's server for the embedded default). Uses httpx directly so that every failure maps onto the
middleware's transient/permanent split; the middleware owns retries, so none happen here.

    model = OpenAIChatModel(model="Qwen/Qwen3-14B", base_url="http://127.0.0.1:8000/v1")
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx

from components.llm.base import (
    BACKENDS, ChatModel, Completion, Message, PermanentLLMError, Sampling, TransientLLMError, classify_status,
)


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
        client: httpx.AsyncClient | None = None,
    ):
        if not base_url:
            raise PermanentLLMError("openai backend needs a base_url")
        self.name = model
        self.model = model
        self.base_url = base_url.rstrip("/")
        key = api_key or (os.environ.get(api_key_env) if api_key_env else None) or "EMPTY"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.supports_n = supports_n
        # "json_schema": OpenAI / vLLM style; "json_object": llama.cpp's {"type": "json_object", "schema": ...}
        self.json_format = json_format
        self._client = client
        self._owns_client = client is None
        self._client_loop = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._owns_client and (self._client is None or self._client_loop is not loop):
            # one client per event loop: callers may run several asyncio.run() in a row
            # the middleware enforces the per-call timeout; this one only stops a stuck socket
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
            self._client_loop = loop
        return self._client

    def _body(self, messages: list[Message], sampling: Sampling, n: int, seed: int | None) -> dict:
        body: dict = {
            "model": self.model,
            "messages": [m.model_dump() for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "n": n,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if seed is not None:
            body["seed"] = seed
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
            resp = await self._http().post(f"{self.base_url}/chat/completions", json=body, headers=self.headers)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise TransientLLMError(f"{type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise classify_status(resp.status_code)(
                f"HTTP {resp.status_code} from {self.base_url}: {resp.text[:300]}", status_code=resp.status_code
            )
        try:
            data = resp.json()
            choices = data["choices"]
            texts = [c["message"]["content"] or "" for c in choices]
            finish = [c.get("finish_reason") or "" for c in choices]
            usage = data.get("usage") or {}
        except (json.JSONDecodeError, KeyError, TypeError, IndexError) as exc:
            # a truncated or garbled body usually comes from an overloaded proxy or server: retry it
            raise TransientLLMError(f"malformed response body ({type(exc).__name__}): {resp.text[:200]!r}") from None
        if not texts:
            raise TransientLLMError("response had no choices")
        return Completion(
            texts=texts, model=data.get("model") or self.model, finish_reasons=finish,
            prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
        )

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        if sampling.n == 1 or self.supports_n:
            return await self._request(self._body(messages, sampling, sampling.n, sampling.seed))
        # servers that ignore n (llama.cpp) get n requests with derived seeds
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(sampling.n)]
        parts = await asyncio.gather(*(self._request(self._body(messages, sampling, 1, s)) for s in seeds))
        return Completion(
            texts=[p.texts[0] for p in parts], model=parts[0].model,
            finish_reasons=[p.finish_reasons[0] if p.finish_reasons else "" for p in parts],
            prompt_tokens=sum(p.prompt_tokens for p in parts), completion_tokens=sum(p.completion_tokens for p in parts),
        )

    async def aclose(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None
