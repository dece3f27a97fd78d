"""``hf`` backend: a transformers causal LM in-process (the trainable policy on CPU). Structured output
is requested through the prompt only; callers must parse defensively. It reports no log-probabilities
(``Completion.logprobs`` None, whatever ``Sampling.logprobs`` asks).

    model = HFChatModel.from_pretrained("/path/to/model")                 # a local folder
    model = HFChatModel(model=peft_model, tokenizer=tok, name="policy")    # the model being trained
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from components.llm.base import BACKENDS, ChatModel, Completion, Message, PermanentLLMError, Sampling


_STOPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {stop strings: criterion}
_STOPS_LOCK = threading.Lock()


@BACKENDS.register("hf")
class HFChatModel(ChatModel):
    def __init__(self, model, tokenizer, name: str = "hf"):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, path: str, gguf_file: str | None = None, name: str | None = None) -> "HFChatModel":
        from transformers import AutoModelForCausalLM

        from components.hf_tokenizer import load_tokenizer

        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        tok = load_tokenizer(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        model.eval()
        return cls(model, tok, name=name or path)

    def _generate(self, messages: list[Message], sampling: Sampling) -> Completion:
        import torch

        chat = [m.model_dump() for m in messages]
        try:
            ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        except Exception as exc:  # a tokenizer without a chat template is a configuration error
            raise PermanentLLMError(f"hf: cannot build the prompt: {exc}") from None
        input_ids = ids["input_ids"]
        gen_kwargs = dict(
            max_new_tokens=sampling.max_tokens, num_return_sequences=sampling.n,
            do_sample=sampling.temperature > 0, pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
        )
        if sampling.temperature > 0:
            gen_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
        if sampling.stop:
            gen_kwargs.update(stopping_criteria=self._stop_criteria(tuple(sampling.stop)))
        with self._lock:
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            with torch.no_grad():
                out = self.model.generate(input_ids=input_ids, attention_mask=ids.get("attention_mask"), **gen_kwargs)
        new = out[:, input_ids.shape[1]:]
        texts, finish = [], []
        for row in new:
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            reason = "length"
            for s in sampling.stop:
                if s in text:
                    text, reason = text[: text.index(s)], "stop"
            if reason == "length" and (row == self.tokenizer.eos_token_id).any():
                reason = "stop"
            texts.append(text)
            finish.append(reason)
        n_new = int((new != (self.tokenizer.pad_token_id or -1)).sum())
        return Completion(texts=texts, model=self.name, prompt_tokens=int(input_ids.numel()),
                          completion_tokens=n_new, finish_reasons=finish)

    def _stop_criteria(self, stop: tuple[str, ...]):
        """What ``generate(stop_strings=...)`` builds, kept per tokenizer and stop tuple: building it scans the whole
        vocabulary (most of a second for a 150k-token one), which would otherwise happen on every call."""
        with _STOPS_LOCK:
            built = _STOPS.setdefault(self.tokenizer, {})
            if stop not in built:
                from transformers import StoppingCriteriaList, StopStringCriteria

                built[stop] = StoppingCriteriaList([StopStringCriteria(self.tokenizer, list(stop))])
            return built[stop]

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        return await asyncio.to_thread(self._generate, messages, sampling)
