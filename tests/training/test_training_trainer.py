"""GRPO loop: it learns a verifiable reward on a tiny model, resumes exactly, and drops unscored samples.

Why a tiny random Qwen2 (vocab 16, width 32, 2 layers, ~30k parameters) rather than the embedded
Qwen2.5-0.5B: the 0.5B costs ~4 s per LoRA step on this 2-core machine, so the few dozen steps a learning
curve needs would take minutes; the tiny model has the same architecture and code path (peft LoRA on the
same module names, transformers generate, the same loss) and runs 30 steps in a few seconds. The real model
is exercised by the slow test in test_training_slow_gguf.py.
"""

from pathlib import Path

import pytest
import torch

from components.training.model import LoRASettings, build_policy
from components.training.rollout import HFRolloutEngine, SamplingParams
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.training.trainer import GRPOConfig, GRPOTrainer

TOK = CharTokenizer("abcdefghijklmn")
TARGET = TOK.encode("e")[0]
PROMPTS = ["abc", "bcd", "cde", "def", "efg", "fgh", "ghi", "hij"]


pytestmark = pytest.mark.usefixtures("one_thread")


def target_fraction(samples):
    return [sum(t == TARGET for t in s.response_ids) / max(len(s.response_ids), 1) for s in samples]


def make_trainer(config, *, init_seed=0, reward=target_fraction, prompts=PROMPTS, **kwargs):
    torch.manual_seed(init_seed)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
    return GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), reward, prompts, config, **kwargs)


def lora_weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def test_grpo_raises_reward_on_tiny_model():
    config = GRPOConfig(
        group_size=8,
        prompts_per_step=2,
        ppo_epochs=2,
        mini_batch_size=8,
        micro_batch_size=4,
        learning_rate=1e-2,
        kl_coef=5e-3,
        sampling=SamplingParams(max_new_tokens=8),
        seed=0,
    )
    trainer = make_trainer(config)
    history = trainer.train(30)
    rewards = [m["reward/mean"] for m in history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print("reward curve:", [round(r, 3) for r in rewards])
    assert first < 0.2  # about 1/16 at random
    assert last > first + 0.4, (first, last)
    assert all(m["optimizer_steps"] == 4 for m in history)  # 2 epochs x 2 mini-batches of 8


class Memory:
    """Stands in for a method's state (e.g. an ARBOR rubric memory): it counts reward calls."""

    def __init__(self):
        self.calls = 0

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state, files_dir):
        self.calls = state["calls"]
        assert (files_dir / "memory.txt").read_text() == str(self.calls)

    def write_files(self, folder: Path):
        (folder / "memory.txt").write_text(str(self.calls))


def _resumable(tmp_path, init_seed):
    memory = Memory()

    def reward(samples):
        memory.calls += 1
        return target_fraction(samples)

    config = GRPOConfig(
        group_size=4,
        prompts_per_step=2,
        ppo_epochs=2,
        mini_batch_size=4,
        learning_rate=1e-2,
        kl_coef=0.05,
        warmup_steps=2,
        total_steps=8,
        sampling=SamplingParams(max_new_tokens=6, temperature=0.9),
        checkpoint_every=3,
        keep_last=1,
        seed=1,
    )
    trainer = make_trainer(
        config,
        init_seed=init_seed,
        reward=reward,
        prompts=PROMPTS[:3],
        checkpoint_dir=tmp_path,
        method=memory,
    )
    return trainer, memory


def test_resume_continues_exactly(tmp_path):
    straight, straight_memory = _resumable(tmp_path / "a", init_seed=0)
    straight.train(6)

    first, _ = _resumable(tmp_path / "b", init_seed=0)
    first.train(3)  # checkpoint_every=3 saved step 3
    assert (tmp_path / "b" / "latest").read_text().strip() == "step_000003"

    resumed, resumed_memory = _resumable(tmp_path / "b", init_seed=123)  # different RNG use while building
    assert resumed.resume() is True
    assert resumed.step_count == 3 and resumed_memory.calls == 3
    resumed.train(6)

    a, b = lora_weights(straight), lora_weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert resumed.history == straight.history
    assert resumed_memory.calls == straight_memory.calls == 6
    assert resumed.sampler.state_dict() == straight.sampler.state_dict()
    assert resumed.scheduler.state_dict()["last_epoch"] == 6


