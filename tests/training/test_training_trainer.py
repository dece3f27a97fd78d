"""GRPO loop: it learns a verifiable reward on a tiny model, resumes exactly, drops unscored episodes, masks
missing stage scores, runs a method's loss hook over hidden states, and steps the scheduler once a step.

Why a tiny random Qwen2 (vocab 16, width 32, 2 layers, ~30k parameters) rather than the embedded
Qwen2.5-0.5B: the 0.5B costs ~4 s per LoRA step on this 2-core machine, so the few dozen steps a learning
curve needs would take minutes; the tiny model has the same architecture and code path (peft LoRA on the
same module names, transformers generate, the same loss) and runs 30 steps in a few seconds. The real model
is exercised by the slow test in test_training_slow_gguf.py.
"""

import json
from pathlib import Path

import pytest
import torch

from components.training.checkpoint import latest_checkpoint
from components.training.engines.rollout import HFRolloutEngine, RolloutSegment, SamplingParams
from components.training.grpo.episodes import Episode, RewardOutput
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy, recomputes_activations
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefghijklmn")
TARGET = TOK.encode("e")[0]
PROMPTS = ["abc", "bcd", "cde", "def", "efg", "fgh", "ghi", "hij"]


pytestmark = pytest.mark.usefixtures("one_thread")


def target_fraction(episodes, ctx=None):
    return [sum(t == TARGET for t in e.response_ids) / max(len(e.response_ids), 1) for e in episodes]


def make_trainer(config, *, init_seed=0, reward=target_fraction, prompts=PROMPTS, max_new_tokens=4,
                 temperature=1.0, **kwargs):
    torch.manual_seed(init_seed)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
    kwargs.setdefault("sampling", SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature))
    return GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), reward, prompts, config, **kwargs)


def lora_weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def test_grpo_raises_reward_on_tiny_model():
    config = GRPOParams(
        group_size=8,
        prompts_per_step=2,
        ppo_epochs=2,
        mini_batch_size=8,
        micro_batch_size=4,
        lr=1e-2,
        kl_coef=5e-3,
    )
    trainer = make_trainer(config, max_new_tokens=8)
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

    def reward(episodes, ctx):
        memory.calls += 1
        return target_fraction(episodes)

    config = GRPOParams(
        group_size=4,
        prompts_per_step=2,
        ppo_epochs=2,
        mini_batch_size=4,
        lr=1e-2,
        kl_coef=0.05,
        warmup_steps=2,
        total_steps=8,
        checkpoint_every=3,
        keep_last=1,
    )
    trainer = make_trainer(
        config,
        init_seed=init_seed,
        reward=reward,
        prompts=PROMPTS[:3],
        checkpoint_dir=tmp_path,
        method=memory,
        max_new_tokens=6,
        temperature=0.9,
        seed=1,
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


def test_unscored_episodes_are_dropped_not_zeroed():
    seen = {}

    def reward(episodes, ctx):
        # one episode per group gets no score (a failed judge); the rest alternate 1, 0
        return [None if i % 4 == 0 else float(i % 2) for i in range(len(episodes))]

    def advantages(episodes, scores, ctx):
        seen["scores"] = scores[:, 0].tolist()
        return torch.zeros_like(scores)

    trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=2, lr=1e-2, kl_coef=0.0),
                           reward=reward, advantage_fn=advantages)
    metrics = trainer.step()
    assert seen["scores"] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert metrics["episodes/unscored"] == 2
    assert metrics["reward/none_fraction"] == pytest.approx(2 / 8)
    assert metrics["reward/mean"] == pytest.approx(4 / 6)


def test_step_with_no_scores_does_not_update():
    trainer = make_trainer(GRPOParams(group_size=4, lr=1e-1), reward=lambda episodes, ctx: [None] * len(episodes))
    before = lora_weights(trainer)
    metrics = trainer.step()
    assert metrics["reward/none_fraction"] == 1.0 and "loss" not in metrics
    for name, value in lora_weights(trainer).items():
        assert torch.equal(before[name], value)
    assert trainer.scheduler.state_dict()["last_epoch"] == 1  # the schedule still advances one step


