import functools
import json
import time

import pytest

from components.io import (
    JsonlAppender,
    RecordError,
    atomic_path,
    atomic_target,
    build_once,
    read_jsonl,
    read_parquet,
    write_json,
    write_jsonl,
    write_parquet,
)
from components.schemas import Document, Question, Step, ToolCall, Trajectory
from tests.side_by_side import run_side_by_side


def _questions():
    return [
        Question(id="q1", question="Who?", answers=["Ada", "A. L."], source="world", supporting_doc_ids=["d1"]),
        Question(id="q2", question="Where?", answers=["Paris"], source="world", type="bridge"),
    ]


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "q.jsonl"
    assert write_jsonl(path, _questions()) == 2
    assert read_jsonl(path, Question) == _questions()


def test_bad_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "q.jsonl"
    lines = [q.model_dump_json() for q in _questions()]
    bad = json.loads(lines[1])
    bad["answers"] = []
    path.write_text(lines[0] + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError) as err:
        read_jsonl(path, Question)
    assert err.value.line == 3 and err.value.field == "answers"
    assert str(err.value).startswith(f"{path}:3: field 'answers'")


def test_unknown_and_nested_fields_are_named(tmp_path):
    path = tmp_path / "t.jsonl"
    traj = Trajectory(question_id="q", question="?", steps=[Step(index=0, tool_call=ToolCall(name="search"))])
    data = traj.model_dump(mode="json")
    data["steps"][0]["tool_call"]["argumnts"] = {}
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(RecordError) as err:
        read_jsonl(path, Trajectory)
    assert err.value.field == "steps.0.tool_call.argumnts"


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(Document(id="a", title="A", text="x").model_dump_json() + "\n{not json\n")
    with pytest.raises(RecordError, match=r"d\.jsonl:2: invalid JSON"):
        read_jsonl(path, Document)


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "q.jsonl"
    write_jsonl(path, _questions())

    def exploding():
        yield _questions()[0]
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl(path, exploding())
    assert read_jsonl(path, Question) == _questions()
    assert [p.name for p in tmp_path.iterdir()] == ["q.jsonl"]  # no temp file left behind


def test_write_json_sorts_keys_unless_asked_to_keep_their_order_and_keeps_the_old_file_on_a_crash(tmp_path):
    path = tmp_path / "report.json"
    write_json(path, {"wall_s": 2.0, "command": "x"})
    assert list(json.loads(path.read_text())) == ["command", "wall_s"]
    write_json(path, {"wall_s": 1.0, "command": "y"}, sort_keys=False)  # a perf report, read top to bottom
    assert list(json.loads(path.read_text())) == ["wall_s", "command"]
    assert path.read_text().endswith("}\n")

    class Unwritable:
        def __str__(self):
            raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        write_json(path, {"a": 1, "z": Unwritable()}, sort_keys=False)
    assert json.loads(path.read_text()) == {"wall_s": 1.0, "command": "y"}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_appender_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "a.jsonl"
    with JsonlAppender(path) as out:
        out.append(_questions()[0])
    with path.open("a") as fh:
        fh.write('{"id": "q2", "quest')  # a crash in the middle of a line
    assert read_jsonl(path, Question, skip_torn_tail=True) == _questions()[:1]
    with pytest.raises(RecordError):
        read_jsonl(path, Question)
    with JsonlAppender(path) as out:  # reopening repairs the tail and appends cleanly
        out.append(_questions()[1])
    assert read_jsonl(path, Question) == _questions()


def test_parquet_round_trip_with_nested_fields(tmp_path):
    path = tmp_path / "t.parquet"
    trajs = [Trajectory(question_id="q", question="?", steps=[Step(index=0, action="search[x]",
                        tool_call=ToolCall(name="search", arguments={"query": "x"}, doc_ids=["d1"]))],
                        final_answer="y", docs_seen=["d1"])]
    write_parquet(path, trajs)
    assert read_parquet(path, Trajectory) == trajs


def test_parquet_bad_row_names_file_row_and_field(tmp_path):
    path = tmp_path / "q.parquet"
    rows = [q.model_dump(mode="json") for q in _questions()]
    rows[1]["answers"] = []
    write_parquet(path, rows)
    with pytest.raises(RecordError) as err:
        read_parquet(path, Question)
    assert str(err.value) == f"{path}:2: field 'answers': List should have at least 1 item after validation, not 0"


def test_file_that_is_not_parquet_is_a_record_error(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_text('{"not": "parquet"}\n')
    with pytest.raises(RecordError, match=r"t\.parquet: not a readable Parquet file \(") as err:
        read_parquet(path, Trajectory)
    assert err.value.line is None and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError):  # a missing input stays what it is
        read_parquet(tmp_path / "missing.parquet", Trajectory)


def test_line_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "d.jsonl"
    good = Document(id="a", title="A", text="x").model_dump_json().encode()
    path.write_bytes(good + b"\n" + b'{"id": "b", "title": "\xff"}\n')
    with pytest.raises(RecordError, match=r"d\.jsonl:2: not UTF-8 text \(byte 23\)"):
        read_jsonl(path, Document)
    path.write_bytes(good + b"\n" + '{"id": "b", "title": "é'.encode()[:-1])  # torn inside a character
    assert [d.id for d in read_jsonl(path, Document, skip_torn_tail=True)] == ["a"]


def test_atomic_target_gives_each_writer_its_own_temporary_and_removes_it_on_error(tmp_path):
    target = tmp_path / "model.gguf"
    with atomic_target(target) as first, atomic_target(target) as second:
        assert first != second and first.parent == second.parent == tmp_path
        first.write_text("first")
        second.write_text("second")
    assert target.read_text() == "first"  # the outer writer finished last
    with pytest.raises(RuntimeError), atomic_target(tmp_path / "other.gguf") as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


def _slow_build(out, log):
    with log.open("a") as fh:
        fh.write("built\n")
    time.sleep(0.5)
    out.write_text("done")


def _need_slow_build(start, target, log):
    start.wait()
    assert build_once(target, functools.partial(_slow_build, log=log)) == target and target.read_text() == "done"


def test_atomic_writes_get_the_permissions_of_a_plain_open(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    with atomic_path(tmp_path / "atomic.json") as fh:
        fh.write("{}")
    assert (tmp_path / "atomic.json").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_build_once_builds_a_file_several_processes_need_at_once_only_once(tmp_path):
    target, log = tmp_path / "cache" / "merged.gguf", tmp_path / "builds.log"
    assert run_side_by_side(_need_slow_build, target, log) == [0, 0, 0]
    assert log.read_text() == "built\n"
    with pytest.raises(FileNotFoundError, match="without writing it"):
        build_once(tmp_path / "never.gguf", lambda out: None)
