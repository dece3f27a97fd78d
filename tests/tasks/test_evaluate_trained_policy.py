"""`evaluate --method <variant>`: a training variant's final policy runs on the test harness as its warm start's
method (agent, prompts, options) with the RL adapter served over the warm start's, keyed apart from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.agents.react import SYSTEM_PROMPT, SYSTEM_PROMPTS
from components.io import read_jsonl
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.factory import LLMPool
from components.params import for_method
from components.params_section import ParamsError
from components.run_spec import run_spec
from components.schemas import Question, Trajectory
from components.trained_policy import variant_agent, with_trained_policy
from flows.pipeline import SCAFFOLD_VARIANTS, VARIANTS
from tasks.evaluate import evaluate, run_settings
from tests.agents.prompt_reading import question_of


def fake_adapter(folder, weights: bytes = b"weights"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_each_variant_is_served_over_its_agents_warm_start(repo_root, tmp_path):
    from components.params_load import load_params

    params = load_params(repo_root / "params.yaml", overrides=[f"run.out_dir={tmp_path}"])
    for variant in VARIANTS:
        fake_adapter(tmp_path / "train" / variant / "adapter")
        agent = variant_agent(run_spec(params), variant)
        assert agent == ("scaffold" if variant in SCAFFOLD_VARIANTS else "react")
        warm = params.methods[params.train_policy.warm_start[agent]]
        run, spec = for_method(with_trained_policy(params, variant), variant)
        assert spec.agent == warm.agent and spec.options == warm.options  # the warm start's prompts and budgets
        served = run.llm.backends[run.llm.roles["policy"]]
        warm_backend = params.llm.backends[warm.roles["policy"]]
        assert served.adapters == [*warm_backend.adapters, str(tmp_path / "train" / variant / "adapter")]
        assert served.merge_lora == warm_backend.merge_lora and served.model != warm_backend.model
        assert run.llm.roles["answer_judge"] == params.llm.roles["answer_judge"]  # the same judge
    assert with_trained_policy(params, "sft") is params  # a params.methods entry is left as it is
    with pytest.raises(ParamsError, match="training variants"):
        with_trained_policy(params, "nope")


def test_a_missing_adapter_or_warm_start_is_named(repo_root, tmp_path):
    from components.params_load import load_params

    params = load_params(repo_root / "params.yaml", overrides=[f"run.out_dir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="run train_policy@arbor"):
        with_trained_policy(params, "arbor")
    fake_adapter(tmp_path / "train" / "arbor" / "adapter")
    cold = load_params(repo_root / "params.yaml", overrides=[f"run.out_dir={tmp_path}", "train_policy.warm_start.react=null"])
    with pytest.raises(ParamsError, match="warm_start.react"):
        with_trained_policy(cold, "arbor")


def test_an_in_process_hf_warm_start_serves_the_trained_policy_too(repo_root, tmp_path):
    from components.params_load import load_params

    params = load_params(repo_root / "params.yaml", "paper", overlays=["smoke"], overrides=[f"run.out_dir={tmp_path}"])
    fake_adapter(tmp_path / "train" / "arbor" / "adapter")
    run, _ = for_method(with_trained_policy(params, "arbor"), "arbor")
    served = run.llm.backends[run.llm.roles["policy"]]
    assert served.type == "hf" and served.adapters == [str(tmp_path / "sft" / "adapter"),
                                                       str(tmp_path / "train" / "arbor" / "adapter")]


def test_evaluate_a_trained_policy_end_to_end(prepared_params):
    params = prepared_params("data.n_train=2", "data.n_dev=1", "data.n_test=3", "evaluation.n_questions=3",
                             "llm.middleware.cache=false")
    out = params.run.out_dir
    fake_adapter(Path(out) / "sft" / "adapter")
    fake_adapter(Path(out) / "train" / "grpo" / "adapter", b"rl weights")
    questions = {q.question: q for q in read_jsonl(f"{out}/data/test.jsonl", Question)}
    seen_systems = []

    def policy(messages, sampling):
        seen_systems.append(messages[0].content)
        return f"Thought: I know it.\nAction: finish[{questions[question_of(messages)].answers[0]}]"

    run, _ = for_method(with_trained_policy(params, "grpo"), "grpo")
    overrides = {"embedded-0_5b-sft-grpo": ScriptedChatModel(policy),
                 "embedded-1_5b": ScriptedChatModel(lambda m, s: '{"correct": true}')}
    with LLMPool(run, overrides=overrides) as pool:
        result = evaluate.fn(params, method="grpo", pool=pool)
    assert result.metrics["n"] == 3 and result.metrics["em"] == 1.0 and result.metrics["judge_accuracy"] == 1.0
    trajs = read_jsonl(result.trajectories, Trajectory)
    assert {t.policy for t in trajs} == {"embedded-0_5b-sft-grpo"}
    assert result.per_question.endswith("eval/grpo/per_question.csv")
    sft_run, _ = for_method(params, "sft")
    assert seen_systems[0] == SYSTEM_PROMPTS["compact"] != SYSTEM_PROMPT  # evaluate@sft's prompt
    assert run_settings(run, "grpo")["adapters"] != run_settings(sft_run, "sft")["adapters"]
