"""SFT steps of the embedded 0.5B on the warm start's own rows with each speed option, side by side. Activation
recomputation off, on, and on only for micro-batches of at least ``sft.checkpoint_min_tokens`` padded tokens, and
the last again with the frozen base's matmuls in int8 (``sft.int8_base``) and with each micro-batch as one
shared-prefix pack (``sft.prefix_packing``), in one process and on the same rows.

Run (after ``python -m tasks.sft_data``; a few minutes on 2 cores)::

    python perf/bench_sft_step.py [--steps 3] [--method sft] [--set sft.batch_size=2 ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "sft_step.json"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    """How it measures, and what it writes.

    Each configuration builds a fresh LoRA policy on the same weights and takes one warm-up step and then
    ``--steps`` timed steps over the same rows (a seeded sampler, so every configuration sees the same
    batches). Prints median seconds per step, the ratio to "off", and the peak RSS growth over the timed steps;
    writes ``perf/results/sft_step.json``. The recomputation settings change speed and memory, never the update
    (tests/training/test_sft_checkpointing.py), nor do packs, to float rounding (tests/training/test_sft_packing.py;
    each row's ``losses`` are in the JSON); the int8 base changes the update by int8 rounding
    (tests/training/test_int8_base.py, perf/bench_int8_base.py). ``pass_tokens``: tokens through the model.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--method", default="sft")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.chdir(REPO)

    import torch

    from components.io import read_jsonl, write_json
    from components.params_load import load_params
    from components.run_spec import run_spec
    from components.schemas import Trajectory
    from components.training.model import LoRASettings, build_policy, load_trainable_policy
    from components.training.sft.trainer import SFTTrainer
    from components.training.sft.trajectories import warm_start_examples
    from components.training.speed.int8_base import restore_fp32

    params = load_params(REPO / "params.yaml", overrides=args.overrides)
    trajectories = read_jsonl(run_spec(params).warm_start_folder("sft_data", args.method) / "trajectories.jsonl", Trajectory)
    model, tokenizer = load_trainable_policy(run_spec(params))
    examples = warm_start_examples(params.methods[args.method], params.agent, params.sft.max_length, trajectories,
                                   tokenizer)
    lengths = sorted(len(e.input_ids) for e in examples)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    threshold = params.sft.checkpoint_min_tokens or 2048
    configs = {"off": (False, 0, False, False), "on": (True, 0, False, False),
               f"on below {threshold} kept": (True, threshold, False, False),
               f"on below {threshold} kept, int8 base": (True, threshold, True, False),
               f"on below {threshold} kept, packed": (True, threshold, False, True)}
    rows = []
    for name, (checkpointing, min_tokens, int8_base, packing) in configs.items():
        model.load_state_dict(state)
        torch.manual_seed(params.seed)
        policy = build_policy(model, lora=LoRASettings(r=params.lora.r, alpha=params.lora.alpha),
                              gradient_checkpointing=checkpointing, int8_base=int8_base)
        config = params.sft.model_copy(update={"gradient_checkpointing": checkpointing,
                                               "checkpoint_min_tokens": min_tokens, "prefix_packing": packing})
        trainer = SFTTrainer(policy, examples, config, pad_token_id=tokenizer.pad_token_id or 0, seed=params.seed)
        trainer.step()
        before = rss_mib()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        times, tokens, pass_tokens, losses = [], 0, 0, []
        for _ in range(args.steps):
            started = time.perf_counter()
            metrics = trainer.step()
            times.append(time.perf_counter() - started)
            tokens += metrics["tokens"]
            pass_tokens += metrics["pass_tokens"]
            losses.append(metrics["loss"])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append({"config": name, "median_s": statistics.median(times), "steps": args.steps,
                     "trained_tokens": tokens, "pass_tokens": pass_tokens, "losses": losses,
                     "rss_before_mib": round(before),
                     "peak_growth_mib": round(max(0.0, peak - max(before, peak_before)))})
        restore_fp32(policy.model)  # the next configuration starts from the fp32 base again
        model = policy.model.unload() if hasattr(policy.model, "unload") else policy.model
        if checkpointing:
            model.gradient_checkpointing_disable()
    base = rows[0]["median_s"]
    print(f"rows: {len(examples)}, tokens per row: median {lengths[len(lengths) // 2]}, max {lengths[-1]}; "
          f"batch_size {params.sft.batch_size}; load {os.getloadavg()[0]:.2f}")
    print(f"{'recomputation':<40}{'s/step':>8}{'vs off':>8}{'pass tokens':>13}{'peak growth MiB':>17}")
    for r in rows:
        r["ratio_to_off"] = r["median_s"] / base
        print(f"{r['config']:<40}{r['median_s']:>8.1f}{r['ratio_to_off']:>8.2f}{r['pass_tokens']:>13.0f}"
              f"{r['peak_growth_mib']:>17}")
    write_json(args.out, {"method": args.method, "rows": len(examples), "row_tokens_median": lengths[len(lengths) // 2],
                          "row_tokens_max": lengths[-1], "loadavg_1m": os.getloadavg()[0], "results": rows},
               sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
