"""The lab nano's SFT step on its own corpus, padded micro-batches against the lab's settings and packs, side by side.

Each configuration starts from the same random init on the same seeded batches, in one process; the first is the
ratios' base. The loss is over the whole batch's counts in every case, so the options change speed, not the update
(to float rounding: each row's losses are in the JSON).

Run (a minute or two on one thread; nothing to build first)::

    python perf/bench_lab_sft.py [--steps 8] [--threads 1] [--configs 2,lab,4:pack] [--set sft.batch_size=16 ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "lab_sft.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--configs", default="2,lab,4:pack,16:pack", help="micro-batch sizes to time, comma-separated; "
                        "`:pack` runs each micro-batch as one pack, `lab` is the lab's own sft settings")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.chdir(REPO)

    import torch

    from components.io import write_json
    from components.lab.nano import nano_qwen2
    from components.lab.policy import nano_examples, sft_corpus
    from components.params_load import load_params
    from components.training.model import build_policy
    from components.training.sft.trainer import SFTTrainer

    torch.set_num_threads(args.threads)
    params = load_params(REPO / "params.yaml", overlays=["lab"], overrides=args.overrides)
    tok, examples = nano_examples(sft_corpus(params), params.lab.nano.vocab_size, params.sft.max_length)
    batch = params.sft.batch_size
    configs = {}
    for spec in args.configs.split(","):
        size, _, pack = spec.partition(":")
        lab = size == "lab"
        micro, packing = (params.sft.micro_batch_size, params.sft.prefix_packing) if lab else (int(size), bool(pack))
        configs[f"micro {micro}, {'packed' if packing else 'padded'}{' (the lab)' if lab else ''}"] = (micro, packing)
    rows = []
    for name, (micro, packing) in configs.items():
        model = nano_qwen2(params.lab.nano, tok, seed=0)
        policy = build_policy(model, lora=None)
        config = params.sft.model_copy(update={"micro_batch_size": micro, "prefix_packing": packing})
        trainer = SFTTrainer(policy, examples, config, pad_token_id=tok.pad_token_id, seed=0)
        trainer.step()
        times, pass_tokens, losses = [], 0.0, []
        for _ in range(args.steps):
            started = time.perf_counter()
            metrics = trainer.step()
            times.append(time.perf_counter() - started)
            pass_tokens += metrics["pass_tokens"]
            losses.append(metrics["loss"])
        rows.append({"config": name, "micro_batch_size": micro, "prefix_packing": packing,
                     "median_s": statistics.median(times), "steps": args.steps, "pass_tokens": pass_tokens,
                     "losses": losses})
    base = rows[0]["median_s"]
    epoch_steps = params.sft.epochs * -(-len(examples) // batch)
    print(f"rows: {len(examples)}, batch_size {batch}, {epoch_steps} steps for {params.sft.epochs} epochs; "
          f"threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    print(f"{'batching':<34}{'s/step':>8}{'vs 1st':>8}{'pass tokens':>13}{'run min':>9}{'max |dloss|':>13}")
    for r in rows:
        r["ratio_to_first"] = r["median_s"] / base
        r["run_min_estimate"] = r["median_s"] * epoch_steps / 60
        r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], rows[0]["losses"]))
        print(f"{r['config']:<34}{r['median_s']:>8.3f}{r['ratio_to_first']:>8.2f}{r['pass_tokens']:>13.0f}"
              f"{r['run_min_estimate']:>9.1f}{r['max_loss_diff']:>13.2e}")
    write_json(args.out, {"rows": len(examples), "batch_size": batch, "epoch_steps": epoch_steps,
                          "threads": args.threads, "loadavg_1m": os.getloadavg()[0], "results": rows}, sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
