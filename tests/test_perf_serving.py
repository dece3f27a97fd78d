"""``perf/bench_serving.py`` (issue 49.4) without a model: the ratio of ours to the native server's tokens/s against
the 0.8 target, the gap breakdown from llama-server's ``/metrics`` and the slot sampler, the table and the JSON the
suite reads, all from fake timings. Under a second.

    .venv/bin/python -m pytest -q tests/test_perf_serving.py
"""

from __future__ import annotations

import json

import pytest

from tests.test_perf_suite import load

serving = load("bench_serving")
suite = load("suite")

METRICS_BEFORE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
llamacpp:prompt_tokens_cached_total 0
llamacpp:prompt_seconds_total 1.5
llamacpp:tokens_predicted_total 10
llamacpp:tokens_predicted_seconds_total 2
llamacpp:n_decode_total 10
llamacpp:n_busy_slots_per_decode 1
llamacpp:requests_processing 0
"""
METRICS_AFTER = """llamacpp:prompt_tokens_total 700
llamacpp:prompt_tokens_cached_total 1800
llamacpp:prompt_seconds_total 7.5
llamacpp:tokens_predicted_total 210
llamacpp:tokens_predicted_seconds_total 42
llamacpp:n_decode_total 60
llamacpp:n_busy_slots_per_decode 3
"""


def test_server_delta_recovers_the_window_from_cumulative_metrics():
    before, after = serving.parse_metrics(METRICS_BEFORE), serving.parse_metrics(METRICS_AFTER)
    assert before["prompt_tokens_total"] == 100 and before["n_busy_slots_per_decode"] == 1
    d = serving.server_delta(before, after)
    assert d["prompt_tokens_processed"] == 600 and d["generated_tokens"] == 200
    assert d["prompt_processed_per_generated"] == 3.0
    assert d["prompt_cached_share"] == 0.75  # 1800 cached of 2400
    # busy slot-steps: 3 x 60 - 1 x 10 = 170 over 50 steps in the window, not the server's running mean of 3
    assert d["decode_steps"] == 50 and d["busy_slots_per_decode"] == 3.4
    assert (d["slot_s_prompt"], d["slot_s_decode"]) == (6.0, 40.0)
    empty = serving.server_delta(before, before)
    assert empty["prompt_processed_per_generated"] is None and empty["busy_slots_per_decode"] is None


def test_slot_breakdown_splits_slot_time_into_in_flight_between_turns_and_no_episode():
    # N=2 over 10 s: two episodes start at 0; calls run 0-4 and 0-2; episode 2 ends at 5 after a tool gap 2-5;
    # episode 1 calls again 6-8 after a gap 4-6 and ends at 9; nothing runs 9-10
    events = [(0, 0, 1), (0, 0, 1), (0, 1, 0), (0, 1, 0), (2, -1, 0), (4, -1, 0), (5, 0, -1), (6, 1, 0), (8, -1, 0),
              (9, 0, -1)]
    parts = serving.slot_breakdown(events, 2, 0.0, 10.0)
    # in flight: 4 + 2 + 2 = 8 of 20 slot-seconds; between turns: 3 (ep 2) + 2 + 1 (ep 1) = 6; no episode: 6
    assert parts == {"in_flight": 0.4, "between_turns": 0.3, "no_episode": 0.3, "slot_s_between_turns": 6.0}
    # more calls than slots count as full slots, not more
    assert serving.slot_breakdown([(0, 3, 3), (1, -3, -3)], 2, 0.0, 2.0) == {
        "in_flight": 0.5, "between_turns": 0.0, "no_episode": 0.5, "slot_s_between_turns": 0.0}
    assert serving.slot_breakdown([], 4, 1.0, 1.0)["in_flight"] is None


def fake(n: int, limit_tok_s: list[float], ours_tok_s: list[float], failed: int = 0) -> dict:
    limit = [serving.limit_run(10.0, [{"usage": {"prompt_tokens": 150, "completion_tokens": t * 10 / (2 * n)}}] * (2 * n),
                               {"prompt_processed_per_generated": 6.0, "prompt_cached_share": 0.1,
                                "busy_slots_per_decode": float(n)}) for t in limit_tok_s]
    ours = []
    for t in ours_tok_s:
        acc = {"llm.policy.calls": 20.0, "llm.policy.failures": float(failed), "llm.policy.completion_tokens": t * 60,
               "llm.policy.prompt_tokens": 9000.0, "llm.answer_judge.completion_tokens": 999.0}
        ours.append(serving.ours_run(60.0, 4, acc, "policy", serving.slot_breakdown([(0, n, n), (1, 1 - n, 0)], n, 0.0, 2.0),
                                     {"answered": 4}, {"prompt_processed_per_generated": 2.5, "prompt_cached_share": 0.8,
                                                       "busy_slots_per_decode": 2.0}))
    return {"limit": limit, "ours": ours}


def test_ratio_against_the_target_uses_medians_and_counts_failures():
    row = serving.compare(4, *fake(4, [20.0, 10.0, 22.0], [17.0, 5.0, 18.0]).values())
    assert (row["limit_gen_tok_per_s"], row["ours_gen_tok_per_s"]) == (20.0, 17.0)
    assert row["ratio"] == 0.85 and row["met"] is True and row["target"] == 0.8
    assert row["ours_questions_per_min"] == 4.0 and "4.00 questions/min" in row["figures"]
    below = serving.compare(8, *fake(8, [30.0], [15.0]).values())
    assert below["ratio"] == 0.5 and below["met"] is False
    # the judge's tokens are not the policy's; a failed policy call fails the row whatever the ratio
    failing = serving.compare(4, *fake(4, [20.0], [19.0], failed=2).values())
    assert failing["ratio"] == 0.95 and failing["met"] is False and "2 failed policy calls" in failing["figures"]


def test_report_table_and_the_rows_the_suite_reads(tmp_path):
    rep = serving.report({4: fake(4, [20.0], [17.0]), 8: fake(8, [30.0], [15.0])}, {"questions": 4},
                         {"load_before": {"loadavg": [1, 2, 3]}, "load_after": {"loadavg": [2, 2, 3]}},
                         {"date": "2026-11-28", "commit": "abc1234", "command": "python perf/bench_serving.py"})
    gap = rep["per_n"]["8"]["gap"]
    assert gap["limit"]["prompt_processed_per_generated"] == 6.0 and gap["ours"]["prompt_cached_share"] == 0.8
    assert gap["ours"]["slot_share_in_flight"] == pytest.approx((8 + 1) / 16, abs=1e-3)
    assert gap["ours"]["generated_per_call"] == 45.0 and gap["limit"]["generated_per_call"] == 18.75
    text = serving.table(rep)
    assert "ours / limit" in text and "where the gap goes" in text
    line8 = next(line for line in text.splitlines() if line.startswith("8 ") and "NO" in line)
    assert "0.5" in line8

    path = tmp_path / "serving.json"
    path.write_text(json.dumps(rep))
    bench = next(b for b in suite.REGISTRY if b.name == "serving")
    assert bench.needs_models and bench.quick_skip and bench.recorded == "perf/results/serving.json"
    rows = suite.read_rows(bench, json.loads(path.read_text()))
    assert [(r["measure"], r["value"], r["target"], r["met"]) for r in rows] == [
        ("ours / native llama-server, generated tokens/s, N=4", 0.85, ">= 0.8", True),
        ("ours / native llama-server, generated tokens/s, N=8", 0.5, ">= 0.8", False)]


def steps_run(wall_s: float, steps: int, generated: int, prompt: int) -> dict:
    return {"wall_s": wall_s, "server": {"decode_steps": steps, "generated_tokens": generated,
                                         "prompt_tokens_processed": prompt, "busy_slots_per_decode": generated / steps}}


def test_step_costs_fit_the_limit_and_split_ours_ratio_into_occupancy_and_step_speed():
    # the limit's steps cost exactly 0.05 s + 0.005 s a token: 10 tokens a step at N=4, 20 at N=8
    per_n = {4: {"limit": [steps_run(10.0, 100, 400, 600)], "ours": [steps_run(30.0, 200, 600, 2400)]},
             8: {"limit": [steps_run(15.0, 100, 800, 1200)], "ours": [steps_run(15.0, 100, 600, 1400)]}}
    cost = serving.step_costs(per_n)
    assert cost["fit"] == {"fixed_s": pytest.approx(0.05), "per_token_s": pytest.approx(0.005), "points": 2}
    four = cost["per_n"]["4"]
    # ours at N=4: 15 tokens a step (12 of them prompt) -> 0.125 s fitted, 0.15 s measured
    assert four["ours"]["tokens_per_step"] == 15.0 and four["ours"]["prompt_tokens_per_step"] == 12.0
    assert four["ours"]["fitted_s_per_step"] == pytest.approx(0.125) and four["ours"]["unexplained_s"] == pytest.approx(0.025)
    assert four["limit"]["unexplained_s"] == pytest.approx(0.0)
    # tokens/s: ours 20 against the limit's 40, i.e. 3 of 4 slots busy x steps at 0.1 / 0.15 s
    assert (four["occupancy"], four["step_speed"], four["step_speed_from_tokens"]) == (0.75, 0.667, 0.8)
    assert four["occupancy"] * four["step_speed"] == pytest.approx((600 / 30) / (400 / 10), abs=1e-3)
    eight = cost["per_n"]["8"]
    assert eight["ours"]["unexplained_s"] == pytest.approx(0.0) and eight["step_speed"] == 1.0
    text = serving.table({"rows": [], "per_n": {}, "step_cost": cost})
    assert "0.05 s + 0.005 s a token" in text and "N=4: ours / limit = occupancy 0.75 x step speed 0.667" in text
    # one concurrency gives one point, too few for a line; no server figures, nothing to fit
    assert serving.step_costs({4: per_n[4]}) is None
    assert serving.step_costs({4: fake(4, [20.0], [17.0]), 8: fake(8, [30.0], [15.0])}) is None
