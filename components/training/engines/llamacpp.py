"""The CPU rollout engine for a policy being trained: llama.cpp's native ``llama-server`` (built by
``scripts/setup.sh``) serving the quantized (Q4_K_M) base with the current LoRA adapter. Prompts go as token ids,
every prompt of a call at once so the server's slots decode them in one batch, and the sampled ids come back
verbatim; after each optimiser step :meth:`~LlamaCppRolloutEngine.update_weights` converts the peft adapter to a
LoRA GGUF and restarts the server with it. Its samples and log-probs differ slightly from the trained fp32 weights,
so the trainer recomputes log-probs; which log-probs come back exact, and batch invariance: the class and
:meth:`~LlamaCppRolloutEngine.batch_invariant`.

    engine = LlamaCppRolloutEngine(ensure_gguf("qwen2.5-coder-0.5b-instruct"), tokenizer, parallel=4)
    gens = engine.generate([prompt_ids] * 4, SamplingParams(max_new_tokens=128))
    engine.update_weights(policy, step)     # next generate samples from base + the new adapter
    engine.close()
"""

from __future__ import annotations

import math
import random
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

from components.adapters import save_adapter
from components.embedded.lora_gguf import peft_to_gguf
from components.embedded.native_server import NativeLlamaServer
from components.training.engines.rollout import (
    Generation,
    SamplingParams,
    _cut_text,
    _find_stop,
    encode_prompt,
)

if TYPE_CHECKING:
    from components.run_spec import RunSpec

__all__ = ["LlamaCppRolloutEngine", "engine_for_policy", "engine_for_role"]

# every sampler the server would otherwise apply by default, switched off
_NEUTRAL = {
    "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0,
    "dynatemp_range": 0.0, "n_indent": 0, "ignore_eos": False,
}


