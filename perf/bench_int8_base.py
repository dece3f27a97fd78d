"""The GRPO update's speed options against peft's fp32 forward (issue 49.3): time, and what each changes in the
numbers. What ``grpo.int8_base`` (the frozen base's matmuls in int8) and ``grpo.fused_lora`` (the LoRA linears'
leaner forward) buy in an update of the warm-started 0.5B, side by side in one process.

Run (about 3 minutes a mode on 2 cores, the ``sft`` stage's adapter and ``sft_data``'s trajectories present)::

    python perf/bench_int8_base.py [--modes fp32 int8] [--rows 4] [--repeats 2] [--adapter-std 0.01] \
        [--out perf/results/int8_base.json]
    python perf/bench_int8_base.py --modes fp32 int8 fused    # as the suite runs it
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
MODES = ("fp32", "int8", "fused", "int8+fused")


def trainer_params() -> Any:
    """params.yaml, with torch's threads set as ``run.torch_threads`` says (as the training stages set them)."""
    import torch

    from components.params_load import load_params

    params = load_params()
    if params.run.torch_threads:
        torch.set_num_threads(params.run.torch_threads)
    return params


def run_record() -> dict[str, Any]:
    """The machine (load average at the end) and the working tree's HEAD, for a benchmark's report."""
    import torch

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    return {"machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                        "torch_threads": torch.get_num_threads(), "load_average_1m_after": os.getloadavg()[0]},
            "working_tree_head": head}


def agent_rows(params, tokenizer, n: int) -> list[Any]:
    """The ``n`` longest rows of the sft stage's trajectories, as that stage renders them (``SFTExample``)."""
    from components.io import read_jsonl
    from components.run_spec import run_spec
    from components.schemas import Trajectory
    from components.training.sft.trajectories import warm_start_examples

    method = params.train_policy.warm_start["react"]
    trajectories = read_jsonl(run_spec(params).warm_start_folder("sft_data", method) / "trajectories.jsonl", Trajectory)
    rows = warm_start_examples(params.methods[method], params.agent, params.sft.max_length, trajectories, tokenizer)
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


def fidelity(other: list[Any], base: list[Any]) -> dict[str, float]:
    """Absolute differences of one mode's log-probs from the base mode's over every loss token, in nats."""
    import torch

    diff = torch.cat([(a - b).abs() for a, b in zip(other, base, strict=True)])
    return {"mean": diff.mean().item(), "p99": torch.quantile(diff, 0.99).item(), "max": diff.max().item()}


def changes(other: tuple, base: tuple, other_mode: str, base_mode: str) -> dict[str, Any]:
    """What a mode changes against the base mode: the loss tokens' log-probs, the KL term, the LoRA gradient.
    ``other`` and ``base`` are :func:`one_pass`'s (log-probs, reference log-probs, gradient)."""
    import torch

    (l_o, r_o, g_o), (l_b, r_b, g_b) = other, base
    kl_o = torch.cat([(r - lp) for r, lp in zip(r_o, l_o, strict=True)])
    kl_b = torch.cat([(r - lp) for r, lp in zip(r_b, l_b, strict=True)])
    return {
        "policy_logprob_abs_diff": fidelity(l_o, l_b),
        "reference_logprob_abs_diff": fidelity(r_o, r_b),
        "policy_minus_reference_mean_abs": {base_mode: kl_b.abs().mean().item(), other_mode: kl_o.abs().mean().item()},
        "k3_kl_mean": {base_mode: (torch.exp(kl_b) - kl_b - 1).mean().item(),
                       other_mode: (torch.exp(kl_o) - kl_o - 1).mean().item()},
        "gradient_cosine": torch.nn.functional.cosine_similarity(g_o, g_b, dim=0).item(),
        "gradient_norm_ratio": (g_o.norm() / g_b.norm()).item(),
        "gradient_max_abs_diff": (g_o - g_b).abs().max().item(),
    }


