"""Serving against the decode limit (issue 49.4): the evaluation's agent loop against llama.cpp's native server at
the same concurrency, side by side in one process.

Run (needs the real 0.5B; the adapter from ``outputs/sft/adapter``, i.e. after the ``sft`` stage)::

    nice -n 19 python perf/bench_serving.py [--questions 4] [--n 4 8] [--rounds 1] [--gen-tokens auto] \\
        [--no-adapter] [--out perf/results/serving.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "perf" / "results" / "serving.json"
TARGET = 0.8


# --- pure logic (tested without a model: tests/test_perf_serving.py) ---------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """llama-server's Prometheus text as ``{name without the llamacpp: prefix: value}``."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name.split(":", 1)[-1]] = float(value)
    return out


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server did between two ``/metrics`` readings: prompt tokens processed and taken from the cache, tokens
    generated, the seconds its slots spent on each (summed over slots), decode steps and busy slots per step (the
    server reports that as a running mean; its totals are recovered from the mean times the step count)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (
        "prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total", "prompt_seconds_total",
        "tokens_predicted_seconds_total", "n_decode_total")}
    busy = (after.get("n_busy_slots_per_decode", 0.0) * after.get("n_decode_total", 0.0)
            - before.get("n_busy_slots_per_decode", 0.0) * before.get("n_decode_total", 0.0))
    generated = d["tokens_predicted_total"]
    return {"prompt_tokens_processed": int(d["prompt_tokens_total"]),
            "prompt_tokens_cached": int(d["prompt_tokens_cached_total"]),
            "generated_tokens": int(generated),
            "prompt_processed_per_generated": round(d["prompt_tokens_total"] / generated, 2) if generated else None,
            "prompt_cached_share": share(d["prompt_tokens_cached_total"],
                                         d["prompt_tokens_cached_total"] + d["prompt_tokens_total"]),
            "slot_s_prompt": round(d["prompt_seconds_total"], 2), "slot_s_decode": round(d["tokens_predicted_seconds_total"], 2),
            "decode_steps": int(d["n_decode_total"]),
            "busy_slots_per_decode": round(busy / d["n_decode_total"], 2) if d["n_decode_total"] else None}


def share(part: float, whole: float) -> float | None:
    return round(part / whole, 3) if whole else None


def slot_breakdown(events: Sequence[tuple[float, int, int]], n: int, t0: float, t1: float) -> dict[str, float | None]:
    """Where ours' N slots went over ``[t0, t1]``, from ``(time, change in policy calls in flight, change in episodes
    running)`` events: the share of slot-time with a policy call in flight, with its episode between turns (tools,
    retrieval, Python: running but not waiting on the model), and with no episode to run (the queue has run dry
    while others finish). Integrated exactly between events; the three add up to 1."""
    if t1 <= t0:
        return {"in_flight": None, "between_turns": None, "no_episode": None}
    calls = episodes = 0
    t, in_flight, between = t0, 0.0, 0.0
    for when, d_calls, d_episodes in sorted(events):
        when = min(max(when, t0), t1)
        in_flight += (when - t) * min(calls, n)
        between += (when - t) * max(min(episodes, n) - min(calls, n), 0)
        t, calls, episodes = when, calls + d_calls, episodes + d_episodes
    in_flight += (t1 - t) * min(calls, n)
    between += (t1 - t) * max(min(episodes, n) - min(calls, n), 0)
    total = (t1 - t0) * n
    return {"in_flight": share(in_flight, total), "between_turns": share(between, total),
            "no_episode": share(total - in_flight - between, total), "slot_s_between_turns": round(between, 3)}


def limit_run(wall_s: float, replies: Sequence[dict], server: dict | None = None) -> dict:
    """One timed run of the limit: ``replies`` are the OpenAI-style bodies (``usage``) of its requests."""
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    prompt = sum(r["usage"]["prompt_tokens"] for r in replies)
    return {"wall_s": round(wall_s, 2), "requests": len(replies), "prompt_tokens": prompt,
            "prompt_tokens_per_request": round(prompt / len(replies), 1), "generated_tokens": generated, "gen_tok_per_s": round(generated / wall_s, 2), "server": server or {}}