def test_config_errors_name_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="group_size"):
        GRPOParams(group_size=0)
    with pytest.raises(ValidationError, match="loss_agg"):
        GRPOParams(loss_agg="mean")
    with pytest.raises(TypeError, match="GRPOParams"):
        make_trainer({"group_size": 4})


def test_group_reward_reads_whole_groups_async_and_reports_metrics():
    """ARBOR-style reward: it sees every episode of a group at once (to pick anchors, judge pairs) and returns
    its own metrics, which reach on_metrics."""
    logged, seen_groups = [], []

    async def group_reward(episodes, ctx):
        by_group = {}
        for e in episodes:
            by_group.setdefault(e.group, []).append(e)
        seen_groups.append(sorted(len(v) for v in by_group.values()))
        scores = []
        for e in episodes:  # rank within the group: the longest response scores 1, others by share
            longest = max(len(x.response_ids) for x in by_group[e.group])
            scores.append(len(e.response_ids) / longest)
        return RewardOutput(scores, metrics={"judge_calls": 3.0 * len(by_group), "groups": float(len(by_group))})

    trainer = make_trainer(GRPOParams(group_size=3, prompts_per_step=2, lr=1e-2, kl_coef=0.0),
                           reward=group_reward, on_metrics=lambda step, m: logged.append(m))
    metrics = trainer.step()
    assert seen_groups == [[3, 3]]
    assert metrics["reward/judge_calls"] == 6.0 and metrics["reward/groups"] == 2.0
    assert logged[0]["reward/judge_calls"] == 6.0


def _two_stage_rollout(engine, prompts, group_size, sampling):
    episodes = []
    for g, p in enumerate(prompts):
        for _ in range(group_size):
            plan, answer = engine.generate([p, p], sampling)
            rows = [[
                RolloutSegment(plan.prompt_ids, False),
                RolloutSegment(plan.token_ids, True, plan.logprobs, segment_id=0),
                RolloutSegment(TOK.encode("mn"), False, segment_id=0),  # an observation inside stage 0
                RolloutSegment(answer.token_ids, True, segment_id=1),
            ]]
            episodes.append(Episode(p, g, rows))
    return episodes


def _spy_update(trainer):
    seen = {}
    real_update = trainer.update

    def spy(batch, adv, **kwargs):
        seen["batch"], seen["adv"] = batch, adv
        return real_update(batch, adv, **kwargs)

    trainer.update = spy
    return seen


def test_stage_advantages_reach_update_per_token():
    """SS-GRPO-style use: two stages per episode, a [n, K] score matrix, one advantage per stage block."""
    stage_scores = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, kl_coef=0.0, lr=1e-3, adv_eps=1e-12),
                           reward=lambda episodes, ctx: stage_scores, rollout_fn=_two_stage_rollout,
                           max_new_tokens=3)
    seen = _spy_update(trainer)
    trainer.step()
    batch, adv = seen["batch"], seen["adv"]
    # column 0: [1, 0, 1, 0] -> +-1; column 1: [0, 0, 1, 1] -> +-1
    expected = {0: [1.0, -1.0, 1.0, -1.0], 1: [-1.0, -1.0, 1.0, 1.0]}
    for row in range(4):
        for stage in (0, 1):
            tokens = (batch.segment_ids[row] == stage) & batch.loss_mask[row]
            assert tokens.any()
            assert torch.allclose(adv[row][tokens], torch.tensor(expected[stage][row]))
        assert torch.all(adv[row][~batch.loss_mask[row]] == 0)  # prompt and the observation


