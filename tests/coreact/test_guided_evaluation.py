"""Evaluation extras: utilisation, verification failure (retry) rate and cost per role by hand, and
`evaluate --method coreact` end to end on a tiny world with scripted policy, generator, verifier and judge."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from components.methods.coreact.guided_metrics import (
    accounting_per_question,
    behaviour_table,
    cost_per_question,
    guided_metrics,
    verification_stats,
)
from components.io import read_jsonl
from components.judges.answer import JUDGE_SYSTEM
from components.methods.coreact.rubric_eval import CRITERION_PROMPT
from components.methods.coreact.verifier import SYSTEM_PROMPT as VERIFIER_SYSTEM
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.factory import LLMPool
from components.params_load import load_params
from components.schemas import Question, Step, Trajectory
from components.world.oracle import gold_search_queries
from tasks.evaluate import evaluate
from tasks.index import index
from tasks.prepare import prepare
from tests.agents.prompt_reading import depth_of, question_of
from tests.coreact.scripted_agents import RUBRIC


def traj(records, cost=None, extra=0, budget=False):
    meta = {"guided": {"steps": records, "cost": cost or {}, "extra_tool_calls": extra, "token_budget_hit": budget}}
    return Trajectory(question_id="q", question="?", steps=[Step(index=0)], metadata=meta)


def test_verification_rate_cost_and_utilisation_by_hand():
    accepted = {"accepted": True, "fraction": 1.0}
    rejected = {"accepted": False, "fraction": 0.2}
    failed = {"accepted": None, "error": "verifier call failed"}
    trajs = [
        traj([{"rubric": [1], "drafts": [rejected], "retries": 1}, {"rubric": [1], "drafts": [accepted], "retries": 0},
              {"rubric": None, "rubric_error": "bad"}],
             cost={"policy": {"calls": 4, "failures": 0, "prompt_tokens": 100, "completion_tokens": 20},
                   "verifier": {"calls": 2, "failures": 1, "prompt_tokens": 50, "completion_tokens": 10}}, budget=True),
        traj([{"rubric": [1], "drafts": [failed], "retries": 0}, {"rubric": [1], "drafts": [accepted], "retries": 0}],
             cost={"policy": {"calls": 2, "failures": 0, "prompt_tokens": 40, "completion_tokens": 10}}, extra=2),
        Trajectory(question_id="r", question="?", steps=[Step(index=0), Step(index=1)], prompt_tokens=30,
                   completion_tokens=6, metadata={"policy_calls": [{"kind": "turn", "trainable": True}] * 2}),
    ]
    v = verification_stats(trajs)
    assert v["guided_steps"] == 5 and v["rubric_steps"] == 4 and v["rubric_failures"] == 1
    assert v["verified_steps"] == 3 and v["verification_failures"] == 1 and v["verifier_failures"] == 1
    assert v["verification_failure_rate"] == pytest.approx(1 / 3) and v["retry_rate"] == pytest.approx(1 / 5)
    assert v["token_budget_hits"] == 1
    c = cost_per_question(trajs)
    assert c["cost.policy.calls"] == pytest.approx((4 + 2 + 2) / 3)
    assert c["cost.policy.prompt_tokens"] == pytest.approx((100 + 40 + 30) / 3)
    assert c["cost.verifier.calls"] == pytest.approx(2 / 3) and c["cost.verifier.failures"] == pytest.approx(1 / 3)
    assert c["cost.calls"] == pytest.approx(10 / 3) and c["cost.tokens"] == pytest.approx((120 + 60 + 50 + 36) / 3)
    table = pd.DataFrame({"tool_calls": [2, 3, 1], "unique_docs_retrieved": [6, 9, 0], "unique_docs_cited": [3, 3, 0]})
    m = guided_metrics(table, trajs)
    assert m["utilisation"] == pytest.approx(2 / 5) and m["tool_calls_total_per_question"] == pytest.approx(2 + 2 / 3)
    assert accounting_per_question({"llm.verifier.calls": 6.0, "llm.verifier.latency_s": 3.0}, 3) == \
        {"llm.verifier.calls_per_question": 2.0}
    assert behaviour_table({"coreact": m}).loc["coreact", "utilisation"] == pytest.approx(0.4)


@pytest.fixture
def params(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    p = load_params(Path(repo_root) / "params.yaml", overrides=[
        f"run.out_dir={tmp_path / 'out'}", f"run.cache_dir={tmp_path / 'cache'}", "data.n_train=2", "data.n_dev=1",
        "data.n_test=3", "evaluation.n_questions=3", "llm.middleware.cache=false"])
    prepare.fn(p)
    index.fn(p)
    return p


@pytest.mark.parametrize("verifier_mode", ["checklist", "criterion"])
def test_evaluate_coreact_end_to_end(params, verifier_mode):
    params = params.model_copy(update={"coreact": params.coreact.model_copy(update={"verifier_mode": verifier_mode})})
    questions = {q.question: q for q in read_jsonl(f"{params.run.out_dir}/data/test.jsonl", Question)}

    def policy(messages, sampling):
        q = questions[question_of(messages)]
        queries = gold_search_queries(q)
        done = depth_of(messages)
        if done < min(len(queries), params.agent.max_search_calls):
            return f"Thought: next entity.\nAction: search[{queries[done]}]"
        return f"Thought: I have it.\nAction: finish[{q.answers[0]}]"

    def judges(messages, sampling):
        first = "(nothing yet" in messages[1].content  # the verifier rejects every first step, accepts the rest
        if messages[0].content == VERIFIER_SYSTEM:
            return json.dumps({"verdicts": [{"satisfied": not first, "reason": "r"}] * 2})
        if messages[0].content == CRITERION_PROMPT:
            return "no" if first else "yes"
        assert messages[0].content == JUDGE_SYSTEM
        refs = re.search(r"Reference answers: (.*)\n", messages[1].content).group(1).split(" | ")
        return json.dumps({"correct": messages[1].content.rsplit("Predicted answer: ", 1)[1] in refs})

    overrides = {"embedded-0_5b": ScriptedChatModel(policy), "embedded-1_5b": ScriptedChatModel(judges),
                 "embedded-0_5b-rubric": ScriptedChatModel(lambda m, s: json.dumps(RUBRIC))}
    with LLMPool(params, overrides=overrides) as pool:
        result = evaluate.fn(params, method="coreact", pool=pool)
    m = result.metrics
    trajs = read_jsonl(result.trajectories, Trajectory)
    tool_steps = sum(t.n_tool_calls for t in trajs)
    assert m["n"] == 3 and m["em"] == 1.0 and m["judge_accuracy"] == 1.0
    assert m["verified_steps"] == tool_steps and m["verification_failures"] == 3
    assert m["verification_failure_rate"] == pytest.approx(3 / tool_steps)
    calls_per_check = len(RUBRIC["criteria"]) if verifier_mode == "criterion" else 1
    assert m["cost.verifier.calls"] == pytest.approx(tool_steps * calls_per_check / 3)
    assert m["cost.rubric_generator.calls"] == pytest.approx(tool_steps / 3 + 1)  # the answering turn gets one too
    assert m["cost.policy.calls"] == pytest.approx((tool_steps + 3 + 3) / 3)  # turns + one retry + the answer
    assert all(t.steps[0].rubric and t.metadata["policy_calls"][0]["trainable"] is False for t in trajs)
