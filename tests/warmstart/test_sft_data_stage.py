"""The sft_data stage with a scripted teacher: oracle episodes from other-seed worlds, teacher episodes
rejection-sampled with every rejection recorded, on the world (corpus scope) and on HotpotQA's train split
(question scope)."""

import json
from pathlib import Path

from components.evaluation.metrics import normalize_answer
from components.io import read_json, read_jsonl
from components.methods.rubricem.reflection import INSTRUCTIONS
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.factory import LLMPool
from components.retrieval import load_index, make_toolbox
from components.schemas import Document, Question, Trajectory
from components.methods.rubricem.warmstart_reflections import ReflectionRejection, ReflectionRow
from components.warmstart import Rejection, plan_turns
from tasks.sft_data import sft_data
from tests.agents.prompt_reading import depth_of, question_of


def run(params, model):
    with LLMPool(params, overrides={"embedded-1_5b": model}) as pool:
        return sft_data.fn(params, pool=pool)


def training_world_questions(params, stage: str = "sft_data"):
    """A function giving {question text: (question, toolbox)} over the training worlds the stage built
    (read once, on first use: the worlds are written by the stage the teacher is called from)."""
    cache = {}

    def questions():
        if not cache:
            for folder in sorted(Path(params.run.out_dir, stage, "worlds").iterdir()):
                docs = read_jsonl(folder / "corpus.jsonl", Document)
                tools = make_toolbox(load_index(folder / "index", docs), docs)
                for q in read_jsonl(folder / "questions.jsonl", Question):
                    cache[q.question] = (q, tools)
        return cache

    return questions


def world_teacher(params):
    """Greedy sample: the oracle's own turns (kept); sampled ones: a blind guess (wrong answer)."""
    questions = training_world_questions(params)

    def respond(messages, sampling):
        if sampling.temperature > 0:
            return "Thought: I will guess.\nAction: finish[Nowhere]"
        q, tools = questions()[question_of(messages)]
        return plan_turns(q, tools, params.agent)[depth_of(messages)].raw

    return ScriptedChatModel(respond)


def test_world_oracle_and_teacher(prepared_params):
    params = prepared_params("data.n_train=2", "data.n_dev=1", "data.n_test=4", "sft.n_worlds=2", "sft.n_oracle=12",
                             "sft.n_teacher_questions=3", "sft.samples_per_question=2", "llm.middleware.cache=false")
    result = run(params, world_teacher(params))
    out = Path(params.run.out_dir, "sft_data")
    kept = read_jsonl(out / "trajectories.jsonl", Trajectory)
    rejected = read_jsonl(out / "rejections.jsonl", Rejection)
    m = read_json(out / "metrics.json")
    assert m["kept.oracle"] == 12 and m["kept.teacher"] == 3 and m["teacher.episodes"] == 6
    assert m["rejected"] == 3 and m["rejected.wrong_answer"] == 3 and m["oracle.failed"] == 0
    assert sum(v for k, v in m.items() if k.startswith("rejected.")) == m["rejected"] == len(rejected)
    assert result.metrics == m and m["teacher.accept_rate"] == 0.5
    assert [t.metadata["source"] for t in kept] == ["oracle"] * 12 + ["teacher"] * 3
    assert all(r.reason == "wrong_answer" and r.source == "teacher" and r.sample == 1 for r in rejected)
    # training questions come from the worlds seeded seed+1, seed+2 (6 oracle questions each), never the
    # evaluation world, and none names an entity of the evaluation corpus
    seeds = [t.metadata["world_seed"] for t in kept]
    assert sorted(set(seeds)) == [params.seed + 1, params.seed + 2] and seeds.count(params.seed + 1) == 6 + 2
    eval_titles = {d.title for d in read_jsonl(Path(params.run.out_dir, "data", "corpus.jsonl"), Document)}
    worlds = {q.id: q for f in (out / "worlds").iterdir() for q in read_jsonl(f / "questions.jsonl", Question)}
    for t in kept:
        q = worlds[t.question_id]
        assert t.question_id.startswith(f"s{t.metadata['world_seed']}-") and q.question == t.question
        assert not ({*q.answers, *q.metadata["hop_titles"]} & eval_titles)
        assert t.steps[-1].final_answer == t.final_answer and t.metadata["answers"] == q.answers
    teacher_ids = {t.question_id for t in kept if t.metadata["source"] == "teacher"}
    assert len(teacher_ids) == 3 and not teacher_ids & {t.question_id for t in kept[:12]}
    # the same params give the same files
    first = (out / "trajectories.jsonl").read_text(), (out / "metrics.json").read_text()
    run(params, world_teacher(params))
    again = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    strip = lambda rows: [{**r, "wall_s": 0, "steps": [{**s, "latency_s": 0} for s in r["steps"]]} for r in rows]
    assert strip(again) == strip([json.loads(line) for line in first[0].splitlines()])
    assert (out / "metrics.json").read_text() == first[1]