def test_missing_stage_score_is_masked_not_zeroed():
    """Episode 1's stage-1 judge failed (None): stage 1 is normalised over the other three episodes, and the
    stage-1 tokens of episode 1 leave the loss instead of being trained towards a 0 score."""
    stage_scores = [[1.0, 0.0], [0.0, None], [1.0, 1.0], [0.0, 1.0]]
    trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, kl_coef=0.0, lr=1e-3, adv_eps=1e-12),
                           reward=lambda episodes, ctx: stage_scores, rollout_fn=_two_stage_rollout,
                           max_new_tokens=3)
    seen = _spy_update(trainer)
    metrics = trainer.step()
    batch, adv = seen["batch"], seen["adv"]
    assert metrics["reward/missing_values"] == 1 and metrics["episodes/unscored"] == 0
    stage1 = batch.segment_ids == 1
    assert not batch.loss_mask[1][stage1[1]].any()  # masked out of the loss
    assert batch.loss_mask[1][batch.segment_ids[1] == 0].any()  # its stage 0 still trains
    # stage 1 over episodes 0, 2, 3: [0, 1, 1], mean 2/3, population std sqrt(2)/3
    std = (2 ** 0.5) / 3
    for row, value in ((0, -2 / 3 / std), (2, 1 / 3 / std), (3, 1 / 3 / std)):
        tokens = stage1[row] & batch.loss_mask[row]
        assert torch.allclose(adv[row][tokens], torch.tensor(value), atol=1e-5)


class ScoreHead(torch.nn.Module):
    """Stands in for ARCO's score head: a scalar per token from the policy's last hidden state."""

    def __init__(self, width):
        super().__init__()
        self.proj = torch.nn.Linear(width, 1)

    def forward(self, hidden):
        return self.proj(hidden).squeeze(-1)


def test_loss_fn_reads_hidden_states_and_its_module_resumes(tmp_path):
    def run(root, steps, resume=False):
        torch.manual_seed(5)
        head = ScoreHead(tiny_qwen2(TOK.vocab_size, seed=0).config.hidden_size)
        calls = []

        def loss_fn(inputs):
            calls.append(inputs.hidden.shape)
            pred = head(inputs.hidden)  # [b, T]
            mask = inputs.batch.loss_mask.to(pred.dtype)
            target = torch.ones_like(pred)
            term = (((pred - target) ** 2) * mask).sum() / max(inputs.num_tokens, 1.0)
            return 0.5 * term, {"score_mse": float(term.detach())}

        trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, lr=1e-2, kl_coef=0.0,
                                          checkpoint_every=2, keep_last=1),
                               loss_fn=loss_fn, extra_modules={"score_head": head}, checkpoint_dir=root)
        if resume:
            assert trainer.resume()
        before = {k: v.clone() for k, v in head.state_dict().items()}
        history = trainer.train(steps)
        return trainer, head, before, history, calls

    trainer, head, before, history, calls = run(tmp_path / "a", 4)
    assert calls and calls[0][-1] == head.proj.in_features
    assert history[0]["loss_fn/score_mse"] > history[-1]["loss_fn/score_mse"]  # the head learns
    assert not torch.equal(before["proj.weight"], head.state_dict()["proj.weight"])
    assert (tmp_path / "a" / "step_000004" / "extra" / "score_head.safetensors").exists()

    run(tmp_path / "b", 2)
    resumed, resumed_head, _, _, _ = run(tmp_path / "b", 4, resume=True)
    for k, v in head.state_dict().items():
        assert torch.equal(v, resumed_head.state_dict()[k]), k
    assert resumed.history == trainer.history


