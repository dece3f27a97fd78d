"""The judge client against its limits, side by side in one run (issue 49.5): a loopback OpenAI-compatible server
that answers every call after a fixed latency, reached through the project's real client path (the ``openai``
backend behind the reliability middleware, as a run builds a judge role).

- concurrency: ``--calls`` distinct calls at ``--concurrency`` in flight finish within 1.15x of the ideal
  ``calls / concurrency x latency`` (target from the issue);
- cache: a repeated deterministic call (temperature 0) is answered from the response cache at least 100x faster
  than a miss;
- ARBOR's sparse graph: ``score_group`` makes (K-1) + floor(K/2) judge calls for K = 4, 8, 16 trajectories, against
  K(K-1)/2 for all pairs, as the middleware's accounting counts them.

Run (seconds; needs no model)::

    python perf/bench_judge_client.py [--latency 0.1] [--calls 256] [--concurrency 32] [--out perf/results/judge_client.json]

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from components.llm.backends.openai_http import OpenAIChatModel
from components.llm.base import Sampling, user
from components.llm.middleware import Accounting, ReliableChatModel, ResponseCache
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_graph import sparse_graph
from components.methods.arbor.pairwise_judge import score_group
from components.params import MiddlewareParams


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the listen backlog: at 5 (the default) a burst of connections waits on TCP retries


def _serve(latency: float, reply: str, ports) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency)
            data = json.dumps({"model": body["model"], "usage": {"prompt_tokens": 10, "completion_tokens": 3},
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": reply}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = _Server(("127.0.0.1", 0), Handler)
    ports.put(httpd.server_address[1])
    httpd.serve_forever()


class LatencyServer:
    """Chat completions on 127.0.0.1 answered after ``latency`` seconds each, any number at once, served from a
    process of its own so that the client's time is measured alone."""

    def __init__(self, latency: float, reply: str):
        ports = multiprocessing.Queue()
        self.process = multiprocessing.Process(target=_serve, args=(latency, reply, ports), daemon=True)
        self.process.start()
        self.port = ports.get(timeout=30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.process.terminate()
        self.process.join(timeout=10)


def judge(server: LatencyServer, concurrency: int, cache: ResponseCache | None = None) -> ReliableChatModel:
    settings = MiddlewareParams(max_concurrency=concurrency, cache=cache is not None, timeout_s=60)
    return ReliableChatModel(OpenAIChatModel(model="judge", base_url=server.base_url), role="judge",
                             settings=settings, cache=cache, accounting=Accounting())


async def concurrency_run(server: LatencyServer, calls: int, concurrency: int) -> float:
    model = judge(server, concurrency)
    started = time.perf_counter()
    outs = await asyncio.gather(*(model.chat([user(f"call {i}")], Sampling(temperature=0.0, max_tokens=4))
                                  for i in range(calls)))
    seconds = time.perf_counter() - started
    await model.aclose()
    assert all(o.ok for o in outs)
    return seconds


async def cache_run(server: LatencyServer, repeats: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as folder:
        model = judge(server, 1, ResponseCache(Path(folder) / "cache.sqlite"))
        messages, sampling = [user("the same deterministic call")], Sampling(temperature=0.0, max_tokens=4)
        started = time.perf_counter()
        await model.chat(messages, sampling)
        miss = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(repeats):
            out = await model.chat(messages, sampling)
        hit = (time.perf_counter() - started) / repeats
        assert out.ok and model.stats.cache_hits == repeats
        await model.aclose()
    return miss, hit


async def graph_calls(server: LatencyServer, k: int) -> int:
    model = judge(server, 8)
    rubric = RubricText(title="Finds each hop", description="searches every entity", counter_description="skips one")
    edges = sparse_graph([float(i % 3) for i in range(k)])
    await score_group(model, "Which city?", [f"attempt {i}" for i in range(k)], edges, rubric, key="bench")
    calls = model.stats.calls
    await model.aclose()
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds the server takes per call (> 0)")
    parser.add_argument("--calls", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=200, help="cache hits timed after the one miss")
    parser.add_argument("--out", type=Path, default=Path("perf/results/judge_client.json"))
    args = parser.parse_args()

    server = LatencyServer(args.latency, reply='{"winner": "A"}')
    try:
        seconds = asyncio.run(concurrency_run(server, args.calls, args.concurrency))
        ideal = args.calls / args.concurrency * args.latency
        miss, hit = asyncio.run(cache_run(server, args.repeats))
        graphs = {k: asyncio.run(graph_calls(server, k)) for k in (4, 8, 16)}
    finally:
        server.close()

    rows = [
        (f"{args.calls} calls at concurrency {args.concurrency}", f"{seconds:.2f} s vs ideal {ideal:.2f} s",
         seconds / ideal, "<= 1.15", seconds / ideal <= 1.15),
        ("cached deterministic call vs miss", f"{hit * 1e3:.2f} ms vs {miss * 1e3:.1f} ms", miss / hit, ">= 100",
         miss / hit >= 100),
    ]
    for k, calls in graphs.items():
        want = (k - 1) + k // 2
        rows.append((f"ARBOR sparse graph, K={k}", f"{calls} calls vs {k * (k - 1) // 2} for all pairs",
                     calls / want, f"== (K-1)+floor(K/2) = {want}", calls == want))
    print(f"{'measure':42s} {'figures':36s} {'ratio':>8s} {'target':>26s}  met")
    for name, figures, ratio, target, met in rows:
        print(f"{name:42s} {figures:36s} {ratio:8.2f} {target:>26s}  {'yes' if met else 'NO'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_1min": os.getloadavg()[0]},
        "settings": {"latency_s": args.latency, "calls": args.calls, "concurrency": args.concurrency,
                     "repeats": args.repeats},
        "rows": [{"measure": n, "figures": f, "ratio": r, "target": t, "met": m} for n, f, r, t, m in rows],
    }, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
