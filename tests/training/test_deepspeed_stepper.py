"""DeepSpeed ZeRO-2/3 through accelerate (components/training/stepper.py) trains what the plain torch loop trains,
and a ZeRO checkpoint resumes to the same weights as an uninterrupted run.

Runs on the CPU (``DS_ACCELERATOR=cpu``; ``RUBRICFLOW_DS_DEVICE=cuda`` on a GPU, as scripts/gpu_tests.sh does), each case in its own process (tests/training/deepspeed_case.py: DeepSpeed
and accelerate hold process-wide state). Needs DeepSpeed (the ``[gpu]`` extra) and takes a few minutes, so it is
behind ``-m slow``; skipped where DeepSpeed is not installed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from components.training.checkpoint import _full_weights, _load_full_weights
from components.training.tiny import tiny_qwen2

ROOT = Path(__file__).resolve().parents[2]


def run_case(out: Path, kind: str, stage: int, steps: int, ckpt: Path | None = None) -> tuple[dict, dict]:
    on_cpu = os.environ.get("RUBRICFLOW_DS_DEVICE", "cpu") == "cpu"
    env = {**os.environ, **({"DS_ACCELERATOR": "cpu"} if on_cpu else {})}
    args = [sys.executable, "-m", "tests.training.deepspeed_case", str(out), kind, str(stage), str(steps)]
    done = subprocess.run(args + ([str(ckpt)] if ckpt else []), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_file(str(out)), json.loads(Path(str(out) + ".json").read_text())


def max_difference(a: dict, b: dict) -> float:
    common = set(a) & set(b)
    assert len(common) >= len(b) - 1  # ZeRO-3's gathered state names a tied weight once
    return max(float((a[k] - b[k]).abs().max()) for k in common)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "grpo"])
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_trains_what_the_plain_loop_trains(tmp_path, kind, stage):
    pytest.importorskip("deepspeed")
    plain, plain_log = run_case(tmp_path / "plain.st", kind, 0, 2)
    zero, zero_log = run_case(tmp_path / "zero.st", kind, stage, 2)
    assert plain_log["type"] == "AdamW" and zero_log["type"].startswith("DeepSpeedZeroOptimizer")
    before = dict(tiny_qwen2(16, seed=0).named_parameters())
    assert max_difference(plain, {k: v.detach() for k, v in before.items()}) > 1e-3  # the weights moved
    assert max_difference(zero, plain) < 1e-4
    for p, z in zip(plain_log["metrics"], zero_log["metrics"], strict=True):
        assert z["grad_norm"] == pytest.approx(p["grad_norm"], rel=1e-4)  # every micro-batch's gradient counted
        assert z["loss"] == pytest.approx(p["loss"], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_a_zero_checkpoint_resumes_to_the_uninterrupted_weights(tmp_path, stage):
    pytest.importorskip("deepspeed")
    straight, _ = run_case(tmp_path / "straight.st", "sft", stage, 3)
    run_case(tmp_path / "first.st", "sft", stage, 1, tmp_path / "ckpt")
    resumed, log = run_case(tmp_path / "resumed.st", "sft", stage, 3, tmp_path / "ckpt")
    assert log["resumed"] and len(log["metrics"]) == 2
    assert max_difference(resumed, straight) < 1e-6


def test_full_weights_write_a_tied_weight_once_and_read_files_that_name_it_either_way(tmp_path):
    model = tiny_qwen2(16, seed=0)
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    assert tied  # the tiny Qwen2 ties its LM head to its embedding
    weights = _full_weights(model)
    assert not tied & set(weights)
    other = tiny_qwen2(16, seed=1)
    renamed = dict(weights)
    embed = next(n for n in weights if n.endswith("embed_tokens.weight"))
    renamed[next(iter(tied))] = renamed.pop(embed)  # the tie stored under the LM head's name
    save_file(renamed, str(tmp_path / "model.safetensors"))
    _load_full_weights(other, tmp_path / "model.safetensors")
    assert all(float((a - b).abs().max()) == 0 for a, b in zip(model.state_dict().values(),
                                                                 other.state_dict().values(), strict=True))
    save_file({**weights, "extra.weight": weights[embed].clone()}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="extra.weight"):
        _load_full_weights(other, tmp_path / "bad.safetensors")