def main() -> None:
    """How it measures, and what it writes.

    ``--modes BASE OTHER ...``: of ``fp32`` (peft's forward over the fp32 base), ``int8``, ``fused`` and
    ``int8+fused``; each OTHER is measured against BASE.

    The policy is built as ``train_policy`` builds it (``warm_started_policy``: the base 0.5B in fp32, the ``sft``
    adapter merged, a fresh LoRA of ``lora``'s settings) and its LoRA ``B`` drawn from N(0, ``--adapter-std``), seeded,
    so that the policy differs from its reference as it does after a step (LoRA ``A`` is peft's draw, seeded by
    ``--seed``: the gradient's cosine moved between 0.97 and 0.99 over unseeded draws). The rows are real agent episodes: the
    ``--rows`` longest of ``outputs/sft_data/trajectories.jsonl``, rendered as the ``sft`` stage renders them (the
    warm start's prompts, the policy's turns with loss, tool observations without). Each row is one micro-batch, as
    the trainer runs rows of up to 2,048 tokens, with its activations kept.

    Per mode and row: the reference forward (adapter off, no grad), the policy's forward and the backward of a GRPO
    loss (advantage +1 / -1 by row, the k3 KL term at ``grpo.kl_coef``), timed apart; modes alternate over
    ``--repeats`` (BASE, OTHER, ..., BASE, OTHER, ...) and each time is the median. What each OTHER changes: the
    log-probabilities of the loss tokens (policy and reference; mean, 99th percentile and max of the absolute difference,
    in nats), the KL term, and the LoRA gradient (cosine with BASE's, norm ratio, largest difference). Prints a table
    and writes JSON.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["fp32", "int8"], metavar="MODE",
                        help=f"the base mode, then the modes measured against it, of {', '.join(MODES)}")
    parser.add_argument("--rows", type=int, default=4, help="the longest agent rows of the sft data")
    parser.add_argument("--repeats", type=int, default=2, help="passes per mode, alternating")
    parser.add_argument("--adapter-std", type=float, default=0.01, help="std of the LoRA B drawn (0: a fresh adapter)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch

    from components.io import write_json
    from components.run_spec import run_spec
    from components.training.speed.fused_lora import fuse_lora_forward, unfuse_lora_forward
    from components.training.speed.int8_base import quantize_frozen_base, restore_fp32
    from components.training.warm_started import warm_started_policy

    params = trainer_params()
    started = time.perf_counter()
    torch.manual_seed(args.seed)  # peft draws LoRA A from the global generator
    policy, tokenizer = warm_started_policy(run_spec(params))
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name and args.adapter_std > 0:
                p.copy_(torch.randn(p.shape, generator=generator) * args.adapter_std)
    rows = agent_rows(params, tokenizer, args.rows)
    tokens = [len(r.input_ids) for r in rows]
    loss_tokens = [sum(r.loss_mask) for r in rows]
    print(f"{len(rows)} rows: {tokens} tokens, {loss_tokens} with loss; kl_coef {params.grpo.kl_coef}", flush=True)

    def set_mode(mode: str) -> None:
        unfuse_lora_forward(policy.model)  # warm_started_policy fuses as grpo.fused_lora says: from peft's forward
        restore_fp32(policy.model)
        if "int8" in mode:
            quantize_frozen_base(policy.model)
        if "fused" in mode:
            fuse_lora_forward(policy.model)

    base_mode = args.modes[0]
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
    outputs: dict[str, tuple] = {}
    for r in range(args.repeats):
        for mode in args.modes:
            set_mode(mode)
            times, logps, refs, grads = one_pass(policy, rows, params.grpo.kl_coef)
            runs[mode].append(times)
            outputs.setdefault(mode, (logps, refs, grads))
            print(f"repeat {r + 1} {mode}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)

    results = []
    for mode, passes in runs.items():
        med = {k: statistics.median(p[k] for p in passes) for k in PHASES}
        results.append({"mode": mode, **med, "update_s": sum(med.values())})
    base_row = results[0]
    ratios = {row["mode"]: {k: row[k] / base_row[k] for k in (*PHASES, "update_s")} for row in results[1:]}
    numbers = {mode: changes(outputs[mode], outputs[base_mode], mode, base_mode) for mode in ratios}

    print(f"\n{'mode':12}" + "".join(f"{k:>14}" for k in (*PHASES, "update_s")))
    for row in results:
        print(f"{row['mode']:12}" + "".join(f"{row[k]:>14.1f}" for k in (*PHASES, "update_s")))
    for mode, ratio in ratios.items():
        print(f"{mode + ' / ' + base_mode:12}" + "".join(f"{ratio[k]:>13.2f}x" for k in (*PHASES, "update_s")))
    for mode, figures in numbers.items():
        for key, value in figures.items():
            print(f"{mode} {key}: {json.dumps(value) if isinstance(value, dict) else f'{value:.4g}'}")

    report = {
        **run_record(),
        "command": (f"python perf/bench_int8_base.py --modes {' '.join(args.modes)} --rows {args.rows} --repeats {args.repeats} "
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
