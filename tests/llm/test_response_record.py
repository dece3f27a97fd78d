"""A stage's response record (components/llm/response_record.py): what `dvc repro` replays of a sampled stage."""

import asyncio
import json

import pytest

from components.io import RecordError
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import Completion, Sampling, user
from components.llm.factory import LLMPool
from components.llm.response_record import ResponseRecord
from components.params_load import load_params
from components.run_files import keep_record, record_path


@pytest.fixture
def params(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.out_dir = str(tmp_path / "out")
    return params


def ask(pool, text, sampling):
    return asyncio.run(pool.role("answer_judge").chat([user(text)], sampling))


def counting(reply):
    calls = []

    def answer(messages, sampling):
        calls.append(messages[-1].content)
        return f"{reply} to {messages[-1].content}"
    return ScriptedChatModel(answer, name="judge-model"), calls


def test_a_fresh_machine_replays_the_recorded_answers_and_leaves_the_record_unchanged(params, tmp_path):
    record = record_path(params.run, "evaluate@sft")
    assert record == tmp_path / "out" / "responses" / "evaluate" / "sft.jsonl"
    seeded, greedy = Sampling(temperature=0.7, seed=3), Sampling(temperature=0)

    params.run.cache_dir = str(tmp_path / "machine_a")
    first, first_calls = counting("first")
    with LLMPool(params, overrides={"embedded-1_5b": first}, record_path=record) as pool:
        assert ask(pool, "q1", seeded).text == "first to q1"
        assert ask(pool, "q2", greedy).text == "first to q2"
    assert first_calls == ["q1", "q2"]
    written = record.read_bytes()
    assert [json.loads(line)["completion"]["texts"] for line in written.splitlines()] == [["first to q1"], ["first to q2"]]

    # another machine: an empty response cache and a backend that would answer otherwise (batching, kernels)
    params.run.cache_dir = str(tmp_path / "machine_b")
    second, second_calls = counting("second")
    with LLMPool(params, overrides={"embedded-1_5b": second}, record_path=record) as pool:
        assert ask(pool, "q1", seeded).text == "first to q1"
        assert ask(pool, "q2", greedy).text == "first to q2"
        assert ask(pool, "q3", greedy).text == "second to q3"  # a request the run never made is asked
        assert pool.accounting.metrics()["llm.answer_judge.cache_hits"] == 2
    assert second_calls == ["q3"]
    assert record.read_bytes().startswith(written) and len(ResponseRecord(record)) == 3


def test_an_answer_from_the_machine_cache_is_copied_into_the_record(params, tmp_path):
    params.run.cache_dir = str(tmp_path / "machine")
    model, calls = counting("cached")
    with LLMPool(params, overrides={"embedded-1_5b": model}) as pool:  # no record: an earlier run, or another stage
        ask(pool, "q", Sampling(temperature=0))
    record = record_path(params.run, "collect")
    with LLMPool(params, overrides={"embedded-1_5b": model}, record_path=record) as pool:
        assert ask(pool, "q", Sampling(temperature=0)).cached
    assert calls == ["q"]
    assert ResponseRecord(record).get(next(iter(json.loads(line)["key"] for line in record.read_text().splitlines())))


def test_a_sampled_call_without_a_seed_is_never_recorded(params, tmp_path):
    params.run.cache_dir = str(tmp_path / "machine")
    model, calls = counting("free")
    record = record_path(params.run, "collect")
    with LLMPool(params, overrides={"embedded-1_5b": model}, record_path=record) as pool:
        ask(pool, "q", Sampling(temperature=1.0))
        ask(pool, "q", Sampling(temperature=1.0))
    assert calls == ["q", "q"] and not record.exists()


def test_a_finished_stage_keeps_its_record_and_a_failed_one_leaves_none(params, tmp_path):
    params.run.cache_dir = str(tmp_path / "machine")
    with LLMPool(params, overrides={"embedded-1_5b": counting("x")[0]}, record_path=record_path(params.run, "collect")):
        pass  # a stage that fails before any reply
    assert not (tmp_path / "out" / "responses").exists()
    kept = keep_record(params.run, "train_policy@grpo")  # a stage that made no deterministic call, then finished
    assert kept.read_text() == ""
    record = record_path(params.run, "collect")
    ResponseRecord(record).put("k", Completion(texts=["t"], model="m"))
    before = (record.read_bytes(), record.stat().st_mtime_ns)
    keep_record(params.run, "collect")
    assert (record.read_bytes(), record.stat().st_mtime_ns) == before


def test_a_torn_last_line_is_cut_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "r.jsonl"
    good = json.dumps({"key": "a", "completion": {"texts": ["x"], "model": "m"}})
    path.write_text(good + "\n" + '{"key": "b", "compl')
    record = ResponseRecord(path)
    assert record.get("a").texts == ["x"] and record.get("b") is None
    assert path.read_text() == good + "\n"  # the next append starts its own line
    path.write_text(good + "\n" + json.dumps({"key": "b", "completion": "not an object"}) + "\n")
    with pytest.raises(RecordError, match=r"r\.jsonl:2: field 'completion'"):
        ResponseRecord(path).get("a")


def test_the_ranks_of_one_run_append_to_one_record_each_request_once(tmp_path):
    """Two records open on one file (two data-parallel ranks, each loaded before the other wrote): a request
    one recorded is not written again by the other (it found the answer in the shared cache), and a fresh load
    reads both ranks' answers."""
    path = tmp_path / "record.jsonl"
    path.write_text("")
    rank0, rank1 = ResponseRecord(path), ResponseRecord(path)
    assert rank0.get("aa") is None and rank1.get("aa") is None  # both loaded the empty file
    one, two = (Completion(texts=[t], model="m") for t in ("one", "two"))
    rank0.put("aa", one)
    rank1.put("aa", one)  # rank 1's cache hit on rank 0's answer
    rank1.put("bb", two)
    rank0.put("bb", two)
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["aa", "bb"]
    fresh = ResponseRecord(path)
    assert fresh.get("aa") == one and fresh.get("bb") == two


def _open_cache(path, barrier, results):
    from components.llm.middleware import ResponseCache

    barrier.wait()  # both processes switch the new file to WAL at once
    try:
        ResponseCache(path).close()
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        results.put(repr(exc))


def test_two_processes_open_one_new_response_cache_at_once(tmp_path):
    """The ranks of a data-parallel run open the machine's cache together: before the retry, about a third of such
    races failed one rank with 'database is locked' (switching a new file to WAL does not wait for the lock)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for i in range(8):
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_open_cache, args=(tmp_path / f"cache{i}.sqlite", barrier, results))
                 for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [results.get(timeout=5) for _ in procs] == ["ok", "ok"]
