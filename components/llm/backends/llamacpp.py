"""``llamacpp`` backend: llama.cpp in-process through llama-cpp-python (the [embedded] extra), for the
embedded GGUF models when no server is wanted. JSON-schema output is enforced by llama.cpp's grammar. It
reports no log-probabilities (``Completion.logprobs`` None): llama-cpp-python gives them only for a model loaded
with ``logits_all``, which keeps n_ctx x vocabulary floats in memory; the server backends report them.

    model = LlamaCppChatModel(model_path="/path/model.gguf", n_ctx=4096, threads=2)
"""

from __future__ import annotations

import asyncio
import threading

from components.llm.base import BACKENDS, ChatModel, Completion, Message, PermanentLLMError, Sampling


@BACKENDS.register("llamacpp")
class LlamaCppChatModel(ChatModel):
    def __init__(self, model_path: str, n_ctx: int = 4096, threads: int = 2, name: str | None = None):
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise PermanentLLMError("llamacpp backend needs the [embedded] extra (llama-cpp-python)") from exc
        self.name = name or model_path
        self._llm = Llama(model_path=model_path, n_ctx=n_ctx, n_threads=threads, verbose=False)
        self._lock = threading.Lock()

    def _generate(self, messages: list[Message], sampling: Sampling) -> Completion:
        texts, finish, prompt_tokens, completion_tokens = [], [], 0, 0
        for i in range(sampling.n):
            kwargs = dict(
                messages=[m.model_dump() for m in messages], temperature=sampling.temperature, top_p=sampling.top_p,
                max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None,
                seed=None if sampling.seed is None else sampling.seed + i,
            )
            if sampling.json_schema is not None:
                kwargs["response_format"] = {"type": "json_object", "schema": sampling.json_schema}
            with self._lock:
                out = self._llm.create_chat_completion(**kwargs)
            choice = out["choices"][0]
            texts.append(choice["message"]["content"] or "")
            finish.append(choice.get("finish_reason") or "")
            prompt_tokens = out["usage"]["prompt_tokens"]
            completion_tokens += out["usage"]["completion_tokens"]
        return Completion(texts=texts, model=self.name, finish_reasons=finish,
                          prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        return await asyncio.to_thread(self._generate, messages, sampling)
