"""DAPO's dynamic sampling in the one trainer (``grpo.dynamic_sampling_max_rounds``): groups whose scores do
not differ are left out and more prompts are drawn until the step holds ``prompts_per_step`` groups with
signal, at most that many rounds; the ``dapo`` variant turns it on (``dapo.max_num_gen_batches`` rounds, the
first included) with the rest of DAPO (clip-higher, no KL, token-mean, the overlong shaping), ARBOR's
``dapo_arbor`` only drops the homogeneous groups, and the new grpo options stay out of run keys until set."""

import pytest
import torch

from components.params_load import load_params
from components.rewards.overlong import OverlongShaping
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.grpo.policy_run_key import run_settings
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.variants import (
    VariantContext,
    drop_homogeneous_groups,
    get_variant,
    variant_grpo,
    variant_params,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = CharTokenizer("abcdefghijklmn")
PROMPTS = ["abc", "bcd", "cde", "def", "efg", "fgh"]
SAME = {"abc", "cde", "def"}  # prompts whose every episode scores 1 (no signal); the others alternate 1, 0


def scripted(calls):
    def reward(episodes, ctx):
        calls.append((list(ctx.groups), [e.prompt for e in episodes]))
        return [1.0 if e.prompt in SAME else float(i % 2) for i, e in enumerate(episodes)]

    return reward


def make(rounds, reward, prompts=PROMPTS, **kw):
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=4, alpha=8))
    config = GRPOParams(group_size=2, prompts_per_step=2, lr=1e-2, kl_coef=0.0, shuffle=False,
                        dynamic_sampling_max_rounds=rounds, **kw)
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), reward, prompts, config,
                          sampling=SamplingParams(max_new_tokens=3, temperature=1.0))
    rows = []

    def spy(batch, adv, original=trainer.update, **kw):
        rows.append(len(batch))
        return original(batch, adv, **kw)

    trainer.update = spy
    return trainer, rows


def test_refill_draws_until_the_batch_holds_prompts_per_step_groups_with_signal():
    calls = []
    trainer, rows = make(3, scripted(calls))
    m = trainer.step()
    # draw 1: abc (no signal), bcd -> 1 missing; refill 1: cde (none); refill 2: def (none); refill 3: efg
    assert [prompts for _, prompts in calls] == [["abc", "abc", "bcd", "bcd"], ["cde", "cde"], ["def", "def"],
                                                 ["efg", "efg"]]
    assert [groups for groups, _ in calls] == [[0, 0, 1, 1], [2, 2], [3, 3], [4, 4]]  # one number per group
    assert m["dynamic_sampling/refill_rounds"] == 3 and m["dynamic_sampling/prompts"] == 5
    assert m["dynamic_sampling/groups"] == 2 and m["dynamic_sampling/filtered_groups"] == 3
    assert m["episodes"] == 10 and m["episodes/unscored"] == 0
    assert rows == [4]  # bcd's and efg's episodes: a full batch of 2 groups x 2
    assert trainer.sampler.cursor == 5  # the refill consumed prompts from the data order


def test_the_cap_stops_the_refill_and_the_step_trains_on_what_it_has():
    calls = []
    trainer, rows = make(1, scripted(calls))
    m = trainer.step()
    assert len(calls) == 2 and m["dynamic_sampling/refill_rounds"] == 1
    assert m["dynamic_sampling/groups"] == 1 and m["dynamic_sampling/filtered_groups"] == 2
    assert rows == [2]  # bcd's group only
    assert trainer.step_count == 1 and trainer.sampler.cursor == 3


def test_a_full_first_draw_needs_no_refill_and_zero_rounds_is_todays_step():
    calls = []
    trainer, rows = make(3, scripted(calls), prompts=["bcd", "efg"])
    m = trainer.step()
    assert len(calls) == 1 and m["dynamic_sampling/refill_rounds"] == 0 and rows == [4]
    calls.clear()
    trainer, rows = make(0, scripted(calls))
    m = trainer.step()
    assert len(calls) == 1 and rows == [4]  # abc's homogeneous group stays in the batch (advantage 0)
    assert not any(k.startswith("dynamic_sampling") for k in m)
    assert m["episodes/zero_advantage"] == 2


def test_with_dapos_drop_the_refill_replaces_the_dropped_groups_and_sums_their_counts():
    calls = []
    trainer, rows = make(3, drop_homogeneous_groups(scripted(calls)))
    m = trainer.step()
    assert len(calls) == 4 and rows == [4]
    assert m["reward/homogeneous_groups"] == 1                          # the first draw's
    assert m["dynamic_sampling/reward/homogeneous_groups"] == 2         # the refills': cde, def
    assert m["episodes/unscored"] == 6                                  # the dropped groups' episodes


