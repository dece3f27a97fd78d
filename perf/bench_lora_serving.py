"""The native llama-server serving the 0.5B policy alone, with a runtime ``--lora`` adapter, and with the adapter
merged into the weights (:mod:`components.embedded.lora_merge`). Side by side on this machine, with the greedy
agreement between them.

Run (after ``bash scripts/setup.sh``; about 5 minutes on 2 quiet cores)::

    python perf/bench_lora_serving.py [--requests 8] [--parallel 4] [--out perf/results/lora_serving.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from components.embedded.lora_gguf import random_lora_gguf
from components.embedded.lora_merge import merge_lora_into_gguf
from components.embedded.models import ensure_gguf
from components.embedded.native_server import NativeLlamaServer
from components.io import write_json

MODEL = "qwen2.5-coder-0.5b-instruct"
RESULTS = Path(__file__).parent / "results" / "lora_serving.json"
WORDS = ["river", "archive", "director", "film", "born", "city", "studio", "award", "novel", "founded", "married",
         "capital", "museum", "painter", "album", "released", "composer", "university", "island", "festival",
         "bridge", "symphony", "harbour", "village", "theatre"]


def prompts(n: int, approx_tokens: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        docs = []
        while sum(len(d.split()) for d in docs) < approx_tokens * 0.7:
            docs.append(f"[doc {len(docs)}] " + " ".join(rng.choice(WORDS, 30)) + ".")
        out.append(f"Question {i}: which film did the director born in the harbour village make?\n"
                   + "\n".join(docs) + "\nThought:")
    return out


def run_workload(root_url: str, texts: list[str], parallel: int, gen_tokens: int) -> dict[str, object]:
    def one(text: str) -> dict:
        body = {"prompt": text, "n_predict": gen_tokens, "temperature": 0.0, "ignore_eos": True,
                "cache_prompt": False, "n_probs": 1, "seed": 0}
        r = httpx.post(f"{root_url}/completion", json=body, timeout=900)
        r.raise_for_status()
        return r.json()

    one(texts[0][:200])  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        replies = list(pool.map(one, texts))
    wall = time.perf_counter() - t0
    timings = [rep["timings"] for rep in replies]
    prompt_n = sum(t["prompt_n"] for t in timings)
    gen_n = sum(t["predicted_n"] for t in timings)
    tokens = [[p["id"] for p in rep["completion_probabilities"]] for rep in replies]
    logprobs = [[p["logprob"] for p in rep["completion_probabilities"]] for rep in replies]
    return {"wall_s": round(wall, 2), "prompt_tokens": prompt_n, "generated_tokens": gen_n,
            "tok_per_s_all": round((prompt_n + gen_n) / wall, 1), "gen_tok_per_s": round(gen_n / wall, 1),
            "server_prompt_ms_per_token": round(statistics.fmean(t["prompt_per_token_ms"] for t in timings), 2),
            "server_decode_ms_per_token": round(statistics.fmean(t["predicted_per_token_ms"] for t in timings), 2),
            "_tokens": tokens, "_logprobs": logprobs}


def compare(ref: dict, other: dict) -> dict[str, float]:
    """Greedy agreement (share of identical tokens before the first divergence, over all requests) and the
    log-prob gap on the common prefix."""
    agree, total, gaps = 0, 0, []
    for ta, tb, la, lb in zip(ref["_tokens"], other["_tokens"], ref["_logprobs"], other["_logprobs"], strict=True):
        total += len(ta)
        for x, y, lx, ly in zip(ta, tb, la, lb):
            if x != y:
                break
            agree += 1
            gaps.append(abs(lx - ly))
    return {"identical_prefix_share": round(agree / max(total, 1), 3),
            "logprob_gap_mean": round(statistics.fmean(gaps), 4) if gaps else float("nan"),
            "logprob_gap_max": round(max(gaps), 4) if gaps else float("nan")}


def main() -> None:
    """How it measures, and what it writes.

    The workload has an evaluation's shape: ``--requests`` distinct prompts of about ``--prompt-tokens`` tokens
    (an agent's system prompt, question and search results), ``--parallel`` at a time on ``--parallel``
    slots, ``--gen-tokens`` greedy tokens each (``ignore_eos``), no prompt cache. Per configuration it reports
    the wall time and the server's own prompt and decode timings. It also compares (c) with (b) token by
    token: greedy agreement and the gap between their log-probs of the tokens (b) chose, against the gap
    between (b) and the base (what the adapter itself moves). The adapter is r=8, alpha=16 on every attention
    and MLP matrix, with random A (std 1/sqrt(in)) and B (std 0.02), the size of the SFT warm start's.
    Prints a table and writes JSON.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=700)
    parser.add_argument("--gen-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path(".cache") / "bench_lora_serving")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    base = ensure_gguf(MODEL)
    load_before = os.getloadavg()[0]

    adapter = random_lora_gguf(base, args.workdir / "adapter")
    t0 = time.perf_counter()
    merged = merge_lora_into_gguf(base, [adapter], args.workdir / "merged.gguf")
    merge_s = time.perf_counter() - t0
    print(f"merged in {merge_s:.1f} s: {merged} ({merged.stat().st_size / 2**20:.0f} MiB; "
          f"base {base.stat().st_size / 2**20:.0f} MiB)", flush=True)

    texts = prompts(args.requests, args.prompt_tokens)
    configs = {"base": (base, None), "base + runtime LoRA": (base, adapter), "LoRA merged (Q8_0)": (merged, None)}
    results = {}
    for name, (model, lora) in configs.items():
        with NativeLlamaServer(model, alias="m", n_ctx=args.prompt_tokens * 2 + args.gen_tokens,
                               threads=args.threads, parallel=args.parallel, lora=lora) as server:
            results[name] = run_workload(server.root_url, texts, args.parallel, args.gen_tokens)
        print(f"  {name}: {results[name]['wall_s']} s", flush=True)

    runtime = results["base + runtime LoRA"]
    agreement = {"merged vs runtime LoRA": compare(runtime, results["LoRA merged (Q8_0)"]),
                 "base vs runtime LoRA (what the adapter moves)": compare(runtime, results["base"])}
    header = f"{'configuration':24} {'wall s':>7} {'speed-up':>8} {'gen tok/s':>9} {'prompt ms/tok':>13} {'decode ms/tok':>13}"
    print(header)
    for name, r in results.items():
        print(f"{name:24} {r['wall_s']:7.1f} {runtime['wall_s'] / r['wall_s']:8.2f} {r['gen_tok_per_s']:9.1f} "
              f"{r['server_prompt_ms_per_token']:13.2f} {r['server_decode_ms_per_token']:13.2f}")
    for name, a in agreement.items():
        print(f"{name}: {a}")

    report = {
        "model": f"{MODEL} Q4_K_M; random LoRA r=8 alpha=16 on q,k,v,o,gate,up,down",
        "workload": {"requests": args.requests, "parallel": args.parallel, "prompt_tokens_approx": args.prompt_tokens,
                     "gen_tokens": args.gen_tokens, "greedy": True, "cache_prompt": False},
        "machine": {"cpu_count": os.cpu_count(), "threads": args.threads, "python": platform.python_version(),
                    "load_average_1m_before": round(load_before, 2),
                    "load_average_1m_after": round(os.getloadavg()[0], 2)},
        "merge_s": round(merge_s, 1),
        "sizes_mib": {"base": round(base.stat().st_size / 2**20), "merged": round(merged.stat().st_size / 2**20)},
        "results": {k: {m: v for m, v in r.items() if not m.startswith("_")} for k, r in results.items()},
        "speedup_vs_runtime_lora": {k: round(runtime["wall_s"] / r["wall_s"], 2) for k, r in results.items()},
        "agreement": agreement,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
