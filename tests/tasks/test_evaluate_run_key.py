"""An evaluation resumes only the run it started: retraining the adapter a backend serves (same path, new
weights) changes the resume key, so old trajectories are not reused."""

from __future__ import annotations

from components.params import for_method, load_params
from tasks.evaluate import run_key


def test_retrained_adapter_at_the_same_path_changes_the_run_key(repo_root, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    params, _ = for_method(load_params(repo_root / "params.yaml",
                                       overrides=[f"llm.backends.embedded-0_5b-sft.lora={adapter}"]), "sft")
    first = run_key(params, "sft")
    assert run_key(params, "sft") == first  # stable while nothing changes
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")
    assert run_key(params, "sft") != first
