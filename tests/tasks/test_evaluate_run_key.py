"""An evaluation resumes only the run it started: retraining the adapter a backend serves (same path, new
weights) changes the resume key, so old trajectories are not reused."""

from __future__ import annotations

from components.params import for_method
from components.params_load import load_params
from tasks.evaluate import run_settings


def test_retrained_adapter_at_the_same_path_changes_the_run_key(repo_root, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    params, _ = for_method(load_params(repo_root / "params.yaml",
                                       overrides=[f"llm.backends.embedded-0_5b-sft.lora={adapter}"]), "sft")
    first = run_settings(params, "sft")
    assert run_settings(params, "sft") == first  # stable while nothing changes
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")
    assert run_settings(params, "sft") != first


def test_a_whole_model_retrained_at_the_same_path_changes_both_run_keys(repo_root, tmp_path):
    """The lab's policies are whole models loaded from a folder (the nano start, a fully fine-tuned cell): new
    weights there change the evaluation's key and the training run's, which their paths alone did not."""
    from components.training.grpo.policy_run_key import run_settings as train_settings

    folder = tmp_path / "sft"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model.safetensors").write_bytes(b"nano v1")
    params, _ = for_method(load_params(repo_root / "params.yaml", overlays=["lab"], overrides=[
        f"llm.backends.embedded-0_5b-sft.model={folder}", f"llm.backends.embedded-0_5b-hf.model={folder}"]), "sft")
    evaluation, training = run_settings(params, "sft"), train_settings(params, "grpo")
    assert run_settings(params, "sft") == evaluation and train_settings(params, "grpo") == training
    (folder / "model.safetensors").write_bytes(b"nano v2")
    assert run_settings(params, "sft") != evaluation and train_settings(params, "grpo") != training
    assert "start_weights" not in train_settings(load_params(repo_root / "params.yaml"), "grpo")  # named models


def test_versioned_trajectories_carry_no_wall_clock_fields():
    from components.schemas import Step, Trajectory

    t = Trajectory(question_id="q", question="?", policy="p", wall_s=3.5,
                   steps=[Step(index=0, raw="r", latency_s=1.25), Step(index=1, raw="s", latency_s=2.0)])
    stable = t.without_timings()
    assert stable.wall_s == 0.0 and [s.latency_s for s in stable.steps] == [0.0, 0.0]
    assert stable.model_dump(exclude={"wall_s", "steps"}) == t.model_dump(exclude={"wall_s", "steps"})
    assert [s.raw for s in stable.steps] == ["r", "s"] and t.wall_s == 3.5  # the original is untouched
