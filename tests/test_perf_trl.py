"""perf/bench_trl.py at its smallest shapes: both sides (ours and TRL) measured, on the same token counts.

Needs trl (the ``perf`` extra) and the embedded 0.5B's tokenizer (the ``embedded`` extra); skips without them.
About 30 s on 2 cores::

    .venv/bin/python -m pytest -q tests/test_perf_trl.py
"""

from __future__ import annotations

import json
import math
import sys

import pytest

from tests.conftest import ROOT, requires_embedded

pytest.importorskip("trl")
sys.path.insert(0, str(ROOT / "perf"))
import bench_trl


@requires_embedded
def test_prompts_have_the_asked_token_count():
    tok = bench_trl.load_tokenizer()
    prompts = bench_trl.make_prompts(tok, 3, 11, seed=5)
    assert len(set(prompts)) == 3
    assert [len(tok.encode(p, add_special_tokens=False)) for p in prompts] == [11, 11, 11]


@requires_embedded
def test_bench_trl_quick_runs_both_sides_on_the_same_tokens(tmp_path):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "bench_trl.json"
    try:
        rc = bench_trl.main(["--cases", "tiny", "--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    report = json.loads(out.read_text())
    shape = bench_trl.QUICK

    # every metric measured on both sides, as a positive finite number
    names = {name for kind in bench_trl.METRICS.values() for _, name in kind}
    got = {(r["side"], r["metric"]): r["value"] for r in report["results"] if r["case"] == "tiny"}
    for side in ("ours", "trl"):
        for name in names:
            assert math.isfinite(got[(side, name)]) and got[(side, name)] > 0, (side, name)

    # both sides generated / trained on exactly the tokens the shape asks for, every timed step
    checks = {c["kind"]: c for c in report["token_checks"]}
    assert checks["grpo"]["ours"] == checks["grpo"]["trl"] == [shape.prompts * shape.group * shape.completion_len]
    assert checks["sft"]["ours"] == checks["sft"]["trl"] == [shape.sft_batch * shape.sft_completion_len]
    assert all(c["same"] for c in checks.values())

    # the ratios are ours over TRL of the reported values, against the 1.0 target
    for q in report["ratios"]:
        assert q["ratio_ours_over_trl"] == pytest.approx(got[("ours", q["metric"])] / got[("trl", q["metric"])])
        assert q["met"] == (q["ratio_ours_over_trl"] >= 1.0)
    assert report["versions"]["trl"] and report["versions"]["torch"]
    assert report["lora"] == {"r": 8, "alpha": 16, "target_modules": list(bench_trl.TARGETS)}
