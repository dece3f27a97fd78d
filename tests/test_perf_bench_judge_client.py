"""``perf/bench_judge_client.py`` on a tiny run: the judged rows the suite reads, the side-by-side rows (httpx
client before, the old thread-per-connection server, the middleware alone) and every timed repetition recorded.
Structure only: the timings themselves are the benchmark's business, not a test's.

    .venv/bin/python -m pytest -q tests/test_perf_bench_judge_client.py
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

from perf import suite

ROOT = Path(__file__).resolve().parents[1]


def test_a_small_run_writes_judged_rows_and_the_side_by_side(tmp_path):
    out = tmp_path / "judge_client.json"
    subprocess.run([sys.executable, str(ROOT / "perf" / "bench_judge_client.py"), "--latency", "0.02", "--calls", "16",
                    "--concurrency", "4", "--repeats-conc", "2", "--repeats", "5", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert sorted((r["client"], r["server"]) for r in runs) == sorted(
        [("aiohttp", "aiohttp"), ("httpx (before)", "aiohttp"), ("aiohttp", "threads")] * 2)
    ideal = 16 / 4 * 0.02
    assert all(r["ratio"] == r["seconds"] / ideal and r["cpu_ms_per_call"] > 0 for r in runs)
    judged, cache = report["rows"][:2]
    ours = [r["ratio"] for r in runs if (r["client"], r["server"]) == ("aiohttp", "aiohttp")]
    assert judged["ratio"] == statistics.median(ours) and judged["ratios"] == [round(x, 3) for x in ours]
    assert judged["met"] == (judged["ratio"] <= 1.15) and cache["met"] == (cache["ratio"] >= 100)
    before, old_server, middleware = report["reported"]
    assert "target" not in before and before["client_cpu_ms_per_call"] > 0 and "httpx" in before["measure"]
    assert "http.server" in old_server["measure"] and middleware["middleware_cpu_us_per_call"] > 0
    # the suite shows the judged rows only: concurrency, cache, the three graph sizes
    assert [r["measure"] for r in suite.target_rows(report)] == [r["measure"] for r in report["rows"]]
    assert len(report["rows"]) == 5 and all(r["met"] for r in report["rows"][2:])
