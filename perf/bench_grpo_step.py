"""Time one GRPO step (rollout + reward + update) on CPU, for the tiny model and optionally the embedded 0.5B.

Run::

    python benchmarks/bench_grpo_step.py          # tiny random Qwen2 only
    RUBRICFLOW_POLICY_GGUF=/path/to/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        python benchmarks/bench_grpo_step.py      # and the embedded 0.5B policy

Options: ``--steps N`` (timed steps after one warm-up step), ``--threads N`` (torch intra-op threads for
the 0.5B; the tiny model always runs on one), ``--out PATH``. Other processes on the machine change the
numbers a lot; the JSON records the 1-minute load average. Prints a table and writes JSON to
``benchmarks/results/grpo_step.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from components.training.model import LoRASettings, build_policy
from components.training.rollout import HFRolloutEngine, SamplingParams
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.training.trainer import GRPOConfig, GRPOTrainer

RESULTS = Path(__file__).parent / "results" / "grpo_step.json"


def _time_steps(trainer: GRPOTrainer, steps: int) -> dict[str, float]:
    timings: list[dict[str, float]] = []
    trainer.on_metrics = lambda step, m: timings.append(m)
    trainer.step()  # warm-up
    timings.clear()
    for _ in range(steps):
        trainer.step()
    keys = ("time/rollout", "time/reward", "time/update")
    out = {k.split("/")[1] + "_s": statistics.median(t[k] for t in timings) for k in keys}
    out["step_s"] = statistics.median(sum(t[k] for k in keys) for t in timings)
    out["tokens_per_step"] = statistics.median(t["tokens"] for t in timings)
    return out


def bench_tiny(steps: int) -> dict[str, object]:
    """Runs on one thread: intra-op threads only add overhead (and jitter) for matrices this small."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _bench_tiny(steps)
    finally:
        torch.set_num_threads(threads)


def _bench_tiny(steps: int) -> dict[str, object]:
    tok = CharTokenizer("abcdefghijklmn")
    target = tok.encode("e")[0]
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(tok.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
    config = GRPOConfig(
        group_size=8, prompts_per_step=2, learning_rate=1e-2, sampling=SamplingParams(max_new_tokens=8)
    )
    trainer = GRPOTrainer(
        policy,
        HFRolloutEngine(policy.model, tok),
        lambda samples: [
            sum(t == target for t in s.response_ids) / max(len(s.response_ids), 1) for s in samples
        ],
        ["abc", "bcd", "cde", "def"],
        config,
    )
    return {
        "model": "tiny-qwen2 (random, 32 wide, 2 layers)",
        "batch": "2 prompts x G=8, 8 new tokens",
        **_time_steps(trainer, steps),
    }


def bench_gguf(path: Path, steps: int) -> dict[str, object]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    t0 = time.perf_counter()
    policy = build_policy(path.parent, gguf_file=path.name, lora=LoRASettings(r=8, alpha=16))
    load_s = time.perf_counter() - t0
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Explain in two sentences what a search engine index is."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    config = GRPOConfig(group_size=4, learning_rate=1e-5, sampling=SamplingParams(max_new_tokens=128))
    trainer = GRPOTrainer(
        policy,
        HFRolloutEngine(policy.model, tok),
        lambda samples: [float(len(s.response_ids) % 7) for s in samples],
        [prompt],
        config,
    )
    return {
        "model": f"{path.name} (dequantized, fp32)",
        "batch": "1 prompt x G=4, <=128 new tokens",
        "load_s": load_s,
        **_time_steps(trainer, steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    rows = [bench_tiny(args.steps)]
    gguf = os.environ.get("RUBRICFLOW_POLICY_GGUF")
    if gguf:
        rows.append(bench_gguf(Path(gguf), max(1, min(args.steps, 3))))

    header = f"{'model':45} {'batch':34} {'rollout s':>9} {'update s':>9} {'step s':>8} {'tokens':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['model']:45} {r['batch']:34} {r['rollout_s']:9.3f} {r['update_s']:9.3f} {r['step_s']:8.3f} "
            f"{r['tokens_per_step']:7.0f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0],
        },
        "timed_steps": args.steps,
        "results": rows,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