class LlamaCppRolloutEngine:
    """Rollouts from ``model_path`` (+ the current LoRA adapter) on a native llama-server it owns.

    ``base_loras`` are served under every update (a warm-start adapter the trained policy merged into its
    base: LoRA deltas add, so base + warm start + current adapter is the trained model, quantized).

    ``tokenizer`` is needed for text prompts and ``stop_token_ids`` (cut client-side; the server stops at
    the model's end-of-generation tokens itself). ``seed`` seeds the per-prompt sampling seeds;
    ``logprobs=False`` returns no log-probs (and skips their cost).

    Log-probs: the server reports per sampled token either the softmax of the raw logits (temperature 1) or the
    probability after its sampler chain, so the Generation contract's values (temperature-scaled, before
    truncation) come back exact for greedy decoding, for temperature 1 (any top-p/top-k) and for any temperature
    without top-p/top-k; otherwise, and for a token that ends inside a UTF-8 character, ``logprobs`` is None. A
    matched stop string's tokens, which the server leaves unscored, are re-scored by one forced continuation at
    temperature 1 (None at others). Scores after the sampler chain cost about 40% of decoding speed, so pass
    ``logprobs=False`` when the trainer recomputes log-probs anyway (its default). ``last_update`` holds the
    timings of the last adapter swap.
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any = None,
        *,
        parallel: int = 4,
        threads: int = 2,
        n_ctx: int = 4096,
        lora: str | Path | None = None,
        base_loras: Sequence[str | Path] = (),
        adapter_dir: str | Path | None = None,
        seed: int = 0,
        logprobs: bool = True,
        request_timeout_s: float = 600.0,
    ):
        self.tokenizer, self.logprobs = tokenizer, logprobs
        self.context_window = n_ctx  # tokens per slot: a longer prompt is refused by the server
        self.base_loras = tuple(Path(p) for p in base_loras)
        self.server = NativeLlamaServer(model_path, n_ctx=n_ctx, threads=threads, parallel=parallel,
                                        lora=[*self.base_loras, *([lora] if lora is not None else [])])
        self.server.start()
        self.adapter_dir = Path(adapter_dir or tempfile.mkdtemp(prefix="rubricflow-llamacpp-lora-"))
        self._rng = random.Random(seed)
        self._client = httpx.Client(timeout=request_timeout_s, limits=httpx.Limits(max_connections=64))
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="llamacpp-engine")
        self.last_update: dict[str, float] = {}
        self.unscored_generations = 0  # generations returned with logprobs None
        self._invariant = False
        self._alone = threading.Lock()  # held per request while batch-invariant

    # -- weights ---------------------------------------------------------------------------------------
    def update_weights(self, policy: Any, step: int) -> None:
        """Serve base + ``policy``'s current LoRA adapter (its model's active one) from the next :meth:`generate` on."""
        if not getattr(policy, "is_lora", False):
            raise NotImplementedError("LlamaCppRolloutEngine swaps LoRA adapters; full fine-tuning needs a GGUF export")
        t0 = time.perf_counter()
        path = self.adapter_dir / f"step_{step:06d}"
        active = getattr(policy.model, "active_adapter", "default")
        save_adapter(policy.model, path, selected_adapters=[active])
        t1 = time.perf_counter()
        gguf = peft_to_gguf(path if active == "default" else path / active, path / "adapter.gguf")
        t2 = time.perf_counter()
        restart_s = self.server.restart([*self.base_loras, gguf])
        self.last_update = {"save_s": t1 - t0, "convert_s": t2 - t1, "restart_s": restart_s,
                            "swap_s": time.perf_counter() - t0}

    def load_adapter(self, adapter: str | Path | None) -> float:
        """Serve a LoRA GGUF over the base adapters (None: those alone); returns the restart time in seconds."""
        return self.server.restart([*self.base_loras, *([adapter] if adapter is not None else [])])

    @contextmanager
    def batch_invariant(self) -> Iterator[None]:
        """Within the block, one request at a time and no cached prompt reused, so each continuation depends on its
        own prompt only: batched, the quantized kernels' results (and so greedy near-ties) depend on the batch's size
        and on which prefix a slot had cached. Dev evaluations use it (``train_policy.eval_batch_invariant``; its
        cost: ``perf/eval_determinism.py``)."""
        previous, self._invariant = self._invariant, True
        try:
            yield
        finally:
            self._invariant = previous

    # -- sampling --------------------------------------------------------------------------------------
    def _encode(self, prompt: Sequence[int] | str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def generate(self, prompts: Sequence[Sequence[int] | str], sampling: SamplingParams) -> list[Generation]:
        if (sampling.stop_token_ids or sampling.stop_strings) and self.tokenizer is None:
            raise ValueError("stop_token_ids and stop_strings need an engine with a tokenizer")
        encoded = [self._encode(p) for p in prompts]
        seeds = [self._rng.randrange(2**31) if sampling.seed is None else sampling.seed + i for i in range(len(encoded))]
        futures = [self._pool.submit(self._one, ids, sampling, seed) for ids, seed in zip(encoded, seeds)]
        gens = [f.result() for f in futures]
        if self.logprobs:
            self.unscored_generations += sum(g.logprobs is None for g in gens)
        return gens

    def _post(self, body: dict) -> dict:
        if self._invariant:
            with self._alone:
                return self._send({**body, "cache_prompt": False})
        return self._send(body)

    def _send(self, body: dict) -> dict:
        response = self._client.post(f"{self.server.root_url}/completion", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"llama-server /completion returned {response.status_code}: {response.text[:500]}")
        return response.json()

    def _one(self, prompt: list[int], sampling: SamplingParams, seed: int) -> Generation:
        greedy = sampling.temperature <= 0
        truncated = not greedy and (sampling.top_k > 0 or sampling.top_p < 1.0)
        # pre-sampling probs: softmax of the raw logits (exact for greedy and T = 1);
        # post-sampling probs: after the chain (exact at any T when nothing truncates)
        post = not greedy and not truncated and sampling.temperature != 1.0
        scorable = self.logprobs and (greedy or sampling.temperature == 1.0 or not truncated)
        body = {
            **_NEUTRAL,
            "prompt": prompt,
            "n_predict": sampling.max_new_tokens,
            "temperature": 0.0 if greedy else sampling.temperature,
            "top_k": 0 if greedy else sampling.top_k,
            "top_p": 1.0 if greedy else sampling.top_p,
            "samplers": ["temperature", "top_k", "top_p"],  # transformers' order
            "seed": seed,
            "stop": list(sampling.stop_strings),
            "return_tokens": True,
            "n_probs": 1 if scorable else 0,
            "post_sampling_probs": post,
            "cache_prompt": True,
        }
        out = self._post(body)
        tokens = [int(t) for t in out["tokens"]]
        reason = "stop" if out.get("stop_type") in ("eos", "word") else "length"
        logprobs = self._align(tokens, out.get("completion_probabilities") or [], post) if scorable else None
        if logprobs is not None and None in logprobs:
            logprobs = self._rescore_tail(prompt, tokens, logprobs, sampling)
        if sampling.stop_token_ids:
            n, why = _find_stop(tokens, sampling.stop_token_ids, (), None)
            if why == "stop":
                tokens, reason = tokens[:n], "stop"
                logprobs = None if logprobs is None else logprobs[:n]
        if self.tokenizer is not None:
            text = _cut_text(self.tokenizer.decode(tokens, skip_special_tokens=True), sampling.stop_strings)
        else:
            text = out.get("content", "")
        return Generation(list(prompt), tokens, logprobs, reason, text)

    @staticmethod
    def _align(tokens: list[int], probs: list[dict], post: bool) -> list[float | None]:
        """Per token, its reported log-prob or None: the server skips tokens that end inside a UTF-8
        character and trims the tokens of a matched stop string, so reports are matched in order by id."""
        out: list[float | None] = []
        j = 0
        for t in tokens:
            if j < len(probs) and int(probs[j]["id"]) == t:
                p = probs[j]
                out.append(math.log(max(float(p["prob"]), 1e-45)) if post else float(p["logprob"]))
                j += 1
            else:
                out.append(None)
        return out

    def _rescore_tail(
        self, prompt: list[int], tokens: list[int], logprobs: list[float | None], sampling: SamplingParams
    ) -> list[float] | None:
        """Fill unscored trailing tokens (a stop string's) by forcing them again with a token grammar; the
        raw-logit scores are exact at temperature 1 (and greedy) only."""
        first = logprobs.index(None)
        if any(lp is not None for lp in logprobs[first:]) or not (
            sampling.temperature <= 0 or sampling.temperature == 1.0
        ):
            return None
        tail = tokens[first:]
        body = {
            **_NEUTRAL,
            "prompt": prompt + tokens[:first],
            "n_predict": len(tail),
            "temperature": 0.0,
            "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in tail),
            "return_tokens": True,
            "n_probs": 1,
            "post_sampling_probs": False,
            "cache_prompt": True,
        }
        out = self._post(body)
        forced = self._align(tail, out.get("completion_probabilities") or [], False)
        if [int(t) for t in out["tokens"]] != tail or None in forced:
            return None
        return [*logprobs[:first], *forced]

    # -- lifetime --------------------------------------------------------------------------------------
    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
        self.server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def engine_for_policy(spec: RunSpec, policy: Any, tokenizer: Any,
                      base_adapters: Sequence[str | Path] = ()) -> LlamaCppRolloutEngine:
    """The rollout engine of a trained role: the trainable policy's embedded base (Q4_K_M GGUF) with
    ``base_adapters`` (peft folders or GGUFs, e.g. a warm start merged into the trained model) merged into
    its weights once (:mod:`components.embedded.lora_merge`; they never change during training, and a
    runtime adapter costs every decode step) under the adapter being trained, one slot per episode of a
    step. Until the first update it serves the merged base alone, which the fresh trained adapter (B = 0)
    equals."""
    episodes = spec.grpo.group_size * spec.grpo.prompts_per_step
    # the engine's log-probs are read by truncated importance sampling (grpo.tis_cap) and old_logprobs: engine;
    # otherwise the trainer recomputes them and the server skips their cost
    scored = spec.grpo.tis_cap is not None or spec.grpo.old_logprobs == "engine"
    return engine_for_role(spec, "trainable_policy", tokenizer, parallel=min(episodes, 8), logprobs=scored,
                           base_adapters=base_adapters)


def engine_for_role(spec: RunSpec, role: str, tokenizer: Any, *, parallel: int, logprobs: bool,
                    base_adapters: Sequence[str | Path] = ()) -> LlamaCppRolloutEngine:
    """An engine on ``role``'s embedded base (Q4_K_M GGUF; ``base_adapters`` merged into it once) for a LoRA
    adapter trained on that role's weights: the policy's rollouts, ARCO's mu writing criteria."""
    from components.embedded.lora_gguf import ensure_lora_gguf
    from components.embedded.lora_merge import ensure_merged_gguf
    from components.embedded.models import ensure_gguf

    cfg = spec.backend(role)
    if not cfg.embedded:
        raise ValueError(f"a llamacpp engine serves an embedded model; bind {role} to an 'hf' backend with "
                         "`embedded:` set, or use engine: hf")
    cache_dir = spec.run.cache_dir
    model = ensure_gguf(cfg.embedded, cache_dir)
    if base_adapters:
        model = ensure_merged_gguf(model, [ensure_lora_gguf(a, cache_dir) for a in base_adapters], cache_dir)
    return LlamaCppRolloutEngine(model, tokenizer, parallel=parallel, threads=cfg.threads or 2,
                                 n_ctx=spec.train_policy.n_ctx, seed=spec.seed, logprobs=logprobs)