def test_two_updates_in_one_step_advance_the_schedule_once():
    """ARCO / RubricEM update two heads or roles on one backbone per step: the LR schedule counts steps."""

    class SecondUpdate:
        def state_dict(self):
            return {}

        def load_state_dict(self, state, files_dir):
            pass

        def on_step_end(self, trainer, ctx, episodes, scores):
            batch_rows = [row for e in episodes for row in e.rows]
            from components.training.engines.rollout import assemble

            batch = assemble(batch_rows, pad_token_id=trainer.pad_token_id)
            m = trainer.update(batch, torch.ones(batch.input_ids.shape) * batch.loss_mask)
            return {"second_update_steps": m["optimizer_steps"]}

    trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, lr=1e-2, kl_coef=0.0, warmup_steps=4),
                           method=SecondUpdate())
    lrs = [trainer.step()["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-2 * k / 4 for k in (1, 2, 3)])
    assert trainer.history[-1]["method/second_update_steps"] == 1.0
    assert trainer.scheduler.state_dict()["last_epoch"] == 3


def test_the_methods_step_end_work_is_timed_apart_from_the_update():
    """ARCO's teacher annotations and mu's warm-up run in on_step_end: ``time/method``, not ``time/update``."""
    import time as clock

    class Slow:
        def on_step_end(self, trainer, ctx, episodes, scores):
            clock.sleep(0.5)
            return {"time/warmup": 0.5, "warm": 1.0}

    logged = []
    trainer = make_trainer(GRPOParams(group_size=2, prompts_per_step=1, kl_coef=0.0), method=Slow(),
                           on_metrics=lambda step, m: logged.append(m))
    trainer.step()
    assert logged[0]["time/method"] >= 0.5
    assert logged[0]["time/update"] < logged[0]["time/method"]
    assert logged[0]["time/checkpoint"] == 0.0  # no checkpoint directory
    # the method's own wall-clock figure: logged as a timing, kept out of the checkpointed history
    assert logged[0]["time/method/warmup"] == 0.5 and "method/time/warmup" not in logged[0]
    assert trainer.history[0]["method/warm"] == 1.0
    assert not any("time" in k for k in trainer.history[0])


def test_the_checkpoint_is_timed_and_written_before_the_steps_metrics_are_logged(tmp_path):
    seen = []
    trainer = make_trainer(GRPOParams(group_size=2, prompts_per_step=1, kl_coef=0.0, checkpoint_every=2),
                           checkpoint_dir=tmp_path,
                           on_metrics=lambda step, m: seen.append((step, m["time/checkpoint"], sorted(
                               p.name for p in tmp_path.glob("step_*")))))
    trainer.step()
    trainer.step()
    assert [(step, dirs) for step, _, dirs in seen] == [(1, []), (2, ["step_000002"])]
    assert seen[0][1] == 0.0 and seen[1][1] > 0


def test_on_train_end_lands_deferred_work_once_and_the_checkpoint_holds_it(tmp_path):
    """A method that defers work past a step (RubricEM's reflection batch) finishes it after the last step:
    metrics join the last step's under end/ (the step's own metrics from the same hook stay), the last
    checkpoint is rewritten, a second call (a finished run resumed) does nothing."""

    class Deferred:
        def __init__(self):
            self.pending, self.done, self.ends = 0, 0, 0

        def state_dict(self):
            return {"pending": self.pending, "done": self.done}

        def load_state_dict(self, state, files_dir):
            self.pending, self.done = (state or {}).get("pending", 0), (state or {}).get("done", 0)

        def on_step_end(self, trainer, ctx, episodes, scores):
            out = {"landed": 10.0 * self.pending} if self.pending else {}
            self.done, self.pending = self.done + self.pending, 1  # this step's work waits for the next
            return out

        def on_train_end(self, trainer, ctx):
            self.ends += 1
            if not self.pending:
                return None
            self.done, self.pending = self.done + self.pending, 0
            return {"landed": 1.0, "at_step": float(ctx.step)}

    logged = []
    method = Deferred()
    trainer = make_trainer(GRPOParams(group_size=2, prompts_per_step=1, checkpoint_every=1), method=method,
                           checkpoint_dir=tmp_path, on_metrics=lambda step, m: logged.append((step, m)))
    trainer.train(2)
    assert method.done == 2 and method.pending == 0 and method.ends == 1
    assert trainer.history[-1]["method/landed"] == 10.0  # step 1's work, landed during step 2
    assert trainer.history[-1]["end/method/landed"] == 1.0 and trainer.history[-1]["end/method/at_step"] == 2.0
    assert logged[-1] == (2, {"end/method/landed": 1.0, "end/method/at_step": 2.0})
    state = json.loads((latest_checkpoint(tmp_path) / "method" / "state.json").read_text())
    assert state == {"pending": 0, "done": 2}
    again = Deferred()
    resumed = make_trainer(GRPOParams(group_size=2, prompts_per_step=1, checkpoint_every=1), method=again,
                           checkpoint_dir=tmp_path)
    assert resumed.resume() and again.done == 2
    mtime = (latest_checkpoint(tmp_path) / "manifest.json").stat().st_mtime_ns
    resumed.train(2)
    assert again.ends == 1 and again.done == 2 and resumed.history == trainer.history
    assert (latest_checkpoint(tmp_path) / "manifest.json").stat().st_mtime_ns == mtime  # nothing rewritten


def test_on_policy_update_skips_the_old_logprob_pass_and_matches_recompute():
    results = {}
    for mode in ("auto", "recompute"):
        trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, lr=1e-2, kl_coef=1e-3,
                                          old_logprobs=mode), max_new_tokens=6)
        torch.manual_seed(11)
        metrics = trainer.step()
        results[mode] = (metrics, lora_weights(trainer))
    assert results["auto"][0]["old_logprob_pass"] == 0.0 and results["recompute"][0]["old_logprob_pass"] == 1.0
    assert results["auto"][0]["ratio_mean"] == 1.0
    for name, value in results["auto"][1].items():
        assert torch.allclose(value, results["recompute"][1][name], atol=1e-6), name
    off_policy = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, ppo_epochs=2, kl_coef=0.0))
    assert off_policy.step()["old_logprob_pass"] == 1.0


