"""``gemini`` backend: Google's Gemini models through google-genai, with structured output from a JSON
schema (build one from a pydantic model with ``Model.model_json_schema()``). The API key comes from the
environment only (``GEMINI_API_KEY`` by default, or the variable named in params). The backend opens one
google-genai client per event loop (its async HTTP connections belong to one loop) and closes it inside that
loop (``per_loop.PerLoop``); a client passed in belongs to the caller. It reports no log-probabilities
(``Completion.logprobs`` None, whatever ``Sampling.logprobs`` asks).

    model = GeminiChatModel(model="gemini-2.5-pro")
"""

from __future__ import annotations

import os

from components.llm.backends.per_loop import PerLoop
from components.llm.base import (
    BACKENDS, ChatModel, Completion, Message, PermanentLLMError, Sampling, TransientLLMError, classify_status,
)


async def _close_genai(client) -> None:
    await client.aio.aclose()
    client.close()


@BACKENDS.register("gemini")
class GeminiChatModel(ChatModel):
    def __init__(self, model: str, api_key_env: str | None = None, client=None):
        from google import genai

        self.name = model
        self.model = model
        self._client = client
        env = api_key_env or "GEMINI_API_KEY"
        key = os.environ.get(env)
        if client is None and not key:
            raise PermanentLLMError(f"gemini backend: environment variable {env} is not set")
        self._clients = PerLoop(lambda: genai.Client(api_key=key), _close_genai)

    @staticmethod
    def _contents(messages: list[Message]):
        from google.genai import types

        system = "\n\n".join(m.content for m in messages if m.role == "system") or None
        contents = [
            types.Content(role="model" if m.role == "assistant" else "user", parts=[types.Part(text=m.content)])
            for m in messages if m.role != "system"
        ]
        return system, contents

    def _config(self, system: str | None, sampling: Sampling):
        from google.genai import types

        kwargs = dict(
            system_instruction=system, temperature=sampling.temperature, top_p=sampling.top_p,
            max_output_tokens=sampling.max_tokens, candidate_count=sampling.n, seed=sampling.seed,
            stop_sequences=list(sampling.stop) or None,
        )
        if sampling.json_schema is not None:
            kwargs.update(response_mime_type="application/json", response_json_schema=sampling.json_schema)
        return types.GenerateContentConfig(**kwargs)

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        from google.genai import errors

        system, contents = self._contents(messages)
        client = self._client if self._client is not None else await self._clients.get()
        try:
            resp = await client.aio.models.generate_content(
                model=self.model, contents=contents, config=self._config(system, sampling)
            )
        except errors.APIError as exc:
            raise classify_status(int(exc.code or 500))(f"gemini: {exc}", status_code=exc.code) from None
        except (TimeoutError, ConnectionError, OSError) as exc:
            raise TransientLLMError(f"gemini: {type(exc).__name__}: {exc}") from None
        candidates = resp.candidates or []
        texts = ["".join(p.text or "" for p in (c.content.parts if c.content else []) or []) for c in candidates]
        if not texts:
            raise TransientLLMError("gemini: response had no candidates")
        usage = resp.usage_metadata
        return Completion(
            texts=texts, model=self.model,
            finish_reasons=[str(c.finish_reason or "") for c in candidates],
            prompt_tokens=int(getattr(usage, "prompt_token_count", 0) or 0),
            completion_tokens=int(getattr(usage, "candidates_token_count", 0) or 0),
        )

    async def aclose(self) -> None:
        await self._clients.aclose()
