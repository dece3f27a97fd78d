"""The collect stage on a tiny world with scripted candidate policies and judges: sharding, a crash and
resume, the merged dataset, and questions run concurrently without their order of completion showing."""

import asyncio
import json
import re
import shutil
import time

import pytest

from components.io import read_json, read_jsonl, read_parquet
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import ChatModel
from components.llm.factory import LLMPool
from components.methods.coreact.council import SYSTEM_PROMPT as JUDGE_SYSTEM
from components.schemas import BranchingPoint, Question
from components.world.oracle import gold_search_queries
from tasks.collect import DoneRecord, collect, shard_dir
from tests.agents.prompt_reading import depth_of, question_of


class SimulatedCrash(BaseException):
    pass


@pytest.fixture
def params(prepared_params):
    return prepared_params(
        "data.n_train=4",
        "data.n_dev=1", "data.n_test=1", "collect.n_questions=4", "collect.max_depth=3",
        "collect.samples_per_temperature=3", "llm.middleware.cache=false",
        "collect.judge_orders=1",   # one call per judge and slate: the crash and shard counts below are in calls
    )


def scripted_world(params, crash_after=None, gold_first=True):
    questions = {q.question: q for q in read_jsonl(f"{params.run.out_dir}/data/train.jsonl", Question)}
    calls = {"n": 0}

    def respond(messages, sampling):
        calls["n"] += 1
        if crash_after is not None and calls["n"] > crash_after:
            raise SimulatedCrash()
        if messages[0].content == JUDGE_SYSTEM:  # a judge: prefer gold queries, then display order
            shown = dict(re.findall(r"^\[([A-Z])\] (.+)$", messages[1].content, flags=re.MULTILINE))
            q = next(q for text, q in questions.items() if text in messages[1].content)
            gold = set(gold_search_queries(q))
            order = sorted(shown, key=lambda lab: ((re.sub(r"^search\[(.*)\]$", r"\1", shown[lab]) in gold)
                                                   is not gold_first, list(shown).index(lab)))
            return json.dumps({"rationale": "gold first", "ranking": order})
        q = questions[question_of(messages)]
        depth = depth_of(messages)
        queries = gold_search_queries(q)
        options = [f"search[{queries[min(depth, len(queries) - 1)]}]", f"search[{q.question[:20]}]",
                   f"search[{queries[0]} history]", f"search[list of {depth}]", "browse[nothing]"]
        return f"Thought: t\nAction: {options[(sampling.seed or 0) % len(options)]}"

    return ScriptedChatModel(respond)


def run(params, model, shard=0, num_shards=1, relabel=False):
    with LLMPool(params, overrides={"embedded-0_5b": model, "embedded-1_5b": model}) as pool:
        return collect.fn(params, shard=shard, num_shards=num_shards, pool=pool, relabel=relabel)


def test_two_shards_resume_and_merge(params):
    first = run(params, scripted_world(params), shard=0, num_shards=2)
    assert not first.complete and first.dataset is None  # shard 1 has not run yet
    with pytest.raises(SimulatedCrash):
        run(params, scripted_world(params, crash_after=40), shard=1, num_shards=2)
    folder = shard_dir(params, 1, 2)
    crashed_done = read_jsonl(folder / "done.jsonl", DoneRecord, skip_torn_tail=True)
    result = run(params, scripted_world(params), shard=1, num_shards=2)
    assert result.complete
    kept = read_parquet(result.dataset, BranchingPoint)
    assert kept and all(p.kept and len(p.slate) == 4 and len(p.votes) == 2 for p in kept)
    assert len({p.question_id for p in kept}) == 4
    # no question appears twice at the same depth: the crash left no duplicated partial points
    keys = [(p.question_id, p.depth) for p in kept]
    assert len(keys) == len(set(keys))
    metrics = read_json(f"{params.run.out_dir}/collect/metrics.json")
    assert metrics["questions"] == 4 and metrics["judge_validity.council_judges[0]"] == 1.0
    assert metrics["kept"] == len(kept) and 0 < metrics["slate_diversity"] <= 1
    done = read_jsonl(folder / "done.jsonl", DoneRecord)
    assert sorted(r.question_id for r in done) == sorted({r.question_id for r in done})  # none redone
    assert len(done) == 2 and len(crashed_done) < 2
    # the judges prefer gold queries: whenever one is on the slate, it is what gets committed
    questions = {q.id: q for q in read_jsonl(f"{params.run.out_dir}/data/train.jsonl", Question)}
    checked = 0
    for p in kept:
        gold = {f"search[{g}]" for g in gold_search_queries(questions[p.question_id])}
        if any(p.candidates[i].action in gold for i in p.slate):
            assert p.candidates[p.committed].action in gold
            checked += 1
    assert checked >= 2


