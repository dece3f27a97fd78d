"""User errors read as errors: a bad ``--set``, a bad params file or a malformed input record stops a
stage with exit status 2 and one line on stderr saying what and where, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.io import RecordError
from components.params_section import ParamsError
from tasks.runtime import run_stage


def _stage(repo_root: Path, tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUBRICFLOW_MLFLOW": "0"}
    # outputs go under tmp_path first, so a regression that accepts the bad input writes nothing here
    cmd = [sys.executable, "-m", module, "--set", f"run.out_dir={tmp_path / 'out'}", *args]
    return subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300, check=False)


OVERRIDES = [
    ("grpo.lrr=1", "--set grpo.lrr=1: unknown key grpo.lrr"),
    ("data.n_test=-1", "--set data.n_test=-1: data.n_test: Input should be greater than or equal to 0 (got -1)"),
    ("seed.value=3", "--set seed.value=3: seed is a value, not a section"),
    ("data.n_test", "--set data.n_test: expected KEY=VALUE with a dotted key, e.g. data.n_test=10"),
]


@pytest.mark.parametrize(("override", "expected"), OVERRIDES[:2])
def test_bad_override_exits_2_with_one_line_naming_it(repo_root, tmp_path, override, expected):
    proc = _stage(repo_root, tmp_path, "tasks.prepare", "--set", override)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"prepare.py: error: {expected}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("override", "expected"), OVERRIDES)
def test_bad_override_through_prepare_main_in_process(repo_root, tmp_path, monkeypatch, capsys, override, expected):
    from tasks.prepare import main

    monkeypatch.chdir(repo_root)
    monkeypatch.setattr(sys, "argv", ["tasks/prepare.py", "--set", f"run.out_dir={tmp_path / 'out'}",
                                      "--set", override])
    with pytest.raises(SystemExit) as exit_:
        run_stage(main)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"prepare.py: error: {expected}\n"
    assert not (tmp_path / "out").exists()


def test_bad_params_file_exits_2_with_file_and_line(repo_root, tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text((repo_root / "params.yaml").read_text().replace("  n_test: 50\n", "  n_test: fifty\n"))
    line = bad.read_text().splitlines().index("  n_test: fifty") + 1
    proc = _stage(repo_root, tmp_path, "tasks.prepare", "--params", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        (f"prepare.py: error: {bad}:{line}: data.n_test: Input should be a valid integer, unable to parse string "
         "as an integer (got 'fifty')")]


def test_malformed_input_record_exits_2_with_file_line_and_field(repo_root, tmp_path):
    corpus = tmp_path / "out" / "data" / "corpus.jsonl"
    corpus.parent.mkdir(parents=True)
    corpus.write_text(json.dumps({"id": "d1", "title": "A", "text": "x"}) + "\n"
                      + json.dumps({"id": "d2", "title": "B"}) + "\n")
    proc = _stage(repo_root, tmp_path, "tasks.index")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"index.py: error: {corpus}:2: field 'text': Field required"]


def test_run_stage_turns_user_errors_into_exit_2_and_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/somewhere/tasks/collect.py"])

    def bad_record():
        raise RecordError("points.jsonl", 4, "slate.0", "Input should be a valid string")

    with pytest.raises(SystemExit) as exit_:
        run_stage(bad_record)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "collect.py: error: points.jsonl:4: field 'slate.0': Input should be a valid string\n"

    def multi_line():
        raise ParamsError("params.yaml:3: invalid YAML:\n  mapping values\n are not allowed")

    with pytest.raises(SystemExit):
        run_stage(multi_line)
    assert capsys.readouterr().err == "collect.py: error: params.yaml:3: invalid YAML: mapping values are not allowed\n"


def test_run_stage_leaves_other_exceptions_alone():
    def bug():
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        run_stage(bug)
