"""The project's GRPO and SFT steps against TRL's ``GRPOTrainer`` and ``SFTTrainer``, tokens/s (issue 49.2). On the
CPU, in one process, on the same model, LoRA, batch shapes and token counts.

Run (the ``perf`` extra: ``.venv/bin/pip install -e '.[perf]'``)::

    python perf/bench_trl.py                       # tiny and small models (a few minutes on 2 cores)
    python perf/bench_trl.py --cases tiny --quick  # the smallest shapes, one timed step (what the test runs)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
RESULTS = Path(__file__).parent / "results" / "bench_trl.json"

CASES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 704},
}
LORA_R, LORA_ALPHA = 8, 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KL, CLIP, LR, SEED = 5e-3, 0.2, 1e-4, 0
TARGET_RATIO = 1.0


@dataclass(frozen=True)
class Shape:
    prompts: int
    group: int
    prompt_len: int
    completion_len: int
    steps: int
    sft_rows: int
    sft_batch: int
    sft_prompt_len: int
    sft_completion_len: int


FULL = Shape(prompts=2, group=8, prompt_len=32, completion_len=32, steps=3, sft_rows=16, sft_batch=4,
             sft_prompt_len=48, sft_completion_len=80)
QUICK = Shape(prompts=2, group=2, prompt_len=8, completion_len=4, steps=1, sft_rows=4, sft_batch=2,
              sft_prompt_len=8, sft_completion_len=8)


# ----------------------------------------------------------------------------- shared setup


def load_tokenizer():
    """The embedded 0.5B's tokenizer (the one ``tiny-qwen2`` speaks through), from the project's model cache."""
    from components.embedded.models import load_tiny

    cache = os.environ.get("RUBRICFLOW_CACHE", str(REPO / ".cache"))
    _, tokenizer = load_tiny("tiny-qwen2", cache)
    return tokenizer


def build_model(case: str, tokenizer):
    """A fresh random Qwen2 of ``case``: the same seed gives the same weights on every call. Its generation config
    has no EOS, so our engine always generates ``max_new_tokens``."""
    from components.embedded.tiny import tiny_qwen2

    model = tiny_qwen2(len(tokenizer), max_positions=1024, seed=SEED, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, **CASES[case])
    model.generation_config.eos_token_id = None
    return model


def single_token_words(tokenizer, count: int = 64) -> list[str]:
    """Space-led lowercase words that are one token each, also inside a run of such words."""
    words = []
    for i in range(300, 40000):
        text = tokenizer.decode([i])
        plain = text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and len(text) > 3
        if plain and tokenizer.encode(text + text, add_special_tokens=False) == [i, i]:
            words.append(text)
            if len(words) == count:
                break
    return words


def make_prompts(tokenizer, n: int, length: int, seed: int) -> list[str]:
    """``n`` text prompts of exactly ``length`` tokens each (checked: both sides tokenize the text themselves)."""
    import random

    words, rng = single_token_words(tokenizer), random.Random(seed)
    prompts = ["".join(rng.choice(words) for _ in range(length)) for _ in range(n)]
    for p in prompts:
        got = len(tokenizer.encode(p, add_special_tokens=False))
        if got != length:
            raise RuntimeError(f"prompt tokenizes to {got} tokens, not {length}: {p!r}")
    return prompts


def even_fraction(ids: list[int]) -> float:
    return sum(t % 2 == 0 for t in ids) / max(len(ids), 1)


class Clock:
    """Wall and CPU seconds spent inside ``with clock:`` blocks since the last :meth:`take`."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Self:
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c

    def take(self) -> tuple[float, float]:
        out = (self.wall, self.cpu)
        self.wall = self.cpu = 0.0
        return out


