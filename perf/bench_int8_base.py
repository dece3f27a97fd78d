"""The int8 base against fp32, side by side in one process (issue 49.3): what ``grpo.int8_base`` buys in a GRPO
update of the warm-started 0.5B, and what it changes in the numbers the update computes.

Run (about 5 minutes on 2 cores, the ``sft`` stage's adapter and ``sft_data``'s trajectories present)::

    python perf/bench_int8_base.py [--rows 4] [--repeats 2] [--adapter-std 0.01] [--out perf/results/int8_base.json]

The policy is built as ``train_policy`` builds it (``warm_started_policy``: the base 0.5B in fp32, the ``sft``
adapter merged, a fresh LoRA of ``lora``'s settings) and its LoRA ``B`` drawn from N(0, ``--adapter-std``), seeded,
so that the policy differs from its reference as it does after a step (LoRA ``A`` is peft's draw, seeded by
``--seed``: the gradient's cosine moved between 0.97 and 0.99 over unseeded draws). The rows are real agent episodes: the
``--rows`` longest of ``outputs/sft_data/trajectories.jsonl``, rendered as the ``sft`` stage renders them (the
warm start's prompts, the policy's turns with loss, tool observations without). Each row is one micro-batch, as
the trainer runs rows of up to 2,048 tokens, with its activations kept.

Per mode and row: the reference forward (adapter off, no grad), the policy's forward and the backward of a GRPO
loss (advantage +1 / -1 by row, the k3 KL term at ``grpo.kl_coef``), timed apart; modes alternate over
``--repeats`` (fp32, int8, fp32, int8, ...) and each time is the median. What int8 changes: the log-probabilities
of the loss tokens (policy and reference; mean, 99th percentile and max of the absolute difference, in nats), the
KL term, and the LoRA gradient (cosine with fp32's, norm ratio). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

RESULTS = Path(__file__).parent / "results" / "int8_base.json"
PHASES = ("reference_s", "forward_s", "backward_s")


def agent_rows(params, tokenizer, n: int) -> list[Any]:
    """The ``n`` longest rows of the sft stage's trajectories, as that stage renders them (``SFTExample``)."""
    from components.io import read_jsonl
    from components.run_files import warm_start_folder
    from components.schemas import Trajectory
    from components.training.trajectory_sft import warm_start_examples

    method = params.train_policy.warm_start["react"]
    trajectories = read_jsonl(warm_start_folder(params, "sft_data", method) / "trajectories.jsonl", Trajectory)
    rows = warm_start_examples(params, method, trajectories, tokenizer)
    return sorted(rows, key=lambda r: -len(r.input_ids))[:n]


def one_pass(policy, rows, kl_coef: float) -> tuple[dict[str, float], list[Any], list[Any], Any]:
    """Times of each phase summed over the rows; each row's policy and reference log-probs; the LoRA gradient."""
    import torch

    from components.training.model import activations_kept

    times = dict.fromkeys(PHASES, 0.0)
    logps, refs = [], []
    for i, row in enumerate(rows):
        ids = torch.tensor([row.input_ids])
        att = torch.ones_like(ids)
        mask = torch.tensor([row.loss_mask], dtype=torch.bool)
        t0 = time.perf_counter()
        ref = policy.token_logprobs(ids, att, reference=True, positions=mask)
        t1 = time.perf_counter()
        with activations_kept(policy.model):
            logp = policy.token_logprobs(ids, att, positions=mask)
            t2 = time.perf_counter()
            delta = (ref - logp)[mask]
            kl = torch.exp(delta) - delta - 1
            loss = (-(1.0 if i % 2 == 0 else -1.0) * logp[mask] + kl_coef * kl).mean()
            loss.backward()
        t3 = time.perf_counter()
        times["reference_s"] += t1 - t0
        times["forward_s"] += t2 - t1
        times["backward_s"] += t3 - t2
        logps.append(logp.detach()[mask])
        refs.append(ref[mask])
    grads = torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])
    for p in policy.trainable_parameters():
        p.grad = None
    return times, logps, refs, grads