def hotpot_teacher(params):
    """Greedy: search a supporting title, browse it, answer the gold answer; sampled: the same search twice."""
    train = {q.question: q for q in read_jsonl(Path(params.run.out_dir, "data", "train.jsonl"), Question)}
    docs = {d.id: d for d in read_jsonl(Path(params.run.out_dir, "data", "corpus.jsonl"), Document)}

    def respond(messages, sampling):
        q, depth = train[question_of(messages)], depth_of(messages)
        doc = docs[q.supporting_doc_ids[-1]]
        if sampling.temperature > 0:
            turns = [f"search[{doc.title}]", f"search[{doc.title}]", f"finish[{q.answers[0]}]"]
        else:
            turns = [f"search[{doc.title}]", f"browse[{doc.id}]", f"finish[{q.answers[0]}]"]
        return f"Thought: step {depth}.\nAction: {turns[depth]}"

    return ScriptedChatModel(respond)


def test_benchmark_train_split_in_question_scope(prepared_params, benchmarks_dir):
    params = prepared_params("data.source=hotpotqa", f"data.benchmarks_dir={benchmarks_dir}", "data.n_train=4",
                             "data.n_dev=1", "data.n_test=1", "retrieval.scope=question", "sft.n_worlds=1",
                             "sft.n_oracle=3", "sft.n_teacher_questions=4", "sft.samples_per_question=2",
                             "llm.middleware.cache=false")
    run(params, hotpot_teacher(params))
    out = Path(params.run.out_dir, "sft_data")
    kept = read_jsonl(out / "trajectories.jsonl", Trajectory)
    rejected = read_jsonl(out / "rejections.jsonl", Rejection)
    m = read_json(out / "metrics.json")
    train = {q.id: q for q in read_jsonl(Path(params.run.out_dir, "data", "train.jsonl"), Question)}
    teacher = [t for t in kept if t.metadata["source"] == "teacher"] + [r.trajectory for r in rejected]
    assert m["kept.oracle"] == 3 and m["teacher.episodes"] == len(teacher) == 8
    assert {t.question_id for t in teacher} == set(train)          # the train split only
    for t in teacher:                                                # each saw only its own paragraphs
        assert t.docs_seen and set(t.docs_seen) <= set(train[t.question_id].metadata["paragraph_ids"])
    assert m["rejected.repeated_call"] == 4 and all(r.sample == 1 for r in rejected if r.reason == "repeated_call")
    # a greedy episode is kept exactly when the browsed paragraph states the answer (or it is yes/no)
    expected = 0
    for t in teacher:
        if t.steps[1].action.startswith("browse["):
            answer = normalize_answer(train[t.question_id].answers[0])
            expected += answer in ("yes", "no") or f" {answer} " in f" {normalize_answer(t.steps[1].observation)} "
    assert m["kept.teacher"] == expected and m["rejected"] == 8 - expected
    assert {r.reason for r in rejected} <= {"repeated_call", "ungrounded"}


REFLECTION = ("<reflection_rubrics>\nCritical requirements: both hops.\nApproach: one search per hop.\n"
              "Pitfalls: none seen.\n</reflection_rubrics>\n<reflection_takeaways>\n1. Search each hop by name.\n"
              "</reflection_takeaways>")