def test_method_attach_sees_the_trainer_before_resume(tmp_path):
    class Attached:
        def attach(self, trainer):
            self.policy, self.steps_at_attach = trainer.policy, trainer.step_count

        def state_dict(self):
            return {}

        def load_state_dict(self, state, files_dir):
            pass

    method = Attached()
    trainer = make_trainer(GRPOParams(group_size=2, prompts_per_step=1), method=method)
    assert method.policy is trainer.policy and method.steps_at_attach == 0


def test_zero_advantage_episodes_skip_the_update_when_asked():
    def reward(episodes, ctx):  # group 0 all equal (no signal), group 1 mixed
        return [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]

    seen = []
    for skip in (False, True):
        trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=2, lr=1e-2, kl_coef=0.0,
                                          skip_zero_advantage=skip), reward=reward)
        calls = []

        def counting(batch, adv, calls=calls, original=trainer.update, **kw):
            calls.append(len(batch))
            return original(batch, adv, **kw)

        trainer.update = counting
        metrics = trainer.step()
        assert metrics["episodes/zero_advantage"] == 4
        seen.append(calls[0])
    assert seen == [8, 4]  # one row per single-turn episode: group 0's four rows are left out


def test_all_zero_variance_step_makes_no_update_when_skipping():
    trainer = make_trainer(GRPOParams(group_size=4, lr=1e-1, skip_zero_advantage=True),
                           reward=lambda episodes, ctx: [0.0] * len(episodes))
    before = lora_weights(trainer)
    metrics = trainer.step()
    assert "loss" not in metrics and metrics["episodes/zero_advantage"] == metrics["episodes"]
    for name, value in lora_weights(trainer).items():
        assert torch.equal(before[name], value)


def test_episodes_whose_advantages_are_zero_or_masked_are_skipped():
    """Per-stage advantages where every stage is missing (NaN) or carries no signal (0), as SS-GRPO gives when
    the stage judge's rubric generation failed and every answer scored the same: nothing to train on."""
    def advantages(episodes, scores, ctx):
        adv = torch.zeros(len(episodes), 4)
        adv[:, :3] = float("nan")
        return adv

    trainer = make_trainer(GRPOParams(group_size=4, lr=1e-1, skip_zero_advantage=True),
                           reward=lambda episodes, ctx: [[None, None, None, 0.0]] * len(episodes),
                           advantage_fn=advantages)
    before = lora_weights(trainer)
    metrics = trainer.step()
    assert metrics["episodes/zero_advantage"] == metrics["episodes"] and "loss" not in metrics
    for name, value in lora_weights(trainer).items():
        assert torch.equal(before[name], value)


