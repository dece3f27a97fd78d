"""`--overlay lab` is one switch: every role is bound to the nano policy or the simulated judge, and an existing
stage runs in the lab unchanged. The few-step form: prepare -> index -> evaluate@sft of a tiny nano policy (two SFT
steps, saved where the overlay's backends read it), with the simulated answer judge grading through the stage's own
judge call."""

from __future__ import annotations

import asyncio

from components.lab.policy import sft_corpus, train_nano
from components.lab.world import LAB_PROMPT
from components.params_load import load_params

TINY = ["data.n_train=4", "data.n_dev=1", "data.n_test=2", "evaluation.n_questions=2", "evaluation.llm_judge=true",
        "lab.sft_worlds=1", "lab.sft_questions_per_world=8", "lab.nano.vocab_size=400", "lab.nano.hidden_size=32",
        "lab.nano.num_layers=1", "lab.nano.num_heads=2", "lab.nano.num_kv_heads=1", "lab.nano.intermediate_size=64",
        "sft.max_steps=2", "sft.batch_size=2", "agent.max_tokens=8", "agent.max_turns=3"]


def _bound(params) -> set[str]:
    return {b for v in params.llm.roles.values() for b in ([v] if isinstance(v, str) else v)} | {
        b for m in params.methods.values() for b in m.roles.values()}


def test_every_role_is_the_nano_policy_or_the_simulated_judge(repo_root):
    params = load_params(repo_root / "params.yaml", overlays=["lab"])
    kinds = {(params.llm.backends[b].type, params.llm.backends[b].model) for b in _bound(params)}
    assert kinds == {("hf", "outputs/lab/sft"), ("simulated", "lab-judge")}
    assert all(params.llm.backends[b].embedded is None for b in _bound(params))
    assert params.methods["sft"].options["system_prompt"] == LAB_PROMPT  # the prompt the nano policy learned under
    for method in ("coreact", "coreact_no_verify", "best_of_n", "best_of_n_rubric", "self_refine_rubric"):
        assert params.methods[method].options["system_prompt"] == LAB_PROMPT, method
    # Co-ReAct's trained generators are the simulated one (the nano cannot write a rubric); the nano stays the policy
    for role in ("rubric_generator_trained", "rubric_generator_pairwise"):
        assert params.llm.backends[params.llm.roles[role]].type == "simulated", role
    assert params.methods["coreact"].options["generator_role"] == "rubric_generator_trained"
    assert params.lab.judge.flip_rate == 0.0 and params.run.out_dir == "outputs/lab"
    default = load_params(repo_root / "params.yaml")
    assert "simulated" not in {b.type for b in default.llm.backends.values()}  # never a default outside the lab


def test_an_existing_stage_runs_in_the_lab(repo_root, tmp_path, monkeypatch):
    from components.io import read_jsonl
    from components.judges.answer import judge_answer
    from components.judges.call import Tally
    from components.llm.factory import LLMPool
    from components.schemas import Question
    from tasks.evaluate import evaluate
    from tasks.index import index
    from tasks.prepare import prepare

    monkeypatch.chdir(tmp_path)  # the overlay's backends read outputs/lab/sft under the working directory
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    params = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=TINY)
    train_nano(params, sft_corpus(params), seed=0).save(tmp_path / "outputs/lab/sft")
    prepare.fn(params)
    index.fn(params)
    with LLMPool(params) as pool:
        judge = pool.role("answer_judge")
        result = evaluate.fn(params, method="sft", pool=pool)
        assert type(pool.backend("embedded-0_5b-sft")).__name__ == "HFChatModel"
        q = read_jsonl(tmp_path / "outputs/lab/data/test.jsonl", Question)[0]
        tally = Tally()
        assert asyncio.run(judge_answer(judge, q, f"it is {q.answers[0]} indeed", tally)) is True
        assert asyncio.run(judge_answer(judge, q, "nobody at all", tally)) is False
        assert tally.failed == 0 and tally.calls >= 2
    assert result.metrics["n"] == 2 and 0.0 <= result.metrics["em"] <= 1.0
    assert result.metrics["judge_failures"] == 0