def fidelity(int8: list[Any], fp32: list[Any]) -> dict[str, float]:
    """Absolute differences of int8's log-probs from fp32's over every loss token, in nats."""
    import torch

    diff = torch.cat([(a - b).abs() for a, b in zip(int8, fp32, strict=True)])
    return {"mean": diff.mean().item(), "p99": torch.quantile(diff, 0.99).item(), "max": diff.max().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4, help="the longest agent rows of the sft data")
    parser.add_argument("--repeats", type=int, default=2, help="passes per mode, alternating")
    parser.add_argument("--adapter-std", type=float, default=0.01, help="std of the LoRA B drawn (0: a fresh adapter)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch

    from components.io import write_json
    from components.params import load_params
    from components.training.int8_base import quantize_frozen_base, restore_fp32
    from components.training.warm_started import warm_started_policy

    params = load_params()
    if params.run.torch_threads:
        torch.set_num_threads(params.run.torch_threads)
    started = time.perf_counter()
    torch.manual_seed(args.seed)  # peft draws LoRA A from the global generator
    policy, tokenizer = warm_started_policy(params)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name and args.adapter_std > 0:
                p.copy_(torch.randn(p.shape, generator=generator) * args.adapter_std)
    rows = agent_rows(params, tokenizer, args.rows)
    tokens = [len(r.input_ids) for r in rows]
    loss_tokens = [sum(r.loss_mask) for r in rows]
    print(f"{len(rows)} rows: {tokens} tokens, {loss_tokens} with loss; kl_coef {params.grpo.kl_coef}", flush=True)

    runs: dict[str, list[dict[str, float]]] = {"fp32": [], "int8": []}
    outputs: dict[str, tuple] = {}
    for r in range(args.repeats):
        for mode in ("fp32", "int8"):
            if mode == "int8":
                quantize_frozen_base(policy.model)
            times, logps, refs, grads = one_pass(policy, rows, params.grpo.kl_coef)
            if mode == "int8":
                restore_fp32(policy.model)
            runs[mode].append(times)
            outputs.setdefault(mode, (logps, refs, grads))
            print(f"repeat {r + 1} {mode}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)

    results = []
    for mode, passes in runs.items():
        med = {k: statistics.median(p[k] for p in passes) for k in PHASES}
        results.append({"mode": mode, **med, "update_s": sum(med.values())})
    fp32_row, int8_row = results
    ratios = {k: int8_row[k] / fp32_row[k] for k in (*PHASES, "update_s")}
    (l32, r32, g32), (l8, r8, g8) = outputs["fp32"], outputs["int8"]
    kl32 = torch.cat([(r - lp) for r, lp in zip(r32, l32, strict=True)])
    kl8 = torch.cat([(r - lp) for r, lp in zip(r8, l8, strict=True)])
    numbers = {
        "policy_logprob_abs_diff": fidelity(l8, l32),
        "reference_logprob_abs_diff": fidelity(r8, r32),
        "policy_minus_reference_mean_abs": {"fp32": kl32.abs().mean().item(), "int8": kl8.abs().mean().item()},
        "k3_kl_mean": {"fp32": (torch.exp(kl32) - kl32 - 1).mean().item(), "int8": (torch.exp(kl8) - kl8 - 1).mean().item()},
        "gradient_cosine": torch.nn.functional.cosine_similarity(g8, g32, dim=0).item(),
        "gradient_norm_ratio": (g8.norm() / g32.norm()).item(),
    }

    print(f"\n{'mode':6}" + "".join(f"{k:>14}" for k in (*PHASES, "update_s")))
    for row in results:
        print(f"{row['mode']:6}" + "".join(f"{row[k]:>14.1f}" for k in (*PHASES, "update_s")))
    print(f"{'/fp32':6}" + "".join(f"{ratios[k]:>13.2f}x" for k in (*PHASES, "update_s")))
    for key, value in numbers.items():
        print(f"{key}: {json.dumps(value) if isinstance(value, dict) else f'{value:.4f}'}")

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    report = {
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "load_average_1m_after": os.getloadavg()[0]},
        "working_tree_head": head,
        "command": (f"python perf/bench_int8_base.py --rows {args.rows} --repeats {args.repeats} "
                    f"--adapter-std {args.adapter_std} --seed {args.seed}"),
        "size": {"rows": len(rows), "tokens": tokens, "loss_tokens": loss_tokens, "lora_r": params.lora.r,
                 "kl_coef": params.grpo.kl_coef},
        "wall_s": time.perf_counter() - started,
        "results": results,
        "ratios": ratios,
        "fidelity": numbers,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