def test_token_budget_micro_batches_pack_by_length_and_give_the_same_update():
    from components.training.engines.rollout import assemble

    rows = [[RolloutSegment(list(range(1, n)), False), RolloutSegment([3, 4], True)] for n in (5, 1, 8, 2, 4)]
    batch = assemble(rows, pad_token_id=0)
    assert batch.attention_mask.sum(dim=1).tolist() == [6, 2, 9, 3, 5]
    packed = make_trainer(GRPOParams(group_size=4, micro_batch_tokens=12, kl_coef=0.0, prefix_packing=False))
    chunks = [c.tolist() for c in packed._micro_batches(torch.arange(len(batch)), batch)]
    # by length 2, 3 | 5, 6 | 9: each chunk's rows x its longest row <= 12 (2x3, 2x6), 9 alone
    assert chunks == [[1, 3], [4, 0], [2]]

    whole = make_trainer(GRPOParams(group_size=4, kl_coef=0.0))
    advantages = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.5])[:, None] * batch.loss_mask.float()
    before = lora_weights(whole)
    metrics = [t.update(batch, advantages) for t in (whole, packed)]
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-6)
    after_whole, after_packed = lora_weights(whole), lora_weights(packed)
    assert any(not torch.equal(before[n], after_whole[n]) for n in before)  # the update did something
    for name in after_whole:
        assert torch.allclose(after_whole[name], after_packed[name], atol=1e-6)


def test_rows_sharing_a_prompt_run_as_one_pack_and_give_the_same_update():
    """``prefix_packing``: a group's rows (one prompt, four completions) are one micro-batch, the prompt
    computed once; the reference pass, the loss and a loss hook reading the hidden states come out as a
    padded pass over the whole batch computes them, and so does the update."""
    from components.training.engines.rollout import assemble

    prompt = [5, 9, 2, 7, 11, 3, 8, 6]
    rows = [[RolloutSegment(prompt, False), RolloutSegment(c, True)] for c in ([3, 4], [3, 5, 6], [7], [4, 4, 2])]
    rows.append([RolloutSegment([1, 2, 3], False), RolloutSegment([6, 5], True)])  # another prompt: its own tree
    batch = assemble(rows, pad_token_id=0)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0])[:, None] * batch.loss_mask.float()

    def hook(inputs):  # a term on the last hidden states at the loss tokens, as a score head adds one
        picked = inputs.hidden[inputs.batch.loss_mask.bool().to(inputs.hidden.device)]
        return 0.01 * picked.pow(2).sum() / inputs.num_tokens, {"hidden_sq": float(picked.pow(2).sum())}

    config = {"group_size": 4, "kl_coef": 0.05, "old_logprobs": "recompute"}
    packed = make_trainer(GRPOParams(micro_batch_tokens=64, **config))
    whole = make_trainer(GRPOParams(**config))
    micros = packed._micro_batches(torch.arange(len(batch)), batch)
    assert [sorted(m.tolist()) for m in micros] == [[0, 1, 2, 3, 4]]
    # the trunk (prompt and a 3-token completion), each other row its completion and the prompt's last token
    # (where its first log-prob is read), the other prompt's row alone
    sub = batch.select(micros[0])
    assert packed._pass_tokens(sub, packed._pack(sub)) == len(prompt) + 3 + (1 + 3) + (1 + 2) + (1 + 1) + 5
    with torch.no_grad():  # the adapter away from the reference, so the KL term is not zero
        for t in (packed, whole):
            for n, p in t.policy.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.1)
    with torch.no_grad():  # rows in batch order, which is not the pack's (it lays the longest out first)
        (lp_whole, h_whole), (lp_packed, h_packed) = (t._forward(batch, t._pack(batch), hidden=True)
                                                      for t in (whole, packed))
    assert packed._pack(batch).rows != list(range(len(batch)))
    loss = batch.loss_mask.bool()
    assert torch.allclose(lp_whole, lp_packed, atol=1e-5) and torch.allclose(h_whole[loss], h_packed[loss], atol=1e-5)
    before = lora_weights(whole)
    m_whole, m_packed = (t.update(batch, advantages, loss_fn=hook) for t in (whole, packed))
    assert m_whole["kl"] > 0 and m_whole["old_logprob_pass"] == 1.0
    for key in ("loss", "kl", "loss_fn/hidden_sq"):
        assert m_packed[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-6), key
    assert (m_whole["pass_tokens"], m_packed["pass_tokens"]) == (5 * 11, 25)  # padded to the longest; the pack
    after_whole, after_packed = lora_weights(whole), lora_weights(packed)
    assert any(not torch.equal(before[n], after_whole[n]) for n in before)
    for name in after_whole:
        assert torch.allclose(after_whole[name], after_packed[name], atol=1e-6), name