def ours_run(wall_s: float, questions: int, accounting: dict[str, float], role: str, slots: dict,
             finish: dict[str, int], server: dict | None = None) -> dict:
    """One timed run of the evaluation loop from the pool's accounting of ``role`` during the run. Failed calls are
    counted and shown: a run with failures is reported as such, not scored as if it had decoded."""
    a = {k.rsplit(".", 1)[-1]: v for k, v in accounting.items() if k.startswith(f"llm.{role}.")}
    generated = int(a.get("completion_tokens", 0))
    return {"wall_s": round(wall_s, 2), "questions": questions, "questions_per_min": round(questions / wall_s * 60, 2),
            "calls": int(a.get("calls", 0)), "failed_calls": int(a.get("failures", 0)),
            "cache_hits": int(a.get("cache_hits", 0)), "prompt_tokens": int(a.get("prompt_tokens", 0)),
            "generated_tokens": generated, "gen_tok_per_s": round(generated / wall_s, 2),
            "generated_per_call": round(generated / a["calls"], 1) if a.get("calls") else None,
            "slots": slots, "finish_reasons": dict(finish), "server": server or {}}


def median_of(runs: Sequence[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def compare(n: int, limit_runs: Sequence[dict], ours: Sequence[dict], target: float = TARGET) -> dict:
    """The row the suite reads for concurrency ``n``: ours / limit generated tokens/s (medians over rounds), against
    ``target``. Questions/minute at the limit's rate is what ours would reach decoding its own tokens per question at
    the limit's tokens/s."""
    lim, our = median_of(limit_runs, "gen_tok_per_s"), median_of(ours, "gen_tok_per_s")
    ratio = our / lim if lim else 0.0
    qpm = median_of(ours, "questions_per_min")
    per_q = statistics.median(r["generated_tokens"] / r["questions"] for r in ours)
    failed = sum(r["failed_calls"] for r in ours)
    figures = (f"ours {our:.1f} tok/s, {qpm:.2f} questions/min; limit {lim:.1f} tok/s "
               f"(= {lim * 60 / per_q:.2f} questions/min at {per_q:.0f} tokens a question)" if per_q else
               f"ours {our:.1f} tok/s; limit {lim:.1f} tok/s")
    if failed:
        figures += f"; {failed} failed policy calls"
    return {"measure": f"ours / native llama-server, generated tokens/s, N={n}", "n": n, "ratio": round(ratio, 3),
            "unit": "x", "ours_gen_tok_per_s": our, "limit_gen_tok_per_s": lim, "ours_questions_per_min": qpm,
            "failed_calls": failed, "rounds": len(ours), "figures": figures, "target": target,
            "met": bool(ratio >= target and not failed)}


def gap(limit_runs: Sequence[dict], ours: Sequence[dict]) -> dict:
    """Where ours' tokens/s went against the limit's, medians over rounds of the instrumented figures."""
    def med(runs, *path):
        values = []
        for r in runs:
            v = r
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            if v is not None:
                values.append(v)
        return round(statistics.median(values), 3) if values else None

    out = {}
    for side, runs in (("limit", limit_runs), ("ours", ours)):
        out[side] = {k: med(runs, "server", k) for k in (
            "prompt_processed_per_generated", "prompt_cached_share", "busy_slots_per_decode")}
    out["ours"].update({f"slot_share_{k}": med(ours, "slots", k) for k in ("in_flight", "between_turns", "no_episode")})
    out["ours"]["generated_per_call"] = med(ours, "generated_per_call")
    out["limit"]["generated_per_call"] = med([{"g": r["generated_tokens"] / r["requests"]} for r in limit_runs], "g")
    return out


def step_costs(per_n: dict) -> dict | None:
    """A decode step's time against the tokens it carries, fitted on the limit's runs and read against ours'.

    llama-server puts every busy slot's next token and the prompt tokens waiting to be read into one batch, so a
    step costs about ``fixed + per_token x tokens``: the fixed part reads the weights, the per-token part is the
    matmuls. Fitted by least squares (numpy) on the limit's runs (two or more concurrencies, else None), the fit
    says how much of ours' slower steps the tokens in them explain; what is left (``unexplained_s``) is the rest:
    attention over ours' longer contexts, scheduling. A step's time is the run's wall time over its decode steps,
    so a run's idle stretches count against its steps. Ours / limit tokens/s is then ``occupancy`` (busy slots a
    step, ours / limit) times ``step_speed`` (the limit's seconds a step / ours'), as each busy slot decodes one
    token a step."""
    import numpy as np

    def per_step(run: dict) -> dict | None:
        s = run.get("server") or {}
        steps = s.get("decode_steps")
        if not steps:
            return None
        return {"tokens": (s["generated_tokens"] + s["prompt_tokens_processed"]) / steps,
                "prompt": s["prompt_tokens_processed"] / steps, "busy": s["busy_slots_per_decode"],
                "s": run["wall_s"] / steps}

    limits = [p for d in per_n.values() for p in map(per_step, d["limit"]) if p]
    if len({round(p["tokens"], 6) for p in limits}) < 2:
        return None
    per_token, fixed = np.polyfit([p["tokens"] for p in limits], [p["s"] for p in limits], 1)
    out: dict = {"fit": {"fixed_s": round(float(fixed), 4), "per_token_s": round(float(per_token), 5),
                         "points": len(limits)}, "per_n": {}}
    for n, d in sorted(per_n.items(), key=lambda kv: int(kv[0])):
        sides = {side: [p for p in map(per_step, d[side]) if p] for side in ("limit", "ours")}
        if not all(sides.values()):
            continue
        med = {side: {k: statistics.median(p[k] for p in runs) for k in ("tokens", "prompt", "s", "busy")}
               for side, runs in sides.items()}
        row = {}
        for side, m in med.items():
            fitted = float(fixed + per_token * m["tokens"])
            row[side] = {"tokens_per_step": round(m["tokens"], 2), "prompt_tokens_per_step": round(m["prompt"], 2),
                         "busy_slots_per_step": round(m["busy"], 2), "s_per_step": round(m["s"], 4),
                         "fitted_s_per_step": round(fitted, 4), "unexplained_s": round(m["s"] - fitted, 4) + 0.0}
        row["occupancy"] = round(med["ours"]["busy"] / med["limit"]["busy"], 3)
        row["step_speed"] = round(med["limit"]["s"] / med["ours"]["s"], 3)
        row["step_speed_from_tokens"] = round(med["limit"]["s"] / row["ours"]["fitted_s_per_step"], 3)
        out["per_n"][str(n)] = row
    return out


def report(per_n: dict[int, dict], workload: dict, machine: dict, meta: dict) -> dict:
    rows = [compare(n, d["limit"], d["ours"]) for n, d in sorted(per_n.items())]
    for d in per_n.values():
        d["gap"] = gap(d["limit"], d["ours"])
    return {**meta, "workload": workload, "machine": machine, "rows": rows,
            "per_n": {str(n): d for n, d in sorted(per_n.items())}, "step_cost": step_costs(per_n)}


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


def table(rep: dict) -> str:
    """The printed table: one line per N, then where the gap goes."""
    head = ["N", "limit tok/s", "ours tok/s", "ours q/min", "ours / limit", "met (>= 0.8)", "failed calls"]
    lines = [head] + [[str(r["n"]), fmt(r["limit_gen_tok_per_s"]), fmt(r["ours_gen_tok_per_s"]),
                       fmt(r["ours_questions_per_min"]), fmt(r["ratio"]), "yes" if r["met"] else "NO",
                       str(r["failed_calls"])] for r in rep["rows"]]
    gap_head = ["N", "side", "gen./call", "prompt proc./gen.", "prompt cached", "busy slots/step", "slots: in flight",
                "between turns", "no episode"]
    gaps = [gap_head]
    for n, d in rep["per_n"].items():
        for side in ("limit", "ours"):
            g = d["gap"][side]
            gaps.append([n, side, fmt(g["generated_per_call"]), fmt(g["prompt_processed_per_generated"]), fmt(g["prompt_cached_share"]),
                         fmt(g["busy_slots_per_decode"]), *(fmt(g.get(f"slot_share_{k}")) for k in (
                             "in_flight", "between_turns", "no_episode"))])

    def render(rows):
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    text = render(lines) + "\n\nwhere the gap goes (medians over rounds):\n" + render(gaps)
    cost = rep.get("step_cost")
    if cost:
        fit = cost["fit"]
        steps = [["N", "side", "tokens/step", "of them prompt", "busy slots", "s/step", "fitted s/step", "unexplained s"]]
        for n, row in cost["per_n"].items():
            for side in ("limit", "ours"):
                r = row[side]
                steps.append([n, side, fmt(r["tokens_per_step"]), fmt(r["prompt_tokens_per_step"]),
                              fmt(r["busy_slots_per_step"]), fmt(r["s_per_step"]), fmt(r["fitted_s_per_step"]),
                              fmt(r["unexplained_s"])])
        text += (f"\n\na decode step's cost, fitted on the limit's {fit['points']} runs: {fit['fixed_s']} s + "
                 f"{fit['per_token_s']} s a token in the batch\n" + render(steps) + "\n" + "\n".join(
                     f"N={n}: ours / limit = occupancy {row['occupancy']} x step speed {row['step_speed']} "
                     f"(the tokens in ours' steps alone give {row['step_speed_from_tokens']})"
                     for n, row in cost["per_n"].items()))
    return text


def load() -> dict:
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count()}


# --- running against the real server -------------------------------------------------------------------------------


def median_completion_tokens(record: Path, model_prefix: str) -> int | None:
    """Median completion tokens of the policy's calls in a stage's response record (components/llm/response_record.py)."""
    if not record.is_file():
        return None
    counts = []
    for line in record.read_text().splitlines():
        try:
            c = json.loads(line).get("completion", {})
        except json.JSONDecodeError:  # a line the running stage is still writing
            continue
        if str(c.get("model", "")).startswith(model_prefix):
            counts.append(c["completion_tokens"])
    return int(statistics.median(counts)) if counts else None


def bench_params(args, n: int, cache_dir: Path):
    from components.params import for_method
    from components.params_load import load_params

    sets = [f"evaluation.n_questions={args.questions}", f"evaluation.episode_concurrency={n}",
            "llm.middleware.cache=false", f"run.cache_dir={cache_dir}", "evaluation.llm_judge=false"]
    base, _ = for_method(load_params(args.params), args.method)
    backend = base.llm.roles["policy"]
    sets.append(f"llm.backends.{backend}.parallel={n}")
    if args.no_adapter:
        sets += [f"llm.backends.{backend}.lora=null", f"llm.backends.{backend}.merge_lora=false"]
    params, spec = for_method(load_params(args.params, None, sets), args.method)
    return params, spec, backend


def first_turns(params, spec, toolbox, questions) -> list[tuple[list[dict], dict]]:
    """The messages (and sampling) of each question's first policy call, caught by a model that records the call
    and fails it, so no model runs."""
    from components.agents.react import agent_options, build_agent
    from components.llm.base import ChatModel, PermanentLLMError
    from components.llm.middleware import ReliableChatModel

    caught: dict[str, tuple[list[dict], dict]] = {}

    class Catch(ChatModel):
        name = "catch"

        def __init__(self):
            self.question = None

        async def _complete(self, messages, sampling):
            caught.setdefault(self.question, ([m.model_dump() for m in messages], sampling.model_dump()))
            raise PermanentLLMError("caught the first turn")

    model = Catch()
    agent = build_agent(spec.agent, lambda role: ReliableChatModel(model, role=role), toolbox, params.agent,
                        agent_options(params, spec))

    async def run():
        for i, q in enumerate(questions):
            model.question = q.id
            await agent.run(q, seed=params.seed + i)

    asyncio.run(run())
    missing = [q.id for q in questions if q.id not in caught]
    if missing:
        raise RuntimeError(f"the agent made no policy call for questions {missing}")
    return [caught[q.id] for q in questions]


def scrape(root_url: str, client) -> dict[str, float]:
    r = client.get(f"{root_url}/metrics", timeout=30)
    r.raise_for_status()
    return parse_metrics(r.text)


def run_limit(root_url: str, model: str, turns, n: int, requests: int, gen_tokens: int) -> dict:
    import httpx

    bodies = [{"model": model, "messages": turns[i % len(turns)][0], "max_tokens": gen_tokens, "temperature": 0.0,
               "ignore_eos": True, "seed": 0} for i in range(requests)]
    with httpx.Client(timeout=1800) as client:
        def one(body):
            r = client.post(f"{root_url}/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()

        before = scrape(root_url, client)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            replies = list(pool.map(one, bodies))
        wall = time.perf_counter() - t0
        after = scrape(root_url, client)
    short = [r["usage"]["completion_tokens"] for r in replies if r["usage"]["completion_tokens"] != gen_tokens]
    if short:
        raise RuntimeError(f"the server ignored ignore_eos: completions of {short} tokens, asked for {gen_tokens}")
    return limit_run(wall, replies, server_delta(before, after))


class Timed:
    """A role's model that logs when each of its calls starts and ends (``(time, +1 or -1, 0)``)."""

    def __init__(self, inner, log: list):
        self.inner, self.log = inner, log

    async def chat(self, *args, **kwargs):
        self.log.append((time.perf_counter(), 1, 0))
        try:
            return await self.inner.chat(*args, **kwargs)
        finally:
            self.log.append((time.perf_counter(), -1, 0))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run_ours(params, spec, pool, toolbox, questions, root_url: str, n: int) -> dict:
    import httpx

    from components.agents.react import agent_options, build_agent

    events: list[tuple[float, int, int]] = []
    agent = build_agent(spec.agent, lambda role: Timed(pool.role(role), events) if role == "policy" else pool.role(role),
                        toolbox, params.agent, agent_options(params, spec))
    before_acc = pool.accounting.metrics()
    finish: Counter = Counter()

    async def run_all():
        episodes = asyncio.Semaphore(n)

        async def one(i, q):
            async with episodes:
                events.append((time.perf_counter(), 0, 1))
                try:
                    t = await agent.run(q, seed=params.seed + i)
                finally:
                    events.append((time.perf_counter(), 0, -1))
            finish[t.finish_reason] += 1
        try:
            await asyncio.gather(*(one(i, q) for i, q in enumerate(questions)))
        finally:
            await pool.aclose()

    with httpx.Client() as client:
        before = scrape(root_url, client)
        t0 = time.perf_counter()
        asyncio.run(run_all())
        t1 = time.perf_counter()
        after = scrape(root_url, client)
    after_acc = pool.accounting.metrics()
    delta = {k: v - before_acc.get(k, 0.0) for k, v in after_acc.items()}
    return ours_run(t1 - t0, len(questions), delta, "policy", slot_breakdown(events, n, t0, t1), dict(finish),
                    server_delta(before, after))


def git(*a: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, check=False).stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    """How it measures, and what it writes.

    - the limit: the native ``llama-server`` serving the policy as ``evaluate@sft`` serves it (the backend of the
      method's ``policy`` role, started by :class:`components.llm.factory.LLMPool`: its slots, its adapter merged as
      ``merge_lora`` says), sent agent-turn-like requests straight over HTTP, N in flight at a time: the first-turn
      messages the agent sends for other test questions (one a request), each decoding a fixed ``--gen-tokens`` tokens
      (``ignore_eos``, no stop strings). Aggregate generated tokens/s;
    - ours: the evaluation's agent loop (:func:`components.agents.react.build_agent`, the pool, the toolbox, N episodes
      at once as ``tasks/evaluate.py`` runs them) on ``--questions`` questions, the response cache off so every call
      decodes, on the same server. Questions per minute and generated tokens/s (the pool's accounting of the policy
      role), and ours / limit at the same N against the issue's target of 0.8.

    Per N the server is started once (``parallel`` = N, ``evaluation.episode_concurrency`` = N) and the two sides run
    in turns, limit then ours, ``--rounds`` times, so load from other work falls on both alike; figures are medians
    over rounds. Where the gap goes is measured, not guessed: llama-server's ``/metrics`` (turned on through
    ``LLAMA_ARG_ENDPOINT_METRICS``) gives, per side, prompt tokens processed and taken from the prompt cache per
    generated token and busy slots per decode step; the start and end of every policy call and episode split ours'
    slot-time into slots with a call in flight, slots whose episode is between turns (tool calls, retrieval, Python)
    and slots with no episode left to run (episodes finishing at different times).

    ``--no-adapter`` serves the base 0.5B instead (the JSON says so). Models and merged weights are read from and written
    to a temporary ``run.cache_dir`` whose ``models/`` links to ``.cache/models``. Prints a table and writes JSON:
    ``rows`` (ours / limit per N, with ``target`` and ``met`` for ``python -m perf``), ``per_n`` (every run of both
    sides and the gap breakdown), the workload, and the load average before and after.
    ``step_cost`` fits a decode step's time to the tokens it carries on the limit's runs and reads ours' steps through
    it (:func:`step_costs`); ``--analyse FILE`` adds it to a JSON written before it existed, running nothing.
    """
    from components.io import write_json
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=4, help="evaluation questions per run of ours")
    parser.add_argument("--n", type=int, nargs="+", default=[4, 8], help="concurrencies (server slots = episodes)")
    parser.add_argument("--rounds", type=int, default=1, help="limit, ours, limit, ours, ... per N")
    parser.add_argument("--gen-tokens", default="auto",
                        help="tokens each limit request decodes; auto: the median of the policy's calls in "
                             "outputs/responses/evaluate/<method>.jsonl (else react.jsonl, else 32)")
    parser.add_argument("--limit-requests", type=int, default=0, help="requests per limit run (default 2N)")
    parser.add_argument("--method", default="sft")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--no-adapter", action="store_true", help="serve the base 0.5B (before the sft stage has run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--analyse", type=Path, metavar="JSON",
                        help="run nothing: add the step-cost fit to a JSON this script wrote, and print its tables")
    args = parser.parse_args(argv)
    if args.analyse:
        rep = json.loads(args.analyse.read_text())
        rep["step_cost"] = step_costs(rep["per_n"])
        print(table(rep))
        write_json(args.analyse, rep, sort_keys=False)
        print(f"wrote {args.analyse}")
        return 0
    os.chdir(REPO)
    os.environ["LLAMA_ARG_ENDPOINT_METRICS"] = "1"  # the servers the pool starts inherit it: /metrics on

    from components.embedded.models import default_cache_dir
    from components.io import read_jsonl
    from components.llm.factory import LLMPool
    from components.retrieval.run_index import load_toolbox
    from components.run_files import out_path
    from components.schemas import Question

    machine = {"load_before": load()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_serving_") as tmp:
        cache_dir = Path(tmp)
        (cache_dir / "models").symlink_to(default_cache_dir() / "models")
        params0, spec0, backend = bench_params(args, args.n[0], cache_dir)
        cfg = params0.llm.backends[backend]
        if cfg.server != "native" or cfg.type != "openai":
            parser.error(f"--method {args.method}: its policy backend {backend!r} is not a native llama-server")
        adapters = cfg.adapters
        for a in adapters:
            if not (Path(a) / "adapter_config.json").is_file():
                parser.error(f"{a}: no adapter there (adapter_config.json); run the sft stage first, or pass "
                             "--no-adapter to serve the base model")
        test = read_jsonl(out_path(params0.run, "data", "test.jsonl"), Question)
        most_requests = max(args.limit_requests or 2 * n for n in args.n)
        if len(test) < args.questions + most_requests:
            parser.error(f"{out_path(params0.run, 'data', 'test.jsonl')}: {len(test)} questions; this run needs "
                         f"{args.questions} for ours and {most_requests} other ones for the limit's prompts")
        # ours runs the first questions; the limit sends the first turns of the last ones, so that no prompt the
        # limit leaves in a slot's cache is one ours is about to send
        questions, others = test[: args.questions], test[len(test) - most_requests:]
        toolbox = load_toolbox(params0.run, params0.retrieval, params0.agent.observation_max_chars)
        turns = first_turns(params0, spec0, toolbox, others)
        gen_source = "--gen-tokens"
        if args.gen_tokens == "auto":
            prefix = params0.llm.backends[backend].embedded or ""
            gen_tokens = None
            for name in (args.method, "react"):
                record = out_path(params0.run, "responses", "evaluate", f"{name}.jsonl")
                gen_tokens = median_completion_tokens(record, prefix)
                if gen_tokens:
                    gen_source = f"median of the policy's calls in {record}"
                    break
            if not gen_tokens:
                gen_tokens, gen_source = 32, "default (no response record to read)"
        else:
            gen_tokens = int(args.gen_tokens)
        print(f"{len(questions)} questions; limit requests decode {gen_tokens} tokens ({gen_source}); "
              f"adapter: {adapters or 'none (base model)'}", flush=True)

        per_n: dict[int, dict] = {}
        for n in args.n:
            params, spec, _ = bench_params(args, n, cache_dir)
            requests = args.limit_requests or 2 * n
            with LLMPool(params) as pool:
                model = pool.backend(backend)  # starts the server as evaluate@<method> does
                root_url = model.base_url.removesuffix("/v1")
                run_limit(root_url, model.model, turns[:1], 1, 1, 4)  # warm-up
                d = {"limit": [], "ours": [], "limit_requests": requests}
                for r in range(args.rounds):
                    d["limit"].append(run_limit(root_url, model.model, turns, n, requests, gen_tokens))
                    print(f"  N={n} round {r + 1}: limit {d['limit'][-1]['gen_tok_per_s']} tok/s "
                          f"({d['limit'][-1]['wall_s']} s)", flush=True)
                    d["ours"].append(run_ours(params, spec, pool, toolbox, questions, root_url, n))
                    print(f"  N={n} round {r + 1}: ours {d['ours'][-1]['gen_tok_per_s']} tok/s, "
                          f"{d['ours'][-1]['questions_per_min']} q/min ({d['ours'][-1]['wall_s']} s)", flush=True)
            per_n[n] = d
    machine["load_after"] = load()
    machine["wall_s"] = round(time.perf_counter() - started, 1)
    workload = {"method": args.method, "policy_backend": backend, "questions": args.questions, "n": args.n,
                "rounds": args.rounds, "gen_tokens": gen_tokens, "gen_tokens_source": gen_source,
                "limit_prompts": f"the first-turn messages of the last {most_requests} test questions (none of "
                                 "ours), one a request; ignore_eos, no stop strings",
                "adapter": adapters or "none: --no-adapter, the base 0.5B is served",
                "merge_lora": bool(cfg.merge_lora), "n_ctx_per_slot": cfg.n_ctx, "threads": cfg.threads,
                "response_cache": False}
    meta = {"date": dt.date.today().isoformat(), "commit": git("rev-parse", "--short", "HEAD"),
            "command": "python perf/bench_serving.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rep = report(per_n, workload, machine, meta)
    print(table(rep))
    print(f"load average {machine['load_before']['loadavg']} -> {machine['load_after']['loadavg']}")
    write_json(args.out, rep, sort_keys=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
