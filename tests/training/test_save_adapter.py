"""save_adapter writes the same bytes for the same weights in every process: peft keeps LoRA's target modules as a
set and wrote them in the order of the process's string hashing, so two runs that trained identical weights (the
sft stage in a fresh clone, 2026-11-28) wrote different adapter_config.json files, hence other adapter digests and
DVC hashes. Each save runs in a process of its own, with its own PYTHONHASHSEED."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SAVE = """
import sys, torch
from components.adapters import save_adapter
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2
torch.manual_seed(0)
policy = build_policy(tiny_qwen2(16, seed=0), lora=LoRASettings(r=2, alpha=4))
policy.model.save_pretrained(sys.argv[1] + "/plain")
save_adapter(policy.model, sys.argv[1] + "/save_adapter")
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[int, Path]:
    """Each hash seed's process saves the same freshly built adapter both ways; the processes run side by side."""
    root = tmp_path_factory.mktemp("saved")
    runs = {seed: subprocess.Popen([sys.executable, "-c", SAVE, str(root / str(seed))], cwd=ROOT,
                                   env={**os.environ, "PYTHONHASHSEED": str(seed)}, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE) for seed in (1, 2, 3)}
    for run in runs.values():
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err.decode()[-3000:]
    return {seed: root / str(seed) for seed in runs}


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("how", ["plain", "save_adapter"])
def test_the_same_weights_save_to_the_same_bytes_under_any_string_hashing(saved, how):
    files = [digests(folder / how) for folder in saved.values()]
    weights = {f["adapter_model.safetensors"] for f in files}
    configs = {f["adapter_config.json"] for f in files}
    assert len(weights) == 1  # the same weights every time
    if how == "plain":  # what peft alone does: the config follows the hashing (why save_adapter exists)
        assert len(configs) > 1
    else:
        assert len(configs) == 1
