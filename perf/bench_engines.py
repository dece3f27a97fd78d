"""Side by side on this machine: llama-cpp-python's server vs llama.cpp's native server, and the HF vs
llama.cpp rollout engines for the same LoRA adapter (embedded 0.5B Q4_K_M policy).

Run (after ``bash scripts/setup.sh``; about 4 minutes on 2 quiet cores)::

    python perf/bench_engines.py [--threads 2] [--out perf/results/engines.json]
"""

from __future__ import annotations

import os

# Every engine here runs OpenMP threads; passive waits keep them from collapsing when another process
# takes a core (see components/embedded/native_server.py). Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import platform
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from components.embedded.models import ensure_gguf
from components.embedded.native_server import NativeLlamaServer
from components.embedded.server import LlamaServer
from components.io import write_json
from components.training.engines.llamacpp import LlamaCppRolloutEngine
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.model import LoRASettings, build_policy

MODEL = "qwen2.5-coder-0.5b-instruct"
RESULTS = Path(__file__).parent / "results" / "engines.json"
PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a map. Chapter 1:"
QUESTION = "Explain in two sentences what a search engine index is."


def _busy_processes() -> list[str]:
    """Other processes using CPU right now (ps's lifetime %CPU over 20%), for the record."""
    out = subprocess.run(["ps", "-eo", "pid,pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True,
                         check=True).stdout
    mine = os.getpid()
    rows = []
    for line in out.splitlines()[1:]:
        pid, pcpu, comm = line.split(None, 2)
        if int(pid) != mine and float(pcpu) >= 20.0:
            rows.append(f"{comm} {pcpu}%")
    return rows


def _completions(base_url: str, concurrent: int, max_tokens: int, native: bool) -> dict[str, float]:
    def one(i: int) -> int:
        body = {"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.8, "seed": i}
        if native:
            body["ignore_eos"] = True
        r = httpx.post(f"{base_url}/completions", json=body, timeout=600)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrent) as pool:
        tokens = sum(pool.map(one, range(concurrent)))
    wall = time.perf_counter() - t0
    print(f"  {base_url}: {concurrent} concurrent, {tokens} tokens in {wall:.1f} s", flush=True)
    return {"concurrent": concurrent, "tokens": tokens, "wall_s": round(wall, 3), "tok_per_s": round(tokens / wall, 1)}


def bench_servers(gguf: Path, threads: int, levels: tuple[int, ...]) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {}
    with LlamaServer(gguf, alias="m", n_ctx=1024, threads=threads) as server:
        _completions(server.base_url, 1, 8, False)  # warm-up
        out["python server (llama-cpp-python)"] = [_completions(server.base_url, c, 96, False) for c in levels]
    with NativeLlamaServer(gguf, alias="m", n_ctx=1024, threads=threads, parallel=max(levels)) as server:
        _completions(server.base_url, 1, 8, True)  # warm-up
        out[f"native llama-server ({max(levels)} slots)"] = [
            _completions(server.base_url, c, 96, True) for c in levels
        ]
    return out


def _random_adapter(policy, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _lp_gap(policy, gens, temperature: float) -> dict[str, float]:
    """|engine log-prob - trained-weights log-prob| over every sampled token the engine scored."""
    diffs: list[float] = []
    for g in gens:
        if g.logprobs is None or not g.token_ids:
            continue
        ids = torch.tensor([g.prompt_ids + g.token_ids])
        with torch.no_grad():
            lp = policy.token_logprobs(ids, torch.ones_like(ids), temperature=temperature)[0]
        ref = lp[len(g.prompt_ids):].tolist()
        diffs += [abs(a - b) for a, b in zip(g.logprobs, ref, strict=True)]
    if not diffs:
        return {"tokens": 0}
    return {"tokens": len(diffs), "mean_abs": round(statistics.fmean(diffs), 4), "max_abs": round(max(diffs), 4),
            "p95_abs": round(sorted(diffs)[int(0.95 * (len(diffs) - 1))], 4)}


def bench_rollouts(gguf: Path, threads: int, workdir: Path) -> dict[str, object]:
    from transformers import AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    policy = build_policy(gguf.parent, gguf_file=gguf.name, lora=LoRASettings(r=8, alpha=16))
    _random_adapter(policy)
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                     tokenize=True)["input_ids"]
    sampling = SamplingParams(max_new_tokens=128, temperature=1.0)
    rows: dict[str, object] = {}

    torch.manual_seed(0)
    hf = HFRolloutEngine(policy.model, tok)
    t0 = time.perf_counter()
    hf_gens = hf.generate([prompt] * 4, sampling)
    hf_s = time.perf_counter() - t0
    hf_tokens = sum(len(g.token_ids) for g in hf_gens)
    print(f"  HF engine: {hf_tokens} tokens in {hf_s:.1f} s", flush=True)
    rows["hf"] = {"wall_s": round(hf_s, 2), "tokens": hf_tokens, "tok_per_s": round(hf_tokens / hf_s, 1)}

    with LlamaCppRolloutEngine(gguf, tok, parallel=4, threads=threads, n_ctx=1024, seed=0,
                               adapter_dir=workdir / "adapters") as engine:
        engine.update_weights(policy, 0)
        rows["swap"] = {k: round(v, 3) for k, v in engine.last_update.items()}
        engine.generate([prompt], SamplingParams(max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        cpp_gens = engine.generate([prompt] * 4, sampling)
        cpp_s = time.perf_counter() - t0
        cpp_tokens = sum(len(g.token_ids) for g in cpp_gens)
        print(f"  llama.cpp engine: {cpp_tokens} tokens in {cpp_s:.1f} s", flush=True)
        rows["llamacpp"] = {"wall_s": round(cpp_s, 2), "tokens": cpp_tokens, "tok_per_s": round(cpp_tokens / cpp_s, 1)}
        swaps = []
        for step in (1, 2):
            engine.update_weights(policy, step)
            swaps.append(engine.last_update["swap_s"])
        rows["swap"]["repeat_swap_s"] = [round(s, 3) for s in swaps]
    rows["speedup_tok_per_s"] = round(rows["llamacpp"]["tok_per_s"] / rows["hf"]["tok_per_s"], 2)
    rows["speedup_group_wall"] = round(hf_s / cpp_s, 2)
    rows["logprob_gap_vs_trained_weights"] = _lp_gap(policy, cpp_gens, sampling.temperature)
    return rows


def main() -> None:
    """How it measures, and what it writes.

    Measures (one server at a time, so they never compete):

    1. servers: generated tok/s of 1 / 4 / 8 concurrent 96-token completions (``/v1/completions``,
       ``ignore_eos`` where the server has it, else a prompt that runs long; tokens counted from ``usage``);
    2. rollouts: one G=4 group of <=128-token samples (T=1) from the same prompt through
       :class:`HFRolloutEngine` (the LoRA-wrapped policy in transformers, fp32) and
       :class:`LlamaCppRolloutEngine` (base Q4_K_M + the same adapter as GGUF, 4 slots);
    3. how far the engine's log-probs of its sampled tokens are from the trained weights' (HF, fp32);
    4. the adapter swap: save + convert + restart, as ``update_weights`` does after each step.

    The adapter is peft's LoRA (r=8, alpha=16) with its B matrices drawn at random (std 0.02), so it moves
    the outputs like a trained adapter does. Prints a table and writes JSON; the JSON records the load
    average and the other busy processes, since engineers share this machine's 2 cores.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--workdir", type=Path, default=Path(".cache") / "bench_engines")
    args = parser.parse_args()
    gguf = ensure_gguf(MODEL)
    load_before, busy_before = os.getloadavg()[0], _busy_processes()

    servers = bench_servers(gguf, args.threads, (1, 4, 8))
    rollouts = bench_rollouts(gguf, args.threads, args.workdir)

    print(f"{'server':40} " + " ".join(f"{f'{c} conc tok/s':>14}" for c in (1, 4, 8)))
    for name, rows in servers.items():
        print(f"{name:40} " + " ".join(f"{r['tok_per_s']:14.1f}" for r in rows))
    print()
    print(f"{'G=4 group, <=128 tokens, T=1':40} {'wall s':>8} {'tokens':>7} {'tok/s':>7}")
    for key in ("hf", "llamacpp"):
        r = rollouts[key]
        print(f"{key:40} {r['wall_s']:8.2f} {r['tokens']:7d} {r['tok_per_s']:7.1f}")
    print(f"speed-up (tok/s): {rollouts['speedup_tok_per_s']}x, group wall: {rollouts['speedup_group_wall']}x")
    print(f"adapter swap: {rollouts['swap']}")
    print(f"engine log-prob gap vs trained weights: {rollouts['logprob_gap_vs_trained_weights']}")

    load_after = os.getloadavg()[0]
    report = {
        "model": f"{MODEL} Q4_K_M (llama.cpp) / dequantized fp32 + LoRA r=8 (HF)",
        "machine": {"cpu_count": os.cpu_count(), "threads": args.threads, "python": platform.python_version(),
                    "torch": torch.__version__, "load_average_1m_before": round(load_before, 2),
                    "load_average_1m_after": round(load_after, 2), "busy_processes_before": busy_before},
        "shared_cpu": (
            "other engineers' processes were using the CPU during this run (see load averages); numbers are "
            "lower and noisier than on a quiet machine" if max(load_before, load_after) > 1.0 else "quiet machine"
        ),
        "servers_96_token_completions": servers,
        "rollouts_g4_128_tokens": rollouts,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
