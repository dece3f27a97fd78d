"""scripts/probe_verifier_wording.py: distinct actions of each kind up to a cap, and a table of how often the
verdict is right per wording and kind, failed verdicts left out of the rate."""

import importlib.util
import math
from pathlib import Path

from components.schemas import BranchingPoint, Candidate

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_verifier_wording.py"
spec = importlib.util.spec_from_file_location("probe_verifier_wording", SCRIPT)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def point(qid, actions, depth=0):
    return BranchingPoint(question_id=qid, question="?", depth=depth,
                          candidates=[Candidate(action=a, model="m", temperature=0.4) for a in actions])


def test_actions_are_distinct_per_point_and_capped_per_kind():
    points = [point("q1", ["search[a]", "search[a]", "finish[x]", "browse[d1]"]),
              point("q2", ["search[a]", "finish[y]", "search[b]"])]
    items = script.actions_by_kind(points, per_kind=2)
    assert [(p.question_id, a, c) for p, a, c in items] == [
        ("q1", "search[a]", True), ("q1", "finish[x]", False), ("q1", "browse[d1]", True), ("q2", "finish[y]", False)]


def test_table_rates_each_kind_and_leaves_failures_out():
    wording = "Does not give a final answer yet"
    rows = [{"wording": wording, "continues": True, "failed": False, "right": True},
            {"wording": wording, "continues": True, "failed": False, "right": False},
            {"wording": wording, "continues": True, "failed": True, "right": None},
            {"wording": wording, "continues": False, "failed": False, "right": True}]
    line = next(r for r in script.table(rows) if r["wording"] == wording)
    assert (line["search_or_browse.n"], line["search_or_browse.right"]) == (2, 0.5)
    assert (line["finish.n"], line["finish.right"], line["failed"]) == (1, 1.0, 1)
    other = next(r for r in script.table(rows) if r["wording"] != wording)
    assert other["finish.n"] == 0 and math.isnan(other["finish.right"])
