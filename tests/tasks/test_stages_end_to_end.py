"""prepare -> index -> evaluate on a tiny embedded world, with scripted policies standing in for the LLM:
an oracle that follows the world's gold chain must score EM 1.0; a policy that answers wrongly scores 0;
identical params give an identical metrics file; a crash mid-evaluation keeps finished episodes, and the re-run
samples each remaining question with the seed an uninterrupted run gives it."""

import json
import os
import re
from pathlib import Path

import pytest

from components.io import read_jsonl, write_jsonl
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.factory import LLMPool
from components.schemas import Question, Trajectory
from components.world.oracle import gold_search_queries
from tasks.evaluate import evaluate
from tests.agents.prompt_reading import depth_of, question_of


@pytest.fixture
def params(prepared_params):
    return prepared_params(
        "data.n_train=4",
        "data.n_dev=2", "data.n_test=8", "evaluation.n_questions=8", "evaluation.llm_judge=true",
    )


def oracle_policy(params):
    questions = {q.question: q for q in read_jsonl(f"{params.run.out_dir}/data/test.jsonl", Question)}

    def respond(messages, sampling):
        q = questions[question_of(messages)]
        searched = depth_of(messages)
        queries = gold_search_queries(q)
        if searched < min(len(queries), params.agent.max_search_calls):
            return f"Thought: look up the next entity.\nAction: search[{queries[searched]}]"
        return f"Thought: I have it.\nAction: finish[{q.answers[0]}]"

    return ScriptedChatModel(respond, name="oracle")


def judge_policy():
    def respond(messages, sampling):
        refs = re.search(r"Reference answers: (.*)\n", messages[1].content).group(1).split(" | ")
        pred = messages[1].content.rsplit("Predicted answer: ", 1)[1]
        return json.dumps({"correct": pred.strip().lower() in [r.lower() for r in refs]})

    return ScriptedChatModel(respond, name="judge")


def run_eval(params, policy):
    with LLMPool(params, overrides={"embedded-0_5b": policy, "embedded-1_5b": judge_policy()}) as pool:
        return evaluate.fn(params, pool=pool)


def test_oracle_policy_scores_perfectly_and_retrieves_gold(params):
    result = run_eval(params, oracle_policy(params))
    m = result.metrics
    assert m["n"] == 8 and m["em"] == 1.0 and m["f1"] == 1.0 and m["judge_accuracy"] == 1.0
    assert m["judge_failures"] == 0 and m["tool_calls_per_question"] >= 2
    assert m["gold_recall"] > 0.5  # title searches on BM25 return the hop paragraphs
    trajs = read_jsonl(result.trajectories, Trajectory)
    assert len(trajs) == 8 and all(t.finish_reason == "answer" for t in trajs)


def test_wrong_answers_score_zero_and_judge_failures_are_not_zeros(params):
    policy = ScriptedChatModel(lambda m, s: "Action: finish[Nobody In Particular]")
    broken_judge = ScriptedChatModel(lambda m, s: "I cannot tell.")
    with LLMPool(params, overrides={"embedded-0_5b": policy, "embedded-1_5b": broken_judge}) as pool:
        m = evaluate.fn(params, pool=pool).metrics
    assert m["em"] == 0.0 and m["answered_rate"] == 1.0
    assert m["judge_failures"] == 8 and m["judged"] == 0  # unreadable verdicts are not counted as wrong


def test_same_params_give_identical_metrics_file(params):
    run_eval(params, oracle_policy(params))
    path = f"{params.run.out_dir}/eval/react/metrics.json"
    first = Path(path).read_text()
    os.remove(f"{params.run.out_dir}/eval/react/trajectories.jsonl")  # force a full second run
    run_eval(params, oracle_policy(params))
    assert Path(path).read_text() == first


class SimulatedCrash(BaseException):
    """Like a kill: not an Exception, so nothing on the way catches it."""


def test_crash_keeps_finished_episodes_and_rerun_resumes(params):
    calls = {"n": 0}
    base = oracle_policy(params)

    def flaky(messages, sampling):
        calls["n"] += 1
        if calls["n"] > 24:
            raise SimulatedCrash()
        return base._responder(messages, sampling)

    with pytest.raises(SimulatedCrash):
        run_eval(params, ScriptedChatModel(flaky))
    traj_path = f"{params.run.out_dir}/eval/react/trajectories.jsonl"
    saved = read_jsonl(traj_path, Trajectory, skip_torn_tail=True)
    assert 1 <= len(saved) < 8
    resumed = oracle_policy(params)
    m = run_eval(params, resumed).metrics
    assert m["n"] == 8 and m["em"] == 1.0
    first_questions = {question_of(r[0]) for r in resumed.requests if depth_of(r[0]) == 0}
    assert len(first_questions) == 8 - len(saved)  # finished questions were not re-run


def first_call_seeds(policy) -> dict[str, int]:
    return {question_of(m): s.seed for m, s in policy.requests if depth_of(m) == 0}


def test_resumed_questions_keep_the_seed_of_their_position(prepared_params):
    params = prepared_params("data.n_train=4", "data.n_dev=2", "data.n_test=8", "evaluation.n_questions=8",
                             "evaluation.llm_judge=false", "llm.middleware.cache=false")  # every call reaches the policy
    whole = oracle_policy(params)
    run_eval(params, whole)
    uninterrupted = first_call_seeds(whole)
    assert len(set(uninterrupted.values())) == 8
    traj_path = f"{params.run.out_dir}/eval/react/trajectories.jsonl"
    write_jsonl(traj_path, read_jsonl(traj_path, Trajectory)[:3])  # as if the run had died after three questions
    resumed = oracle_policy(params)
    run_eval(params, resumed)
    seeds = first_call_seeds(resumed)
    assert len(seeds) == 5 and seeds == {q: uninterrupted[q] for q in seeds}


def test_an_evaluation_extended_to_more_questions_runs_only_the_new_ones(prepared_params):
    """20 -> 50 questions must not rerun the first 20: they are the same questions with the same seeds."""
    params = prepared_params("data.n_train=4", "data.n_dev=2", "data.n_test=8", "evaluation.n_questions=3",
                             "evaluation.llm_judge=false", "llm.middleware.cache=false")
    first = oracle_policy(params)
    run_eval(params, first)
    extended = params.model_copy(update={"evaluation": params.evaluation.model_copy(update={"n_questions": 8})})
    more = oracle_policy(extended)
    m = run_eval(extended, more).metrics
    assert m["n"] == 8 and m["em"] == 1.0
    assert set(first_call_seeds(more)).isdisjoint(first_call_seeds(first)) and len(first_call_seeds(more)) == 5