def test_gradient_checkpointing_gives_the_same_update():
    from components.training.engines.rollout import assemble

    rows = [[RolloutSegment(list(range(1, n)), False), RolloutSegment([3, 4, 5], True)] for n in (5, 2, 7)]
    batch = assemble(rows, pad_token_id=0)
    advantages = torch.tensor([1.0, -1.0, 0.5])[:, None] * batch.loss_mask.float()
    trainers = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16),
                              gradient_checkpointing=checkpointing)
        trainers.append(GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), target_fraction, PROMPTS,
                                    GRPOParams(group_size=4, kl_coef=0.01)))
    assert recomputes_activations(trainers[1].policy.model)
    assert not recomputes_activations(trainers[0].policy.model)
    before = lora_weights(trainers[0])
    metrics = [t.update(batch, advantages) for t in trainers]
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-6)
    plain, recomputed = lora_weights(trainers[0]), lora_weights(trainers[1])
    assert any(not torch.equal(before[n], plain[n]) for n in before)
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], atol=1e-6)


def test_short_micro_batches_keep_their_activations_in_the_update():
    from components.training.engines.rollout import assemble
    from tests.autograd_saved import saved_tensor_count

    rows = [[RolloutSegment(list(range(1, n)), False), RolloutSegment([3, 4, 5], True)] for n in (5, 2, 7)]
    batch = assemble(rows, pad_token_id=0)  # one micro-batch of 3 rows x 9 tokens = 27 padded tokens
    advantages = torch.tensor([1.0, -1.0, 0.5])[:, None] * batch.loss_mask.float()
    weights, saved = [], []
    for checkpointing, min_tokens in ((False, 0), (True, 0), (True, 28), (True, 27)):
        torch.manual_seed(0)
        policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16),
                              gradient_checkpointing=checkpointing)
        trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), target_fraction, PROMPTS,
                              GRPOParams(group_size=4, kl_coef=0.01, checkpoint_min_tokens=min_tokens))
        with saved_tensor_count() as count:
            trainer.update(batch, advantages)
        weights.append(lora_weights(trainer))
        saved.append(count[0])
        assert recomputes_activations(policy.model) == checkpointing  # flags restored
    plain, recomputed, kept, at_threshold = saved
    assert recomputed * 3 < plain
    assert kept >= plain            # 27 < 28: keeps every layer's activations
    assert at_threshold == recomputed  # the threshold is "fewer than"
    for other in weights[1:]:
        for name, value in weights[0].items():
            assert torch.allclose(value, other[name], atol=1e-6), name


def test_a_branch_starts_from_another_runs_checkpoint_then_resumes_its_own(tmp_path):
    straight, _ = _resumable(tmp_path / "straight", init_seed=0)
    straight.train(6)
    source, _ = _resumable(tmp_path / "source", init_seed=0)
    source.train(3)  # checkpoint step_000003 under source/

    branch, memory = _resumable(tmp_path / "branch", init_seed=7)
    assert branch.resume_or_branch(tmp_path / "source" / "step_000003") == "branch"
    assert branch.step_count == 3 and memory.calls == 3  # the method state came along
    branch.train(6)
    for name, value in lora_weights(straight).items():
        assert torch.equal(value, lora_weights(branch)[name]), name  # the same run as one that never branched
    assert branch.history == straight.history

    again, _ = _resumable(tmp_path / "branch", init_seed=7)  # its own checkpoints now win over the branch point
    assert again.resume_or_branch(tmp_path / "source" / "step_000003") == "own" and again.step_count == 6
    fresh, _ = _resumable(tmp_path / "fresh", init_seed=0)
    assert fresh.resume_or_branch(None) == "fresh" and fresh.step_count == 0
    with pytest.raises(FileNotFoundError, match="manifest"):
        fresh.resume_or_branch(tmp_path / "source")  # a root, not a checkpoint folder
