"""``scripted`` backend: replays prepared answers. For unit tests only; never a default in params.yaml.

    model = ScriptedChatModel(["first reply", TransientLLMError("boom"), "second reply"])
    model = ScriptedChatModel(lambda messages, sampling: "computed reply")
    model = ScriptedChatModel([WithLogprobs("yes", [TokenLogprob(token="yes", logprob=-0.1, top=(...))])])

Log-probabilities come back only for a request that asks for them and whose replies are all ``WithLogprobs``;
otherwise the completion has none, as from a backend without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from components.llm.base import BACKENDS, ChatModel, Completion, LLMError, Message, Sampling, TokenLogprob


@dataclass(frozen=True)
class WithLogprobs:
    """A prepared reply together with the tokens (and their log-probabilities) it is reported as."""

    text: str
    tokens: Sequence[TokenLogprob]


Reply = str | WithLogprobs | LLMError
Responder = Callable[[list[Message], Sampling], Reply]


@BACKENDS.register("scripted")
class ScriptedChatModel(ChatModel):
    def __init__(self, replies: Sequence[Reply] | Responder, name: str = "scripted"):
        self.name = name
        self._responder = replies if callable(replies) else None
        self._queue = [] if callable(replies) else list(replies)
        self.requests: list[tuple[list[Message], Sampling]] = []

    def _next(self, messages: list[Message], sampling: Sampling) -> Reply:
        if self._responder is not None:
            return self._responder(messages, sampling)
        if not self._queue:
            raise AssertionError("scripted backend ran out of replies")
        return self._queue.pop(0)

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        self.requests.append((messages, sampling))
        texts, tokens = [], []
        for i in range(sampling.n):
            # like the HTTP fan-out, sample i of a seeded request is seeded with seed + i
            one = sampling if sampling.seed is None else sampling.model_copy(update={"seed": sampling.seed + i})
            reply = self._next(messages, one)
            if isinstance(reply, LLMError):
                raise reply
            if isinstance(reply, WithLogprobs):
                texts.append(reply.text)
                tokens.append(list(reply.tokens))
            else:
                texts.append(reply)
        prompt = sum(len(m.content.split()) for m in messages)
        logprobs = tokens if sampling.logprobs and len(tokens) == len(texts) else None
        return Completion(texts=texts, model=self.name, prompt_tokens=prompt, logprobs=logprobs,
                          completion_tokens=sum(len(t.split()) for t in texts), finish_reasons=["stop"] * len(texts))
