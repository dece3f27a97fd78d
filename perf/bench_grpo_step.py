"""Time GRPO steps (rollout + reward + update) on CPU: step time, tokens/s and peak RSS, optionally side by
side with an older git revision in the same invocation.

Run::

    python perf/bench_grpo_step.py                          # this working tree, tiny random Qwen2s (< 1 min)
    python perf/bench_grpo_step.py --baseline-rev a3fd23f   # the same on a3fd23f too, with ratios (repeatable)
    RUBRICFLOW_POLICY_GGUF=/path/to/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        python perf/bench_grpo_step.py                      # and the embedded 0.5B policy (minutes)
    RUBRICFLOW_POLICY_GGUF=... python perf/bench_grpo_step.py --cases agent-update --steps 2 --baseline-rev HEAD
                                                            # the 0.5B's update on agent-shaped rows (~20 min)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "grpo_step.json"
CASES = ("tiny", "tiny-32k")
UPDATE_CASE = "agent-update"


# ----------------------------------------------------------------------------- measuring (in the worker)


def _rss_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class _CountingEngine:
    """Passes calls through to the engine; counts the tokens it generates and the CPU time it takes."""

    def __init__(self, engine: Any):
        self._engine, self.tokens, self.cpu_s = engine, 0, 0.0

    def generate(self, prompts: Any, sampling: Any) -> Any:
        c0 = time.process_time()
        gens = self._engine.generate(prompts, sampling)
        self.cpu_s += time.process_time() - c0
        self.tokens += sum(len(g.token_ids) for g in gens)
        return gens

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def _time_steps(trainer: Any, engine: _CountingEngine, steps: int) -> dict[str, float]:
    timings: list[dict[str, float]] = []
    trainer.on_metrics = lambda step, m: timings.append(m)
    trainer.step()  # warm-up
    timings.clear()
    rss_before = _rss_mib("VmRSS")
    exact_peak = _reset_peak_rss()
    walls, cpus, rollout_cpus, tokens = [], [], [], []
    for _ in range(steps):
        engine.tokens, engine.cpu_s = 0, 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.step()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        rollout_cpus.append(engine.cpu_s)
        tokens.append(engine.tokens)
    peak = _rss_mib("VmHWM") if exact_peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    step_s = statistics.median(walls)
    out = {
        "step_s": step_s,
        "step_cpu_s": statistics.median(cpus),
        "rollout_cpu_s": statistics.median(rollout_cpus),
        "update_cpu_s": statistics.median(c - r for c, r in zip(cpus, rollout_cpus, strict=True)),
        "rollout_s": statistics.median(t.get("time/rollout", float("nan")) for t in timings),
        "update_s": statistics.median(t.get("time/update", float("nan")) for t in timings),
        "tokens_per_step": statistics.median(tokens),
        "tokens_per_s": sum(tokens) / sum(walls),
        "peak_rss_mib": peak,
        "rss_growth_mib": None if rss_before is None or peak is None else peak - rss_before,
        "peak_rss_exact": exact_peak,
    }
    return out


def _reward(items: list[Any], ctx: Any = None) -> list[float]:
    """Fraction of even token ids: cheap, and varied enough that groups get non-zero advantages. Takes
    samples (``reward_fn(samples)``, up to a3fd23f) or episodes and a context (``reward_fn(episodes, ctx)``)."""
    return [sum(t % 2 == 0 for t in s.response_ids) / max(len(s.response_ids), 1) for s in items]


def make_trainer(
    policy: Any,
    engine: Any,
    reward: Any,
    prompts: list[Any],
    *,
    group_size: int,
    prompts_per_step: int,
    lr: float,
    sampling: Any,
) -> Any:
    """The same GRPO hyper-parameters under either trainer API: ``GRPOConfig`` (up to a3fd23f) or
    ``params.grpo`` (``GRPOParams``). Each side keeps its own defaults for how old log-probs are obtained."""
    from components.training.grpo import trainer as tr

    common = {
        "group_size": group_size,
        "prompts_per_step": prompts_per_step,
        "kl_coef": 5e-3,
        "clip_eps": 0.2,
        "loss_agg": "token_mean",
    }
    if hasattr(tr, "GRPOConfig"):
        config = tr.GRPOConfig(learning_rate=lr, sampling=sampling, **common)
        return tr.GRPOTrainer(policy, engine, reward, prompts, config)
    from components.training.params import GRPOParams

    config = GRPOParams(lr=lr, max_new_tokens=sampling.max_new_tokens, checkpoint_every=0, **common)
    return tr.GRPOTrainer(policy, engine, reward, prompts, config, sampling=sampling)


class _IdTokenizer:
    """Decodes id ``i`` as one letter (``i % 26``): stop strings work on a vocabulary of any size."""

    pad_token_id, eos_token_id = 0, 1

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids if i > 1)


def bench_case(case: str, steps: int) -> dict[str, Any]:
    import torch

    from components.training.engines.rollout import HFRolloutEngine, SamplingParams
    from components.training.model import LoRASettings, build_policy
    from components.training.tiny import CharTokenizer, tiny_qwen2

    torch.manual_seed(0)
    if case == "tiny":
        tok = CharTokenizer("abcdefghijklmn")
        model = tiny_qwen2(tok.vocab_size, seed=0)
        prompts: list[Any] = ["abc", "bcd", "cde", "def"]
        sampling = SamplingParams(max_new_tokens=8)
        batch = "2 prompts x G=8, 8 new tokens"
    elif case == "tiny-32k":
        tok = _IdTokenizer()
        vocab = 32768
        model = tiny_qwen2(vocab, hidden_size=64, intermediate_size=128, initializer_range=0.02, seed=0)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(2, vocab, (48,), generator=g).tolist() for _ in range(4)]
        sampling = SamplingParams(max_new_tokens=24, stop_strings=("zzz",))
        batch = "2 prompts (48 tok) x G=8, 24 new tokens"
        steps = max(1, min(steps, 3))
    else:
        raise ValueError(f"unknown case {case!r}; use one of {CASES}")
    policy = build_policy(model, lora=LoRASettings(r=8, alpha=16))
    engine = _CountingEngine(HFRolloutEngine(policy.model, tok))
    trainer = make_trainer(
        policy, engine, _reward, prompts, group_size=8, prompts_per_step=2, lr=1e-2, sampling=sampling
    )
    return {"case": case, "batch": batch, "timed_steps": steps, **_time_steps(trainer, engine, steps)}


def bench_gguf(path: Path, steps: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from components.training.engines.rollout import HFRolloutEngine, SamplingParams
    from components.training.model import LoRASettings, build_policy

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    t0 = time.perf_counter()
    policy = build_policy(path.parent, gguf_file=path.name, lora=LoRASettings(r=8, alpha=16))
    load_s = time.perf_counter() - t0
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Explain in two sentences what a search engine index is."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    engine = _CountingEngine(HFRolloutEngine(policy.model, tok))
    trainer = make_trainer(
        policy,
        engine,
        _reward,
        [prompt],
        group_size=4,
        prompts_per_step=1,
        lr=1e-5,
        sampling=SamplingParams(max_new_tokens=128),
    )
    return {
        "case": "gguf-0.5b",
        "model": f"{path.name} (dequantized, fp32)",
        "batch": "1 prompt x G=4, <=128 new tokens",
        "load_s": load_s,
        **_time_steps(trainer, engine, steps),
    }


def agent_rows(vocab: int, seed: int = 0) -> Any:
    """Two search-agent-shaped rows (prompt, then policy replies and tool observations in turn)."""
    import torch

    from components.training.engines.rollout import RolloutSegment, assemble

    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(100, vocab - 100, (n,), generator=g).tolist()

    rows = []
    for turns in (4, 6):
        segments = [RolloutSegment(ids(250), trainable=False)]
        for _ in range(turns):
            segments += [RolloutSegment(ids(60), trainable=True), RolloutSegment(ids(200), trainable=False)]
        rows.append(segments)
    return assemble(rows, pad_token_id=0)


def bench_update(path: Path, steps: int) -> dict[str, Any]:
    import torch

    from components.training.engines.rollout import SamplingParams
    from components.training.model import LoRASettings, build_policy

    t0 = time.perf_counter()
    policy = build_policy(path.parent, gguf_file=path.name, lora=LoRASettings(r=8, alpha=16),
                          gradient_checkpointing=True)
    load_s = time.perf_counter() - t0
    from components.params_load import load_params
    from components.training.grpo import trainer as tr
    from components.training.params import GRPOParams

    config = GRPOParams(**{**load_params("params.yaml").grpo.model_dump(), "checkpoint_every": 0})
    trainer = tr.GRPOTrainer(policy, None, _reward, [[1]], config, sampling=SamplingParams(max_new_tokens=1),
                             pad_token_id=0)
    batch = agent_rows(policy.model.get_output_embeddings().weight.shape[0])
    advantages = torch.where(batch.loss_mask.bool(), torch.tensor([[1.0], [-1.0]]), torch.zeros(()))
    exact_peak = _reset_peak_rss()
    walls, cpus = [], []
    for _ in range(steps):
        t1, c1 = time.perf_counter(), time.process_time()
        trainer.update(batch, advantages)
        walls.append(time.perf_counter() - t1)
        cpus.append(time.process_time() - c1)
    peak = _rss_mib("VmHWM") if exact_peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = int(batch.attention_mask.sum())
    return {
        "case": UPDATE_CASE,
        "model": f"{path.name} (dequantized, fp32)",
        "batch": f"2 agent rows, {tokens} tokens, {int(batch.loss_mask.sum())} with loss",
        "timed_steps": steps,
        "load_s": load_s,
        "step_s": statistics.median(walls),
        "step_cpu_s": statistics.median(cpus),
        "update_s": statistics.median(walls),
        "update_cpu_s": statistics.median(cpus),
        "tokens_per_step": tokens,
        "tokens_per_s": tokens * len(walls) / sum(walls),
        "peak_rss_mib": peak,
        "peak_rss_exact": exact_peak,
    }


def worker(cases: list[str], steps: int, threads: int | None) -> list[dict[str, Any]]:
    import torch

    import components

    rows = []
    for case in cases:
        if case.startswith(("gguf:", UPDATE_CASE + ":")):
            if threads:
                torch.set_num_threads(threads)
            name, gguf = case.split(":", 1)
            bench = bench_update if name == UPDATE_CASE else bench_gguf
            rows.append(bench(Path(gguf), max(1, min(steps, 3))))
            continue
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny matrices: intra-op threads only add overhead and jitter
        try:
            rows.append(bench_case(case, steps))
        finally:
            torch.set_num_threads(before)
    code = str(Path(components.__file__).resolve().parents[1])
    return [{**r, "code_root": code} for r in rows]


# ----------------------------------------------------------------------------- driving (in the parent)


def run_worker(code_root: Path, cases: list[str], steps: int, threads: int | None) -> list[dict[str, Any]]:
    """Run :func:`worker` in a fresh interpreter that imports ``components`` from ``code_root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code_root), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(cases), "--steps", str(steps)]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=code_root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker for {code_root} failed:\n{proc.stderr[-4000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in rows:
        if Path(r["code_root"]) != code_root.resolve():
            raise RuntimeError(f"worker imported components from {r['code_root']}, not {code_root}")
        del r["code_root"]  # checked; a machine path does not belong in the results file
    return rows


def export_revision(rev: str, dest: Path) -> str:
    """Unpack ``rev`` of this repository into ``dest``; return its short hash."""
    short = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return short


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any, spec: str) -> str:
    return "-" if _missing(value) else format(value, spec)


# (key, header, format) of the table's columns; the JSON has every measured value.
COLUMNS = (
    ("step_s", "step s", ".3f"),
    ("step_cpu_s", "cpu s", ".3f"),
    ("rollout_cpu_s", "rollout cpu", ".3f"),
    ("update_cpu_s", "update cpu", ".3f"),
    ("tokens_per_step", "tok/step", ".0f"),
    ("tokens_per_s", "tok/s", ".0f"),
    ("peak_rss_mib", "peak RSS MiB", ".0f"),
    ("rss_growth_mib", "RSS growth", ".0f"),
)
RATIO_KEYS = tuple(k for k, _, _ in COLUMNS if k != "tokens_per_step")


def print_table(rows: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> None:
    widths = [max(len(h), 8) for _, h, _ in COLUMNS]
    header = f"{'case':10} {'code':12} " + " ".join(
        f"{h:>{w}}" for (_, h, _), w in zip(COLUMNS, widths, strict=True)
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        cells = [f"{_fmt(r.get(k), f):>{w}}" for (k, _, f), w in zip(COLUMNS, widths, strict=True)]
        print(f"{r['case'][:10]:10} {r['code']:12} " + " ".join(cells))
    for q in ratios:
        cells = [
            f"{'' if k not in q else '-' if _missing(q[k]) else format(q[k], '.2f') + 'x':>{w}}"
            for (k, _, _), w in zip(COLUMNS, widths, strict=True)
        ]
        print(f"{q['case'][:10]:10} {'/' + q['code'][:11]:12} " + " ".join(cells))
    if ratios:
        print("/CODE = that code / the first baseline (below 1x: faster or smaller; tok/s above 1x: faster)")
        print("cpu = this process's CPU time, less disturbed by other processes than wall time (step s)")


def _ratio(new: Any, old: Any) -> float | None:
    if _missing(new) or _missing(old) or not old:
        return None
    return new / old


def main() -> None:
    """How it measures, and what it writes.

    Cases: ``tiny`` (16-token vocabulary, 2 prompts x G=8, 8 new tokens: mostly fixed overhead) and
    ``tiny-32k`` (a 64-wide Qwen2 with a 32k vocabulary, 48-token prompts, 24 new tokens and a stop string,
    at most 3 timed steps: the vocabulary-sized parts, LM head and log-softmax, dominate as in real models).
    ``agent-update`` (needs ``RUBRICFLOW_POLICY_GGUF``) times the update alone, as ``train_policy`` runs it on the
    embedded profile (the 0.5B in fp32 with LoRA r=8, gradient checkpointing, and the revision's own
    ``params.yaml`` ``grpo`` block: today the k3 KL at 1e-3, so a reference pass, and 4096-token micro-batches), on a
    fixed batch shaped like search-agent episodes: 2 rows of a 250-token
    prompt and 4 or 6 turns of a 60-token policy reply (the loss) and a 200-token tool observation, advantages
    +1 and -1; no warm-up (each update takes minutes), ``--steps`` updates timed.

    Each revision runs in its own subprocess (``--worker``) with ``PYTHONPATH`` at its code: the working tree,
    or ``git archive REV`` unpacked in a temporary folder (read-only for the shared repository). The measuring
    code is this file on both sides, so both run the same benchmark. Per case: median step time over
    ``--steps`` timed steps after one warm-up step (wall, and this process's CPU time, which other processes
    on the machine disturb much less), its rollout/update split (CPU time inside the engine's ``generate`` and
    the rest; the trainer's wall-clock split is in the JSON), generated tokens per step and
    per second, and peak RSS during the timed steps (the kernel's high-water mark, reset after warm-up;
    ``rss growth`` is that peak minus the RSS before the timed steps). Other processes on the machine change
    the numbers a lot; the JSON records the 1-minute load average. Prints a table and writes JSON to
    ``perf/results/grpo_step.json`` (``--out``).
    """
    from components.io import write_json  # here, not at the top: a --worker imports a revision's code
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per case, after one warm-up step")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the 0.5B GGUF case")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {CASES}")
    parser.add_argument("--baseline-rev", action="append", default=[],
                        help="also run this git revision (repeatable; ratios are against the first)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker is not None:
        print(json.dumps(worker(args.worker.split(","), args.steps, args.threads)))
        return

    cases = [c for c in args.cases.split(",") if c]
    gguf = os.environ.get("RUBRICFLOW_POLICY_GGUF")
    if UPDATE_CASE in cases:
        if not gguf:
            parser.error(f"--cases {UPDATE_CASE} needs RUBRICFLOW_POLICY_GGUF (the embedded 0.5B policy's file)")
        cases = [f"{UPDATE_CASE}:{Path(gguf).resolve()}" if c == UPDATE_CASE else c for c in cases]
    elif gguf:
        cases.append(f"gguf:{Path(gguf).resolve()}")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    baselines: list[str] = []
    for rev in args.baseline_rev:
        with tempfile.TemporaryDirectory(prefix="rubricflow-baseline-") as tmp:
            short = export_revision(rev, Path(tmp))
            baselines.append(short)
            rows += [{**r, "code": short} for r in run_worker(Path(tmp), cases, args.steps, args.threads)]
    rows += [{**r, "code": "working tree"} for r in run_worker(REPO, cases, args.steps, args.threads)]
    ratios = []
    if baselines:
        for new in (r for r in rows if r["code"] != baselines[0]):
            old = next(r for r in rows if r["case"] == new["case"] and r["code"] == baselines[0])
            ratios.append({"case": new["case"], "code": new["code"],
                           **{k: _ratio(new.get(k), old.get(k)) for k in RATIO_KEYS}})
    order = {c: i for i, c in enumerate(dict.fromkeys(r["case"] for r in rows))}
    rows.sort(key=lambda r: order[r["case"]])
    print_table(rows, ratios)

    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0],
        },
        "working_tree_head": head,
        "baseline_rev": baselines[0] if baselines else None,
        "baseline_revs": baselines,
        "timed_steps": args.steps,
        "wall_s": time.perf_counter() - t0,
        "results": rows,
        "ratios": ratios,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
