"""SFT learning-rate schedules against values computed by hand: the cosine decay after a warm-up ratio that
ARBOR B.2 and RubricEM F.1.1 use, the linear warm-up the constant schedule has always had, and the position
of the schedule across a checkpoint and resume."""

import itertools
import math

import pytest
import torch

from components.training.model import LoRASettings, build_policy
from components.training.params import SFTParams
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer, lr_scheduler, warmup_steps
from components.training.tiny import CharTokenizer, tiny_qwen2

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = CharTokenizer("abcdefghijklmn")
# 20 rows, 2 per step: 10 optimizer steps per epoch
EXAMPLES = [SFTExample([2 + i % 5, 3, 4, 5 + i % 3], [0, 1, 1, 1]) for i in range(20)]
LR = 1e-2


def lrs(config: SFTParams, total: int) -> list[float]:
    """The LR each of ``total`` optimizer steps runs with (read before the scheduler steps, as the trainer does)."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=config.lr)
    scheduler = lr_scheduler(optimizer, config, total)
    out = []
    for _ in range(total):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_cosine_after_a_ten_percent_warm_up_matches_hand_values():
    # 20 steps, warm-up ratio 0.1: w = 2; then lr * (1 + cos(pi * (s - 2) / 18)) / 2
    got = lrs(SFTParams(lr=LR, lr_schedule="cosine", warmup_ratio=0.1), 20)
    assert got[0] == 0.0                                  # step 0: the warm-up starts at 0
    assert got[1] == pytest.approx(LR / 2)                # half-way through the warm-up
    assert got[2] == pytest.approx(LR)                    # the end of the warm-up: the peak
    assert got[11] == pytest.approx(LR / 2)               # mid-way through the decay: cos(pi / 2) = 0
    assert got[19] == pytest.approx(LR * (1 + math.cos(math.pi * 17 / 18)) / 2)   # the last step
    assert got[19] == pytest.approx(LR * 0.00760, rel=1e-3)
    assert all(a > b for a, b in itertools.pairwise(got[2:]))  # decays monotonically after the peak


def test_constant_schedule_keeps_its_linear_warm_up_and_takes_a_ratio():
    assert lrs(SFTParams(lr=LR), 4) == [LR] * 4           # the default: no warm-up, constant
    assert lrs(SFTParams(lr=LR, warmup_steps=3), 5) == pytest.approx([LR / 3, 2 * LR / 3, LR, LR, LR])
    # a ratio replaces warmup_steps: 0.25 of 8 steps = 2
    assert lrs(SFTParams(lr=LR, warmup_steps=5, warmup_ratio=0.25), 8) == pytest.approx([LR / 2] + [LR] * 7)
    assert lrs(SFTParams(lr=LR, warmup_ratio=0.0, warmup_steps=2), 3) == pytest.approx([LR / 2, LR, LR])


def test_warm_up_ratio_rounds_up_without_float_noise():
    assert warmup_steps(SFTParams(warmup_ratio=0.1), 30) == 3     # 0.1 * 30 = 3.0000000000000004 in floats
    assert warmup_steps(SFTParams(warmup_ratio=0.1), 25) == 3     # 2.5 rounds up, as transformers does
    assert warmup_steps(SFTParams(warmup_ratio=0.1), 5) == 1
    assert warmup_steps(SFTParams(warmup_steps=7), 30) == 7


def trainer(config: SFTParams, checkpoint_dir=None) -> SFTTrainer:
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=4, alpha=8))
    return SFTTrainer(policy, EXAMPLES, config, pad_token_id=0, seed=0, checkpoint_dir=checkpoint_dir)


def test_the_trainer_runs_the_cosine_schedule_and_resumes_it(tmp_path):
    config = SFTParams(lr=LR, batch_size=2, lr_schedule="cosine", warmup_ratio=0.2)   # 10 steps, w = 2
    expected = [0.0, LR / 2] + [LR * (1 + math.cos(math.pi * (s - 2) / 8)) / 2 for s in range(2, 10)]
    whole = trainer(config)
    assert whole.total_steps == 10
    assert [m["lr"] for m in whole.train()] == pytest.approx(expected, abs=1e-12)

    first = trainer(config.model_copy(update={"checkpoint_every": 4}), tmp_path / "ckpt")
    first.train(4)
    resumed = trainer(config, tmp_path / "ckpt")
    assert resumed.resume() and resumed.step_count == 4
    assert resumed.scheduler.last_epoch == 4
    history = resumed.train()
    assert [m["lr"] for m in history] == pytest.approx(expected, abs=1e-12)   # steps 1-4 restored, 5-10 continued
    assert [m["loss"] for m in history] == pytest.approx([m["loss"] for m in whole.history], rel=1e-5)