@pytest.mark.parametrize("profile", ["embedded", "paper"])
def test_the_dapo_variant_refills_within_its_bound_and_a_set_value_wins(repo_root, tmp_path, profile):
    params = load_params(repo_root / "params.yaml", profile)
    ctx = VariantContext(params=variant_params(params, "dapo"), roles=lambda role: None, toolbox=None, out_dir=tmp_path)
    dapo, grpo = get_variant("dapo")(ctx), get_variant("grpo")(ctx)
    assert params.grpo.dynamic_sampling_max_rounds is None
    bound = {"embedded": 4, "paper": 10}[profile]  # generation rounds, the first included (verl's count)
    assert params.dapo.max_num_gen_batches == bound
    assert variant_grpo(params.grpo, dapo).dynamic_sampling_max_rounds == bound - 1
    assert variant_grpo(params.grpo, grpo).dynamic_sampling_max_rounds == 0
    off = params.grpo.model_copy(update={"dynamic_sampling_max_rounds": 0})
    assert variant_grpo(off, dapo).dynamic_sampling_max_rounds == 0
    arbors = get_variant("dapo_arbor")(ctx)  # ARBOR's DAPO discards the homogeneous groups and draws no more
    assert variant_grpo(params.grpo, arbors).dynamic_sampling_max_rounds == 0
    assert isinstance(dapo.reward_fn, OverlongShaping) and not isinstance(arbors.reward_fn, OverlongShaping)


def test_a_bound_of_two_generation_rounds_refills_once_and_trains_on_what_it_has():
    calls = []
    trainer, rows = make(2 - 1, drop_homogeneous_groups(scripted(calls)))  # max_num_gen_batches 2
    m = trainer.step()
    assert len(calls) == 2 and m["dynamic_sampling/refill_rounds"] == 1  # abc, bcd; then cde (no signal): stop
    assert m["dynamic_sampling/groups"] == 1 and rows == [2]


@pytest.mark.parametrize("profile", ["embedded", "paper"])
def test_dapo_trains_with_clip_higher_no_kl_and_token_mean_and_grpo_is_untouched(repo_root, profile):
    params = load_params(repo_root / "params.yaml", profile)
    dapo = variant_params(params, "dapo").grpo
    assert (dapo.clip_eps, dapo.clip_eps_high, dapo.kl_coef, dapo.loss_agg) == (0.2, 0.28, 0.0, "token_mean")
    assert dapo.dual_clip_c == 10.0  # the released recipe's clip_ratio_c
    assert variant_params(params, "grpo").grpo == params.grpo  # the dapo section touches no other variant
    assert params.grpo.clip_eps_high is None and params.grpo.dual_clip_c != 10.0 and params.grpo.kl_coef > 0
    assert variant_params(params, "dapo_arbor").grpo.clip_eps_high is None  # ARBOR's DAPO: its own B.2 clip
    same = dapo.model_dump(exclude={"clip_eps", "clip_eps_high", "kl_coef", "loss_agg", "dual_clip_c"})
    assert same == params.grpo.model_dump(exclude={"clip_eps", "clip_eps_high", "kl_coef", "loss_agg", "dual_clip_c"})


def test_the_trainer_applies_dapos_clip_and_skips_the_reference_pass(monkeypatch):
    """What reaches the loss: the trainer of a dapo config calls it with eps 0.2 / 0.28, KL 0 and no reference
    log-probs (the reference model is never run)."""
    import components.training.grpo.trainer as trainer_module

    seen, real = [], trainer_module.policy_loss

    def spy(*args, **kw):
        seen.append((args[4], kw["clip_eps"], kw["clip_eps_high"], kw["kl_coef"], kw["agg"]))
        return real(*args, **kw)

    monkeypatch.setattr(trainer_module, "policy_loss", spy)
    calls = []
    trainer, _ = make(0, scripted(calls), prompts=["bcd", "efg"], clip_eps_high=0.28, loss_agg="token_mean")
    references = []
    original = trainer._logprobs
    trainer._logprobs = lambda batch, reference: references.append(reference) or original(batch, reference=reference)
    trainer.step()
    assert seen and all(s == (None, 0.2, 0.28, 0.0, "token_mean") for s in seen)
    assert True not in references


def test_dapos_run_key_holds_its_section_and_no_other_variants_does(repo_root):
    params = load_params(repo_root / "params.yaml")
    key = run_settings(variant_params(params, "dapo"), "dapo")
    assert key["method"] == params.dapo.model_dump() and key["grpo"]["clip_eps_high"] == 0.28
    longer = load_params(repo_root / "params.yaml", overrides=["dapo.overlong_buffer_tokens=128"])
    assert run_settings(variant_params(longer, "dapo"), "dapo") != key
    assert run_settings(variant_params(longer, "grpo"), "grpo") == run_settings(params, "grpo")
    assert run_settings(params, "grpo")["method"] is None and run_settings(params, "dapo_arbor")["method"] is None


def test_new_grpo_options_enter_the_run_key_only_once_set(repo_root):
    params = load_params(repo_root / "params.yaml")
    grpo = run_settings(params, "dapo")["grpo"]
    assert "tis_cap" not in grpo and "dynamic_sampling_max_rounds" not in grpo
    for option in ("grpo.tis_cap=2.0", "grpo.dynamic_sampling_max_rounds=0"):
        changed = load_params(repo_root / "params.yaml", overrides=[option])
        key, value = option.removeprefix("grpo.").split("=")
        assert run_settings(changed, "dapo")["grpo"][key] == float(value)
