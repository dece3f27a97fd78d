"""Three embedded llama.cpp servers decoding at once, as a Co-ReAct stage runs them, with spinning or passive
OpenMP waits and 2 or 1 threads. The policy runs on the native ``llama-server``, the 0.5B and the 1.5B on the python
``llama_cpp.server``; the settings are 2 threads each with OpenMP's default spinning waits, 2 threads with passive
waits (``OMP_WAIT_POLICY=PASSIVE``) and 1 thread with passive waits, and the 1.5B alone under the same three.

Run (after ``bash scripts/setup.sh``; about 6 minutes on 2 quiet cores)::

    python perf/bench_server_threads.py [--requests 2] [--gen-tokens 32] [--out perf/results/server_threads.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from components.embedded.models import ensure_gguf
from components.embedded.native_server import NativeLlamaServer
from components.embedded.server import LlamaServer
from components.io import write_json

RESULTS = Path(__file__).parent / "results" / "server_threads.json"
SMALL, LARGE = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
SETTINGS = {"2 threads, spinning": (2, False), "2 threads, passive": (2, True), "1 thread, passive": (1, True)}


def with_waits(server_cls: type[LlamaServer], passive: bool) -> type[LlamaServer]:
    """``server_cls`` with OMP_WAIT_POLICY forced to PASSIVE, or removed (OpenMP's default: spin, then sleep)."""

    class Server(server_cls):
        def environment(self) -> dict[str, str]:
            env = {k: v for k, v in super().environment().items() if k != "OMP_WAIT_POLICY"}
            return {**env, "OMP_WAIT_POLICY": "PASSIVE"} if passive else env

    return Server


def prompt(i: int) -> str:
    places = ", ".join(f"harbour village {j}" for j in range(60))
    return (f"Request {i}. Here are places an archive mentions: {places}.\n"
            "List forty European capital cities, one per line, with the country of each.")


def chain(base_url: str, alias: str, requests: int, gen_tokens: int) -> dict[str, float]:
    """``requests`` chat calls one after another; the server's generated tokens and the wall time."""
    tokens, t0 = 0, time.perf_counter()
    for i in range(requests):
        body = {"model": alias, "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": gen_tokens,
                "temperature": 0.0, "seed": 0}
        r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=1800)
        r.raise_for_status()
        tokens += r.json()["usage"]["completion_tokens"]
    wall = time.perf_counter() - t0
    return {"generated_tokens": tokens, "wall_s": round(wall, 2), "gen_tok_per_s": round(tokens / wall, 2)}


def scenario(servers: dict[str, LlamaServer], requests: int, gen_tokens: int) -> dict[str, object]:
    """Start ``servers``, warm each with one short call, then run their request chains all at once."""
    started = []
    try:
        for server in servers.values():
            started.append(server.start())
        for server in started:
            chain(server.base_url, server.alias, 1, 4)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(started)) as pool:
            futures = {name: pool.submit(chain, s.base_url, s.alias, requests, gen_tokens)
                       for name, s in servers.items()}
            per_server = {name: f.result() for name, f in futures.items()}
        wall = time.perf_counter() - t0
    finally:
        for server in started:
            server.stop()
    total = sum(r["generated_tokens"] for r in per_server.values())
    return {"wall_s": round(wall, 2), "gen_tok_per_s_all": round(total / wall, 2), "servers": per_server}


def main() -> None:
    """How it measures, and what it writes.

    Why: with 3 servers decoding at once on 2 cores the python servers logged 0.4-0.6 tokens/s at 2 threads (session
    18); the native server already waits passively (components/embedded/native_server.py), the python one did not.

    Each server answers ``--requests`` chat requests one after another (greedy, ``--gen-tokens`` at most, a prompt
    of about 250 tokens that asks for a long list, so each reply runs to the limit); in the "three at once" scenario
    the three servers' request chains run concurrently. Reported per setting: wall time, generated tokens per second
    of each server and in all. Prints a table and writes JSON.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    small, large = ensure_gguf(SMALL), ensure_gguf(LARGE)
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, object]] = {}
    for setting, (threads, passive) in SETTINGS.items():
        python_server, native_server = with_waits(LlamaServer, passive), with_waits(NativeLlamaServer, passive)
        results[f"1.5B alone, {setting}"] = scenario(
            {"1.5B python": python_server(large, alias="large", n_ctx=1024, threads=threads)},
            args.requests, args.gen_tokens)
        results[f"three at once, {setting}"] = scenario(
            {"0.5B native": native_server(small, alias="policy", n_ctx=1024, threads=threads, parallel=1),
             "0.5B python": python_server(small, alias="small", n_ctx=1024, threads=threads),
             "1.5B python": python_server(large, alias="large", n_ctx=1024, threads=threads)},
            args.requests, args.gen_tokens)
        print(f"  {setting}: done", flush=True)

    names = ["0.5B native", "0.5B python", "1.5B python"]
    print(f"{'scenario':42} {'wall s':>7} {'tok/s all':>9} " + " ".join(f"{n:>12}" for n in names))
    for name, r in results.items():
        cells = [f"{r['servers'][n]['gen_tok_per_s']:12.2f}" if n in r["servers"] else f"{'':>12}" for n in names]
        print(f"{name:42} {r['wall_s']:7.1f} {r['gen_tok_per_s_all']:9.2f} " + " ".join(cells))
    ref = results["three at once, 2 threads, spinning"]["gen_tok_per_s_all"]
    for setting in SETTINGS:
        print(f"three at once, {setting}: {results[f'three at once, {setting}']['gen_tok_per_s_all'] / ref:.2f}x "
              "the tokens/s of 2 spinning threads")

    report = {
        "models": f"{SMALL} and {LARGE}, Q4_K_M",
        "workload": {"requests_per_server": args.requests, "gen_tokens": args.gen_tokens, "prompt_tokens_approx": 250,
                     "greedy": True},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_1min_before": round(load_before, 2)},
        "results": results,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