def test_resume_without_checkpoint_is_a_no_op(tmp_path):
    trainer, _ = _resumable(tmp_path, init_seed=0)
    assert trainer.resume() is False and trainer.step_count == 0


def test_unscored_samples_are_dropped_not_zeroed():
    seen = {}

    def reward(samples):
        # one sample per group gets no score (a failed judge); the rest alternate 1, 0
        return [None if i % 4 == 0 else float(i % 2) for i in range(len(samples))]

    def advantages(samples, rewards, batch):
        seen["rewards"] = list(rewards)
        seen["rows"] = len(batch)
        return torch.zeros(batch.input_ids.shape)

    config = GRPOConfig(
        group_size=4,
        prompts_per_step=2,
        learning_rate=1e-2,
        kl_coef=0.0,
        sampling=SamplingParams(max_new_tokens=4),
    )
    trainer = make_trainer(config, reward=reward, advantage_fn=advantages)
    metrics = trainer.step()
    assert seen["rewards"] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert seen["rows"] == 6
    assert metrics["reward/none_fraction"] == pytest.approx(2 / 8)
    assert metrics["reward/mean"] == pytest.approx(4 / 6)


def test_step_with_no_scores_does_not_update():
    config = GRPOConfig(group_size=4, learning_rate=1e-1, sampling=SamplingParams(max_new_tokens=4))
    trainer = make_trainer(config, reward=lambda samples: [None] * len(samples))
    before = lora_weights(trainer)
    metrics = trainer.step()
    assert metrics["reward/none_fraction"] == 1.0 and "loss" not in metrics
    for name, value in lora_weights(trainer).items():
        assert torch.equal(before[name], value)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(group_size=0)
    with pytest.raises(ValueError, match="loss_agg"):
        GRPOConfig(loss_agg="mean")


def test_stage_advantages_reach_update_per_token():
    """SS-GRPO-style use: two stages per rollout, a [n, K] reward matrix, one advantage per stage block."""
    from components.training.advantages import group_advantages, segment_advantages
    from components.training.rollout import RolloutSegment
    from components.training.trainer import Sample

    def rollout(engine, prompts, group_size, sampling):
        samples = []
        for g, p in enumerate(prompts):
            for _ in range(group_size):
                plan, answer = engine.generate([p, p], sampling)
                segments = [
                    RolloutSegment(plan.prompt_ids, False),
                    RolloutSegment(plan.token_ids, True, plan.logprobs, segment_id=0),
                    RolloutSegment(TOK.encode("mn"), False, segment_id=0),  # an observation inside stage 0
                    RolloutSegment(answer.token_ids, True, segment_id=1),
                ]
                samples.append(Sample(p, g, segments))
        return samples

    stage_rewards = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]

    def advantages(samples, rewards, batch):
        adv = group_advantages(torch.tensor(rewards), [s.group for s in samples], eps=0.0)
        return segment_advantages(adv, batch.segment_ids, batch.loss_mask)

    config = GRPOConfig(
        group_size=4, kl_coef=0.0, learning_rate=1e-3, sampling=SamplingParams(max_new_tokens=3)
    )
    trainer = make_trainer(
        config, reward=lambda samples: stage_rewards, rollout_fn=rollout, advantage_fn=advantages
    )
    seen = {}
    real_update = trainer.update

    def spy(batch, adv):
        seen["batch"], seen["adv"] = batch, adv
        return real_update(batch, adv)

    trainer.update = spy
    trainer.step()
    batch, adv = seen["batch"], seen["adv"]
    # column 0: [1, 0, 1, 0] -> +-1; column 1: [0, 0, 1, 1] -> +-1
    expected = {0: [1.0, -1.0, 1.0, -1.0], 1: [-1.0, -1.0, 1.0, 1.0]}
    for row in range(4):
        for stage in (0, 1):
            tokens = (batch.segment_ids[row] == stage) & batch.loss_mask[row]
            assert tokens.any()
            assert torch.all(adv[row][tokens] == expected[stage][row])
        assert torch.all(adv[row][~batch.loss_mask[row]] == 0)  # prompt and the observation
