"""components/reporting/reproduction.py on tiny hand-made outputs: the same bytes are identical, a metrics file off
by 1e-9 is within tolerance, EM 0.52 against 0.54 is changed with that difference; CSV losses to six decimals,
trajectories by their final answers, a folder by its worst file. Well under a second.

    .venv/bin/python -m pytest -q tests/reporting/test_reproduction.py
"""

from __future__ import annotations

import json

from components.reporting import reproduction
from components.reporting.reproduction import CHANGED, IDENTICAL, WITHIN, compare


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def metrics(path, **values):
    return write(path, json.dumps({"em": 0.52, "f1": 0.61, "judged": 50, "policy": "qwen", **values}, indent=2))


def test_the_same_bytes_are_identical(tmp_path):
    a = metrics(tmp_path / "a" / "metrics.json")
    b = metrics(tmp_path / "b" / "metrics.json")
    assert compare(a, b).label == IDENTICAL


def test_metrics_off_by_1e9_are_within_tolerance_and_off_by_a_question_changed(tmp_path):
    locked = metrics(tmp_path / "locked" / "metrics.json")
    close = compare(locked, metrics(tmp_path / "close" / "metrics.json", f1=0.61 + 1e-9))
    assert close.label == WITHIN and "`f1`" in close.difference and str(reproduction.METRICS_ABS_TOL) in close.compared
    moved = compare(locked, metrics(tmp_path / "moved" / "metrics.json", em=0.54, f1=0.61 + 1e-9))
    assert moved.label == CHANGED and "0.02 at `em` (0.52 vs 0.54)" in moved.difference
    renamed = compare(locked, metrics(tmp_path / "renamed" / "metrics.json", policy="llama"))
    assert renamed.label == CHANGED and "'qwen' vs 'llama'" in renamed.difference  # a string is not a number


def test_csv_losses_count_to_the_stated_decimals(tmp_path):
    locked = write(tmp_path / "a" / "loss.csv", "step,loss,phase\n1,2.3456781,sft\n2,1.2000004,sft\n")
    six = write(tmp_path / "b" / "loss.csv", "step,loss,phase\n1,2.3456782,sft\n2,1.2000003,sft\n")
    assert compare(locked, six).label == WITHIN
    five = write(tmp_path / "c" / "loss.csv", "step,loss,phase\n1,2.3456781,sft\n2,1.2000104,sft\n")
    found = compare(locked, five)
    assert found.label == CHANGED and "row 2, loss" in found.difference
    assert compare(locked, write(tmp_path / "d" / "loss.csv", "step,loss,phase\n1,2.3456781,sft\n")).label == CHANGED


def trajectories(path, answers):
    return write(path, "".join(json.dumps({"question_id": q, "final_answer": a, "steps": [{"raw": f"{a} {tokens}"}]})
                               + "\n" for (q, a), tokens in zip(answers.items(), range(len(answers)))))


def test_trajectories_compare_by_their_final_answers(tmp_path):
    locked = trajectories(tmp_path / "a" / "t.jsonl", {"q1": "Paris", "q2": None})
    other_steps = write(tmp_path / "b" / "t.jsonl", locked.read_text().replace("Paris 0", "Paris, France 0"))
    assert compare(locked, other_steps).label == WITHIN
    found = compare(locked, trajectories(tmp_path / "c" / "t.jsonl", {"q1": "Paris", "q2": "Lyon"}))
    assert found.label == CHANGED and "1 of 2 final answers differ" in found.difference and "`q2`" in found.difference
    records = write(tmp_path / "r" / "x.jsonl", '{"key": "1"}\n{"key": "2"}\n')  # no answers: lines are all there is
    assert compare(records, write(tmp_path / "s" / "x.jsonl", '{"key": "1"}\n{"key": "3"}\n')).label == CHANGED


def test_a_folder_is_its_worst_file(tmp_path):
    for side, em in (("locked", 0.52), ("fresh", 0.52)):
        write(tmp_path / side / "blob.bin", "same")
        metrics(tmp_path / side / "sub" / "metrics.json", em=em)
    assert compare(tmp_path / "locked", tmp_path / "fresh").label == IDENTICAL
    metrics(tmp_path / "fresh" / "sub" / "metrics.json", em=0.52 + 1e-9)
    assert compare(tmp_path / "locked", tmp_path / "fresh").label == WITHIN
    write(tmp_path / "fresh" / "blob.bin", "other")
    found = compare(tmp_path / "locked", tmp_path / "fresh")
    assert found.label == CHANGED and found.difference.startswith("`blob.bin`")
    write(tmp_path / "fresh" / "extra.bin", "")
    assert "on one side only" in compare(tmp_path / "locked", tmp_path / "fresh").difference