class Paced(ChatModel):
    """The scripted world answering question i's calls after ``delays[i]`` seconds, recording when each
    question's first call started and its last call ended."""

    def __init__(self, inner, questions, delays):
        self.inner, self.name, self.questions, self.delays = inner, inner.name, questions, delays
        self.spans: dict[int, list[float]] = {}

    async def _complete(self, messages, sampling):
        i = next(i for i, text in enumerate(self.questions) if any(text in m.content for m in messages))
        loop = asyncio.get_running_loop()
        self.spans.setdefault(i, [loop.time(), 0.0])
        await asyncio.sleep(self.delays[i])
        self.spans[i][1] = loop.time()
        return await self.inner._complete(messages, sampling)

    def most_questions_at_once(self) -> int:
        return max(sum(1 for s, e in self.spans.values() if s <= start < e) for start, _ in self.spans.values())


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "latency_s"}
    return [without_timings(v) for v in value] if isinstance(value, list) else value


def test_questions_run_concurrently_and_the_result_ignores_completion_order(params):
    questions = read_jsonl(f"{params.run.out_dir}/data/train.jsonl", Question)
    for backend in ("embedded-0_5b", "embedded-1_5b"):  # no call ever queues: each question keeps its own pace
        params.llm.backends[backend].max_concurrency = 8
    outputs, finish_orders = [], []
    for delays in ([0.001, 0.02, 0.001, 0.02], [0.02, 0.001, 0.02, 0.001]):
        shutil.rmtree(f"{params.run.out_dir}/collect", ignore_errors=True)
        model = Paced(scripted_world(params), [q.question for q in questions], delays)
        result = run(params, model)
        assert model.most_questions_at_once() == 4
        done = [r.question_id for r in read_jsonl(shard_dir(params, 0, 1) / "done.jsonl", DoneRecord)]
        assert sorted(done) == sorted(q.id for q in questions)
        finish_orders.append(done)
        points = [without_timings(p.model_dump()) for p in read_parquet(result.dataset, BranchingPoint)]
        outputs.append((points, read_json(f"{params.run.out_dir}/collect/metrics.json")))
    assert finish_orders[0] != finish_orders[1]
    assert outputs[0][0] and outputs[0] == outputs[1]


def test_relabel_ranks_the_same_slates_again_and_resumes_after_a_crash(params):
    run(params, scripted_world(params))
    folder = shard_dir(params, 0, 1)
    collected = [without_timings(p.model_dump()) for p in read_jsonl(folder / "points.jsonl", BranchingPoint)]
    # the same council with the seeds collect used: every vote comes out the same
    run(params, scripted_world(params), relabel=True)
    assert [without_timings(p.model_dump()) for p in read_jsonl(folder / "points.jsonl", BranchingPoint)] == collected
    # a council that puts gold queries last; it crashes after three calls, and a re-run finishes the rest
    with pytest.raises(SimulatedCrash):
        run(params, scripted_world(params, crash_after=3, gold_first=False), relabel=True)
    assert 0 < len(read_jsonl(folder / "relabelled.jsonl", BranchingPoint, skip_torn_tail=True)) < len(collected)
    result = run(params, scripted_world(params, gold_first=False), relabel=True)
    assert not (folder / "relabelled.jsonl").exists()
    assert [without_timings(p.model_dump()) for p in read_jsonl(folder / "points.before_relabel.jsonl",
                                                                 BranchingPoint)] == collected
    after = read_jsonl(folder / "points.jsonl", BranchingPoint)
    questions = {q.id: q for q in read_jsonl(f"{params.run.out_dir}/data/train.jsonl", Question)}
    assert len(after) == len(collected)
    flipped = 0
    for old, new in zip(collected, after, strict=True):
        assert (new.question_id, new.depth, new.committed, new.slate) == (old["question_id"], old["depth"],
                                                                            old["committed"], old["slate"])
        assert [c.action for c in new.candidates] == [c["action"] for c in old["candidates"]]
        assert [s.action for s in new.prefix] == [s["action"] for s in old["prefix"]]
        gold = {f"search[{g}]" for g in gold_search_queries(questions[new.question_id])}
        slate = [new.candidates[i].action for i in new.slate]
        if new.consensus and any(a in gold for a in slate) and not all(a in gold for a in slate):
            assert slate[new.consensus[0]] not in gold
            flipped += 1
    assert flipped >= 2
    by_key = lambda p: (p.question_id, p.depth)
    assert read_parquet(result.dataset, BranchingPoint) == sorted((p for p in after if p.kept), key=by_key)


def test_the_stage_s_wall_time_is_elapsed_time_not_the_sum_over_concurrent_questions(params):
    questions = read_jsonl(f"{params.run.out_dir}/data/train.jsonl", Question)
    for backend in ("embedded-0_5b", "embedded-1_5b"):
        params.llm.backends[backend].max_concurrency = 8
    model = Paced(scripted_world(params), [q.question for q in questions], [0.02] * 4)
    started = time.perf_counter()
    run(params, model)
    elapsed = time.perf_counter() - started
    assert model.most_questions_at_once() == 4
    timings = read_json(f"{params.run.out_dir}/collect/timings.json")
    assert 0 < timings["wall_s"] <= elapsed
    assert timings["question_s"] > 2 * timings["wall_s"]  # four questions at once: their times overlap
    assert timings["s_per_point"] > 0