def summarise(steps: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the timed steps; tokens/s from the summed tokens and seconds."""
    med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
    tokens = sum(s["tokens"] for s in steps)
    med["tokens_per_s"] = tokens / sum(s["step_s"] for s in steps)
    med["tokens_per_cpu_s"] = tokens / sum(s["step_cpu_s"] for s in steps)
    if "update_s" in steps[0]:
        med["update_tokens_per_s"] = tokens / sum(s["update_s"] for s in steps)
        med["update_tokens_per_cpu_s"] = tokens / sum(s["update_cpu_s"] for s in steps)
    med["token_counts"] = [s["tokens"] for s in steps]
    if "trained_tokens" in steps[0]:
        med["trained_token_counts"] = [s["trained_tokens"] for s in steps]
    return med


# ----------------------------------------------------------------------------- GRPO


def ours_grpo(case: str, tokenizer, prompts: list[str], shape: Shape, engine_logprobs: bool = False) -> dict[str, Any]:
    """Our GRPO steps; ``engine_logprobs`` makes the engine score every sampled token as it did before the
    trainer learnt to ask for those scores only when its update reads them (the before/after comparison)."""
    from dataclasses import replace

    import torch

    from components.training.engines.rollout import HFRolloutEngine, SamplingParams
    from components.training.grpo.trainer import GRPOTrainer
    from components.training.model import LoRASettings, build_policy
    from components.training.params import GRPOParams

    torch.manual_seed(SEED)
    policy = build_policy(build_model(case, tokenizer), lora=LoRASettings(r=LORA_R, alpha=LORA_ALPHA,
                                                                          target_modules=TARGETS))
    gen_clock, reward_clock, counted = Clock(), Clock(), []

    class TimedEngine(HFRolloutEngine):
        def generate(self, prompts, sampling):
            if engine_logprobs:
                sampling = replace(sampling, logprobs=True)
            with gen_clock:
                gens = super().generate(prompts, sampling)
            counted.append(sum(len(g.token_ids) for g in gens))
            return gens

    def reward(episodes, ctx):
        with reward_clock:
            return [even_fraction(e.response_ids) for e in episodes]

    config = GRPOParams(group_size=shape.group, prompts_per_step=shape.prompts, kl_coef=KL, clip_eps=CLIP,
                        loss_agg="token_mean", lr=LR, max_new_tokens=shape.completion_len, checkpoint_every=0,
                        temperature=1.0, top_p=1.0, top_k=0, max_grad_norm=1.0)
    sampling = SamplingParams(max_new_tokens=shape.completion_len, temperature=1.0)
    engine = TimedEngine(policy.model, tokenizer, pad_token_id=tokenizer.pad_token_id)
    trainer = GRPOTrainer(policy, engine, reward, prompts, config, sampling=sampling,
                          pad_token_id=tokenizer.pad_token_id, seed=SEED)
    trainer.step()  # warm-up
    gen_clock.take(), reward_clock.take(), counted.clear()
    steps = []
    for _ in range(shape.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        trainer.step()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        (gw, gc), (rw, rc) = gen_clock.take(), reward_clock.take()
        steps.append({"step_s": wall, "step_cpu_s": cpu, "generate_s": gw, "generate_cpu_s": gc, "reward_s": rw,
                      "update_s": wall - gw - rw, "update_cpu_s": cpu - gc - rc, "tokens": counted.pop()})
    return summarise(steps)


def no_checkpointing(config_class) -> dict:
    """Activation recomputation off, under the name the installed transformers reads (transformers 5 renamed
    ``gradient_checkpointing`` to ``activation_checkpointing`` and warns on the old one)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_class)}
    return {"activation_checkpointing": False} if "activation_checkpointing" in names else {"gradient_checkpointing": False}


