"""The kill harness's comparison and kill mechanics on hand-made files and a toy process, so that a kill test
passing means the outputs matched, not that the comparison could not see a difference.

    .venv/bin/python -m pytest -q tests/reliability/test_kill_compare.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from tests.reliability.kill import (
    Case,
    KillPoint,
    Workspace,
    compare_trees,
    count_lines,
    resume_and_compare,
    run_killed,
)

EPISODES = [{"question_id": f"q{i}", "final_answer": f"a{i}", "wall_s": 0.1 * i} for i in range(3)]


def write_run(root: Path, episodes: list[dict], weight: float = 1.0, loss: float = 0.5) -> Path:
    (root / "eval").mkdir(parents=True)
    (root / "eval" / "trajectories.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (root / "eval" / "metrics.json").write_text(json.dumps({"em": 0.5, "wall_s": weight}))
    pd.DataFrame({"step": [1, 2], "loss": [loss, 0.25], "time/rollout": [weight, 2.0]}).to_csv(
        root / "metrics.csv", index=False)
    save_file({"lora_A": torch.full((2, 2), weight)}, str(root / "adapter.safetensors"))
    return root


def test_identical_runs_differ_only_in_wall_clock_fields(tmp_path):
    ref = write_run(tmp_path / "ref", EPISODES)
    got = write_run(tmp_path / "got", [{**e, "wall_s": 9.0} for e in EPISODES])
    (got / "metrics.csv").write_text((got / "metrics.csv").read_text().replace("1.0,", "7.5,"))  # a time/ column
    assert compare_trees(ref, got) == []


@pytest.mark.parametrize(("episodes", "expected"), [
    (EPISODES + [EPISODES[1]], "1 duplicated record(s)"),
    (EPISODES[:2], "1 record(s) lost"),
    ([EPISODES[0], {**EPISODES[1], "final_answer": "other"}, EPISODES[2]], "record ('q1', None) differs"),
])
def test_a_lost_duplicated_or_changed_record_is_a_difference(tmp_path, episodes, expected):
    ref, got = write_run(tmp_path / "ref", EPISODES), write_run(tmp_path / "got", episodes)
    differences = compare_trees(ref, got)
    assert any(expected in d for d in differences), differences


def test_a_tensor_a_metric_or_a_missing_file_is_a_difference(tmp_path):
    ref = write_run(tmp_path / "ref", EPISODES)
    assert compare_trees(ref, write_run(tmp_path / "w", EPISODES, weight=1.0 + 1e-6)) == \
        ["adapter.safetensors: tensor lora_A differs (max abs 9.5367431640625e-07)"]
    assert compare_trees(ref, write_run(tmp_path / "l", EPISODES, loss=0.5000001))[0].startswith("metrics.csv:")
    missing = write_run(tmp_path / "m", EPISODES)
    (missing / "eval" / "metrics.json").unlink()
    assert compare_trees(ref, missing) == ["eval/metrics.json: missing after resume"]


TOY = """import json, subprocess, sys, time, pathlib
out = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("run.out_dir=")))
out.mkdir(parents=True, exist_ok=True)
# a helper process: it exits once its parent is gone, unless it is told to outlive it (an orphan)
wait = "time.sleep(30)" if "orphan" in sys.argv else "while os.getppid() != 1: time.sleep(0.05)"
child = subprocess.Popen([sys.executable, "-c", "import os, time\\n" + wait])
path = out / "records.jsonl"
done = len(path.read_text().splitlines()) if path.exists() else 0
for i in range(done, 5):
    time.sleep(0.2)
    with path.open("a") as f:
        f.write(json.dumps({"id": i}) + "\\n")
child.kill()
"""


@pytest.mark.parametrize("orphan", [False, True])
def test_a_killed_toy_stage_resumes_to_the_same_records_and_its_orphans_are_found(tmp_path, orphan):
    """A toy stage that appends one record per 0.2 s and resumes from its file, with a helper process: the harness
    kills it after record 2 and the resume completes the five records; a helper that outlives its killed parent
    is reported as an orphan."""
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    case = Case(name="toy", family="toy", args=(str(script), *(["orphan"] if orphan else [])), sets=(),
                folders=(".",), progress=count_lines("records.jsonl"), unit="record", timeout_s=60)
    ref = Workspace.fresh(tmp_path / "live")
    assert not run_killed(case, ref, KillPoint(after=99)).killed  # never reached: it runs to the end
    ref = ref.park(tmp_path / "ref")
    got = Workspace.fresh(tmp_path / "live")
    tracked: dict[int, float] = {}
    kill = run_killed(case, got, KillPoint(after=2), tracked)
    assert kill.killed and 2 <= kill.records < 5
    outcome = resume_and_compare(case, got, ref, [kill], tracked, grace_s=1)
    assert (outcome.records_resumed, outcome.records_reference) == (5, 5)
    assert outcome.identical, outcome.differences
    assert len(outcome.orphans) == (1 if orphan else 0), outcome.orphans


PYTHON_RNG = ("import json, sys; from components.training.checkpoint import rng_state, seed_rngs\n"
              "if sys.argv[1] == 'seeded': seed_rngs(7)\n"
              "print(json.dumps(rng_state()[0]))")


def test_seeded_processes_checkpoint_the_same_generator_states():
    """What a killed run's checkpoint holds must be what an uninterrupted run would hold at that step: two fresh
    processes seeded alike hold the same python and numpy states (unseeded, python's differs by process)."""
    import subprocess

    from tests.reliability.kill import ROOT, environment

    def states(mode: str) -> dict:
        out = subprocess.run([sys.executable, "-c", PYTHON_RNG, mode], cwd=ROOT, env=environment(),
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    assert states("seeded") == states("seeded")
    unseeded = [subprocess.run([sys.executable, "-c", "import random; print(random.getstate()[1][:4])"],
                               capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # what the stages' checkpoints held before they seeded python's generator


def test_markdown_tables_and_unchecked_keys(tmp_path):
    page = "# runs\n\n| variant | reward | wall_s |\n|:--|--:|--:|\n| grpo | {reward} | {wall} |\n"
    for name, reward, wall in [("ref", 0.5, 75), ("wall", 0.5, 20), ("reward", 0.25, 75)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "comparison.md").write_text(page.format(reward=reward, wall=wall))
        (tmp_path / name / "rng.json").write_text(json.dumps({"python": [wall], "numpy": [1]}))
    assert compare_trees(tmp_path / "ref", tmp_path / "wall", unchecked=(("rng.json", "python"),)) == []
    assert compare_trees(tmp_path / "ref", tmp_path / "wall") == ["rng.json: .python[0]: '75' != '20'"]
    assert compare_trees(tmp_path / "ref", tmp_path / "reward", unchecked=(("rng.json", "python"),)) == \
        ["comparison.md: [2].reward: '0.5' != '0.25'"]
