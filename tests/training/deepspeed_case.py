"""One training case of tests/training/test_deepspeed_stepper.py, run in its own process (DeepSpeed and
accelerate keep process-wide state: one ZeRO configuration per process).

    python -m tests.training.deepspeed_case OUT {sft,grpo} ZERO_STAGE STEPS [CKPT_DIR]

ZERO_STAGE 0 is the plain torch stepper. RUBRICFLOW_DS_DEVICE=cuda trains on the GPU (default: the CPU). Trains a tiny random Qwen2 with every weight trainable (full
fine-tuning) until STEPS optimizer steps, two micro-batches each. With CKPT_DIR, first resumes from the
checkpoint there if there is one, and saves one at the end (so a second process continues the first, as a
resumed run does). Writes the final weights to OUT (safetensors) and the metrics of the steps this process ran
beside it (OUT.json).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from components.training.engines.rollout import RolloutSegment, assemble
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import build_policy
from components.training.params import DeepSpeedParams, GRPOParams, SFTParams
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefghijklmn")
EXAMPLES = [SFTExample([2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 1, 1]), SFTExample([3, 4, 5, 6], [0, 1, 1, 1]),
            SFTExample([7, 8, 9, 2, 3], [0, 0, 0, 1, 1]), SFTExample([4, 4, 5, 5, 6, 6, 7], [0, 1, 1, 1, 1, 1, 1])]
ROWS = [[RolloutSegment([2, 3, 4], False), RolloutSegment([5, 6, 7, 8], True)],
        [RolloutSegment([2, 3, 4], False), RolloutSegment([9, 10], True)],
        [RolloutSegment([5, 4], False), RolloutSegment([11, 12, 13], True)]]
ADVANTAGES = [1.0, -0.5, 0.25]


class _NoEngine:
    pad_token_id = 0

    def update_weights(self, policy, step):
        pass


def _trainer(kind: str, zero: DeepSpeedParams | None, ckpt: Path):
    torch.manual_seed(0)
    device = os.environ.get("RUBRICFLOW_DS_DEVICE", "cpu")  # scripts/gpu_tests.sh sets cuda
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0).to(device), lora=None)
    if kind == "sft":
        config = SFTParams(lr=1e-2, batch_size=2, micro_batch_size=1, max_grad_norm=0.5)
        return SFTTrainer(policy, EXAMPLES, config, pad_token_id=0, seed=0, checkpoint_dir=ckpt, zero=zero)
    config = GRPOParams(lr=1e-2, micro_batch_size=2, kl_coef=0.0, max_grad_norm=0.5, steps=10)
    return GRPOTrainer(policy, _NoEngine(), lambda e, c: [0.0] * len(e), ["unused"], config, checkpoint_dir=ckpt, zero=zero)


def _grpo_step(trainer: GRPOTrainer) -> dict[str, float]:
    batch = assemble(ROWS, pad_token_id=0)
    adv = torch.zeros(batch.input_ids.shape)
    for i, a in enumerate(ADVANTAGES):
        adv[i][batch.loss_mask[i]] = a
    metrics = trainer.update(batch, adv)
    trainer.scheduler.step()
    trainer.step_count += 1
    return metrics


def main(out: str, kind: str, stage: str, steps: str, ckpt: str | None = None) -> None:
    zero = DeepSpeedParams(zero_stage=int(stage)) if int(stage) else None
    step = _grpo_step if kind == "grpo" else (lambda t: t.step())
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(kind, zero, Path(ckpt or tmp))
        resumed = trainer.resume() if ckpt else False
        metrics = [step(trainer) for _ in range(trainer.step_count, int(steps))]
        if ckpt:
            trainer.save()
        if zero is not None and zero.zero_stage == 3:
            weights = trainer.stepper.full_state_dict()
        else:
            weights = dict(trainer.policy.model.named_parameters())
        weights = {n: t.detach().float().cpu().contiguous().clone() for n, t in weights.items()}
    save_file(weights, out)
    Path(out + ".json").write_text(json.dumps({"type": type(trainer.optimizer).__name__, "resumed": resumed,
                                               "metrics": [{k: float(v) for k, v in m.items()
                                                            if k in ("loss", "grad_norm", "lr")} for m in metrics]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