def trl_grpo(case: str, tokenizer, prompts: list[str], shape: Shape, workdir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(SEED)
    model = build_model(case, tokenizer)
    gen_clock, reward_clock, counted = Clock(), Clock(), []

    def even_reward(completions, completion_ids, **kwargs):
        with reward_clock:
            counted.append(sum(len(c) for c in completion_ids))
            return [even_fraction(c) for c in completion_ids]

    args = GRPOConfig(
        output_dir=str(workdir / "trl-grpo"), use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=10_000, seed=SEED, bf16=False, fp16=False,
        per_device_train_batch_size=shape.prompts * shape.group, gradient_accumulation_steps=1,
        num_generations=shape.group, max_completion_length=shape.completion_len,
        generation_kwargs={"min_new_tokens": shape.completion_len},
        temperature=1.0, top_p=1.0, top_k=0, beta=KL, epsilon=CLIP, loss_type="dapo", scale_rewards="group",
        num_iterations=1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, max_steps=shape.steps + 1, dataloader_num_workers=0, use_vllm=False,
        log_completions=False, **no_checkpointing(GRPOConfig),
    )
    peft = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(TARGETS),
                      bias="none", task_type="CAUSAL_LM")
    data = Dataset.from_dict({"prompt": prompts})
    trainer = GRPOTrainer(model=model, reward_funcs=even_reward, args=args, train_dataset=data,
                          processing_class=tokenizer, peft_config=peft)
    generate = trainer._generate_single_turn

    def timed_generate(*a, **k):
        with gen_clock:
            return generate(*a, **k)

    trainer._generate_single_turn = timed_generate
    steps: list[dict[str, float]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            gen_clock.take(), reward_clock.take()
            self.w0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            wall, cpu = time.perf_counter() - self.w0, time.process_time() - self.c0
            (gw, gc), (rw, rc) = gen_clock.take(), reward_clock.take()
            steps.append({"step_s": wall, "step_cpu_s": cpu, "generate_s": gw, "generate_cpu_s": gc,
                          "reward_s": rw, "update_s": wall - gw - rw, "update_cpu_s": cpu - gc - rc,
                          "tokens": counted.pop()})

    trainer.add_callback(Timer())
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    if len(steps) != shape.steps + 1:
        raise RuntimeError(f"TRL GRPO ran {len(steps)} steps, expected {shape.steps + 1}")
    return summarise(steps[1:])


# ----------------------------------------------------------------------------- SFT


def sft_rows(tokenizer, shape: Shape) -> list[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) rows: prompt tokens (no loss) then completion tokens (loss), all the same length."""
    texts = make_prompts(tokenizer, shape.sft_rows, shape.sft_prompt_len + shape.sft_completion_len, seed=SEED + 1)
    rows = []
    for t in texts:
        ids = tokenizer.encode(t, add_special_tokens=False)
        rows.append((ids, [0] * shape.sft_prompt_len + [1] * shape.sft_completion_len))
    return rows


def ours_sft(case: str, tokenizer, rows, shape: Shape) -> dict[str, Any]:
    import torch

    from components.training.model import LoRASettings, build_policy
    from components.training.params import SFTParams
    from components.training.sft.examples import SFTExample
    from components.training.sft.trainer import SFTTrainer

    torch.manual_seed(SEED)
    policy = build_policy(build_model(case, tokenizer), lora=LoRASettings(r=LORA_R, alpha=LORA_ALPHA,
                                                                          target_modules=TARGETS))
    config = SFTParams(lr=LR, batch_size=shape.sft_batch, max_length=max(16, len(rows[0][0])), epochs=100,
                       loss_agg="token_mean", max_grad_norm=1.0)
    examples = [SFTExample(list(ids), list(mask)) for ids, mask in rows]
    trainer = SFTTrainer(policy, examples, config, pad_token_id=tokenizer.pad_token_id, seed=SEED)
    trainer.step()  # warm-up
    steps = []
    for _ in range(shape.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        m = trainer.step()
        steps.append({"step_s": time.perf_counter() - w0, "step_cpu_s": time.process_time() - c0,
                      "trained_tokens": m["tokens"], "tokens": shape.sft_batch * len(rows[0][0])})
    return summarise(steps)


def trl_sft(case: str, tokenizer, rows, shape: Shape, workdir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(SEED)
    model = build_model(case, tokenizer)
    args = SFTConfig(
        output_dir=str(workdir / "trl-sft"), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
        logging_steps=10_000, seed=SEED, bf16=False, fp16=False, per_device_train_batch_size=shape.sft_batch,
        gradient_accumulation_steps=1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, max_steps=shape.steps + 1, max_length=len(rows[0][0]),
        completion_only_loss=True, packing=False, padding_free=False, dataloader_num_workers=0,
        dataset_num_proc=None, **no_checkpointing(SFTConfig),
    )
    peft = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(TARGETS),
                      bias="none", task_type="CAUSAL_LM")
    data = Dataset.from_dict({"input_ids": [r[0] for r in rows], "completion_mask": [r[1] for r in rows]})
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                             peft_config=peft)
    trained, batch_tokens = [], []
    compute_loss = trainer.compute_loss

    def counting_loss(model, inputs, *a, **k):
        trained.append(int((inputs["labels"][:, 1:] != -100).sum()))
        batch_tokens.append(int(inputs["attention_mask"].sum()))
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = counting_loss
    steps: list[dict[str, float]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.w0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            steps.append({"step_s": time.perf_counter() - self.w0, "step_cpu_s": time.process_time() - self.c0,
                          "trained_tokens": trained.pop(), "tokens": batch_tokens.pop()})

    trainer.add_callback(Timer())
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    if len(steps) != shape.steps + 1:
        raise RuntimeError(f"TRL SFT ran {len(steps)} steps, expected {shape.steps + 1}")
    return summarise(steps[1:])


# ----------------------------------------------------------------------------- driving


METRICS = {  # (kind, metric in the summary, name in the results, check the token counts under this key)
    "grpo": [("tokens_per_s", "grpo_step_tokens_per_s"), ("update_tokens_per_s", "grpo_update_tokens_per_s"),
             ("tokens_per_cpu_s", "grpo_step_tokens_per_cpu_s"),
             ("update_tokens_per_cpu_s", "grpo_update_tokens_per_cpu_s")],
    "sft": [("tokens_per_s", "sft_step_tokens_per_s"), ("tokens_per_cpu_s", "sft_step_tokens_per_cpu_s")],
}


def versions() -> dict[str, str | None]:
    out = {}
    for pkg in ("trl", "torch", "transformers", "peft", "accelerate"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def run_case(case: str, shape: Shape, tokenizer, workdir: Path, kinds: list[str],
             before: bool = False) -> tuple[list, list, list]:
    """Result rows, ratio rows and token-count checks of one model case; ``before`` adds the side
    ``ours_before``: our GRPO with the engine scoring every sampled token (as before 2026-11-27)."""
    results, ratios, checks = [], [], []
    prompts = make_prompts(tokenizer, max(4, shape.prompts), shape.prompt_len, seed=SEED)
    rows = sft_rows(tokenizer, shape) if "sft" in kinds else []
    for kind in kinds:
        if kind == "grpo":
            sides = {"ours": ours_grpo(case, tokenizer, prompts, shape),
                     "trl": trl_grpo(case, tokenizer, prompts, shape, workdir)}
            if before:
                sides["ours_before"] = ours_grpo(case, tokenizer, prompts, shape, engine_logprobs=True)
            count_key, expected = "token_counts", shape.prompts * shape.group * shape.completion_len
        else:
            sides = {"ours": ours_sft(case, tokenizer, rows, shape),
                     "trl": trl_sft(case, tokenizer, rows, shape, workdir)}
            count_key, expected = "trained_token_counts", shape.sft_batch * shape.sft_completion_len
        counts = {side: [int(n) for n in s[count_key]] for side, s in sides.items()}
        same = all(c == [expected] * shape.steps for c in counts.values())
        checks.append({"case": case, "kind": kind, **counts, "expected_per_step": expected, "same": same})
        for side, summary in sides.items():
            for key, name in METRICS[kind]:
                results.append({"side": side, "case": case, "metric": name, "value": summary[key]})
            results.append({"side": side, "case": case, "metric": f"{kind}_step_s_median", "value": summary["step_s"]})
            if kind == "grpo":
                for part in ("generate_s", "generate_cpu_s", "reward_s", "update_s", "update_cpu_s"):
                    results.append({"side": side, "case": case, "metric": f"grpo_{part}_median",
                                    "value": summary[part]})
        for key, name in METRICS[kind]:
            ratio = sides["ours"][key] / sides["trl"][key]
            ratios.append({"case": case, "metric": name, "ours": sides["ours"][key], "trl": sides["trl"][key],
                           "ratio_ours_over_trl": ratio, "target": TARGET_RATIO, "met": ratio >= TARGET_RATIO})
            if "ours_before" in sides:
                ratios[-1]["ours_before"] = sides["ours_before"][key]
                ratios[-1]["ratio_ours_before_over_trl"] = sides["ours_before"][key] / sides["trl"][key]
    return results, ratios, checks


def print_table(ratios: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    before = any("ours_before" in r for r in ratios)
    extra = f" {'before':>10} {'before/trl':>10}" if before else ""
    print(f"{'case':6} {'metric':30} {'ours':>9} {'trl':>9} {'ours/trl':>9}{extra}  target 1.0")
    for r in ratios:
        cells = ""
        if before:
            cells = (f" {r['ours_before']:>10.1f} {r['ratio_ours_before_over_trl']:>9.2f}x" if "ours_before" in r
                     else f" {'':>10} {'':>10}")
        print(f"{r['case']:6} {r['metric']:30} {r['ours']:>9.1f} {r['trl']:>9.1f} {r['ratio_ours_over_trl']:>8.2f}x"
              f"{cells}  {'met' if r['met'] else 'not met'}")
    for c in checks:
        counts = ", ".join(f"{k} {v}" for k, v in c.items() if k in ("ours", "trl", "ours_before"))
        print(f"{c['case']:6} {c['kind']} tokens per timed step: {counts} "
              f"(expected {c['expected_per_step']}): {'same' if c['same'] else 'DIFFERENT'}")


def main(argv: list[str] | None = None) -> int:
    """How it measures, and what it writes.

    Models: random Qwen2s over the embedded 0.5B's real tokenizer (151,936-token vocabulary; read from the GGUF the
    project already caches, nothing downloaded). ``tiny`` is ``tiny-qwen2`` (hidden 32, 2 layers): the LM head and
    log-softmax over the vocabulary dominate. ``small`` is hidden 256, 4 layers, MLP 704: the decoder matmuls weigh
    more. Each side gets its own copy of the same weights (TRL patches the model's forward with its fused LM head).

    GRPO: ``--prompts`` prompts of exactly ``--prompt-len`` tokens x ``--group`` completions of exactly
    ``--completion-len`` tokens (no EOS on our side: the model's generation config has none; TRL: ``min_new_tokens``),
    the same reward (the fraction of even token ids), LoRA r=8 alpha=16 on all seven Qwen2 projections, KL coefficient
    5e-3 (TRL ``beta``; both take the reference as the base with the adapter disabled), clip 0.2, token-mean loss
    (TRL ``loss_type="dapo"``), one optimizer step per step, temperature 1, no top-k/top-p, activations kept (TRL's
    configs default to ``gradient_checkpointing=True``; ours to False; both sides run without it here). Metrics per side: tokens/s of
    the whole step (generation + reward + update; generated tokens over step time) and of the update alone (the step
    minus the time in generation and reward: the reference pass, forward, backward and the optimizer). SFT: ``--sft-rows``
    rows of prompt + completion tokens, loss on the completion, batch ``--sft-batch``; tokens/s over the batch's tokens.
    Each side takes one warm-up step, then ``--steps`` timed steps (median); torch threads are fixed (``--threads``).

    Checks: both sides must report the same generated (GRPO) and trained (SFT) token counts per step, counted on each
    side from what it actually produced (the reward's completion ids for TRL, the engine's generations for us; the
    labels TRL trained on, the loss mask we trained on); a mismatch is an error. Prints a table and writes
    ``perf/results/bench_trl.json`` (rows of side, case, metric, value; ratios ours/TRL with target 1.0 and met or
    not; versions; load average). Without trl installed it prints why and exits 0.
    """
    from components.io import write_json
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="tiny,small", help=f"comma-separated, from {sorted(CASES)}")
    parser.add_argument("--kinds", default="grpo,sft", help="comma-separated: grpo, sft")
    parser.add_argument("--quick", action="store_true", help="the smallest shapes and one timed step")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per side after one warm-up step")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    parser.add_argument("--before", action="store_true",
                        help="also run our GRPO with the engine scoring every sampled token (before 2026-11-27)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("bench_trl: skipped, trl is not installed (pip install -e '.[perf]')")
        return 0
    cases, kinds = [c for c in args.cases.split(",") if c], [k for k in args.kinds.split(",") if k]
    for c in cases:
        if c not in CASES:
            parser.error(f"unknown case {c!r}; use one of {sorted(CASES)}")
    for k in kinds:
        if k not in METRICS:
            parser.error(f"unknown kind {k!r}; use grpo or sft")
    shape = QUICK if args.quick else FULL
    if args.steps is not None:
        shape = Shape(**{**shape.__dict__, "steps": args.steps})

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    tokenizer = load_tokenizer()
    results, ratios, checks = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        for case in cases:
            r, q, c = run_case(case, shape, tokenizer, Path(tmp), kinds, before=args.before)
            results += r
            ratios += q
            checks += c
    print_table(ratios, checks)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    report = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python perf/bench_trl.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": head,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "torch_threads": args.threads, "load_average_1m_start": load0,
                    "load_average_1m_end": os.getloadavg()[0]},
        "versions": versions(),
        "shape": shape.__dict__,
        "models": {c: {**CASES[c], "vocab_size": len(tokenizer)} for c in cases},
        "lora": {"r": LORA_R, "alpha": LORA_ALPHA, "target_modules": list(TARGETS)},
        "wall_s": time.perf_counter() - t0,
        "results": results,
        "ratios": ratios,
        "token_checks": checks,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")
    if not all(c["same"] for c in checks):
        print("bench_trl: the two sides did not train on the same token counts", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