DRAFT = ('{"critical_requirements": "both hops.", "approach": "one search per hop.", "pitfalls": "none seen.", '
         '"takeaways": ["Search each hop by name."]}')  # the teacher's structured reply, rendered as REFLECTION


def scaffold_teacher(params):
    """The scaffold format. Greedy: the oracle's turns rewritten in the scaffold (kept); sampled: the same
    episode with the review dropped from its last reply (rejected for its stage boundary)."""
    from components.methods.rubricem.scaffold_oracle import scaffold_replies

    questions = training_world_questions(params, "sft_data_scaffold")

    def replies(messages):
        text = next(m.content for m in messages if m.role == "user")
        q, tools = next(v for k, v in questions().items() if f"Question: {k}" in text)
        return scaffold_replies(q, plan_turns(q, tools, params.agent)), text.count("<tool_output>")

    def respond(messages, sampling):
        if messages[0].content == INSTRUCTIONS:  # a reflection: greedy is not a draft, sampled is valid
            return DRAFT if sampling.temperature > 0 else "<reflection_rubrics>\nHop one.</think>\n<plan>"
        turns, depth = replies(messages)
        reply = turns[depth]
        if sampling.temperature > 0 and depth == len(turns) - 1:
            reply = reply[: reply.index("<review>")] + reply[reply.index("<answer>"):]
        return reply

    return ScriptedChatModel(respond)


def test_scaffold_warm_start_data(prepared_params):
    from components.judges.render import scaffold_text
    from components.methods.rubricem.scaffold_format import split_stages

    params = prepared_params("data.n_train=2", "data.n_dev=1", "data.n_test=4", "sft.n_worlds=1", "sft.n_oracle=4",
                             "sft.n_teacher_questions=2", "sft.samples_per_question=2", "llm.middleware.cache=false")
    with LLMPool(params, overrides={"embedded-1_5b": scaffold_teacher(params)}) as pool:
        result = sft_data.fn(params, pool=pool, method="sft_scaffold")
    out = Path(params.run.out_dir, "sft_data_scaffold")
    assert result.trajectories == str(out / "trajectories.jsonl")
    kept = read_jsonl(out / "trajectories.jsonl", Trajectory)
    rejected = read_jsonl(out / "rejections.jsonl", Rejection)
    m = read_json(out / "metrics.json")
    assert m["kept.oracle"] == 4 and m["kept.teacher"] == 2 and m["teacher.episodes"] == 4
    assert m["rejected"] == 2 == m["rejected.stage_boundary"] and m["rejected.format"] == 0
    assert all(r.reason == "stage_boundary" and r.sample == 1 and "review" in r.detail for r in rejected)
    for t in kept:  # every kept episode is in the scaffold, all four stages present
        assert split_stages(scaffold_text(t)).present() == [True] * 4
        assert t.steps[0].raw.startswith("<think>") and "<structured_plan>" in t.steps[0].raw
    assert not Path(params.run.out_dir, "sft_data", "trajectories.jsonl").exists()  # the ReAct data untouched
    # reflections (params.yaml asks for more than the 8 episodes there are): one per episode, kept or not,
    # each after its greedy sample was rejected for breaking the format
    reflections = read_jsonl(out / "reflections.jsonl", ReflectionRow)
    refused = read_jsonl(out / "reflection_rejections.jsonl", ReflectionRejection)
    assert params.sft.reflection_rows["sft_scaffold"] > 8
    assert m["reflections.kept"] == len(reflections) == 8 and m["reflections.rejected.format"] == len(refused) == 8
    assert m["reflections.rejected.names_answer"] == m["reflections.rejected.call_failed"] == 0
    assert all(r.reflection == REFLECTION for r in reflections) and all(r.sample == 0 for r in refused)
    assert sorted(r.source for r in reflections) == ["oracle"] * 4 + ["teacher"] * 4
    # the two rejected episodes dropped their review, not the right answer
    assert m["reflections.kept_on_failed_attempts"] == sum(not r.attempt_correct for r in reflections) == 0
    attempts = {scaffold_text(t) for t in kept} | {scaffold_text(r.trajectory) for r in rejected}
    assert {r.attempt for r in reflections} == attempts
