"""The ``dapo`` variant against DAPO's released recipe (Yu et al. 2025, run on verl): the soft overlong punishment
(verl's DAPO reward manager), the dynamic-sampling group filter and its refill loop (verl's recipe/dapo trainer),
and the loss the paper profile's dapo settings give (clip-higher 0.2 / 0.28, dual clip 10, token-mean, no KL)
against the recipe commit's compute_policy_loss, on the same small inputs.

Nothing here imports verl (its package pulls ray): the reference code is transcribed from the fetched source, cited
as ``repo@commit:path:line``. The recipe's own scripts and trainer are at verl@4f80e465 (the commit the DAPO docs'
reproduction table names); the reward manager is read at verl@b178a3cd (the revision the rest of the suite uses).

    .venv/bin/python -m pytest -q tests/conformance/test_dapo.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from components.params_load import load_params
from components.rewards.overlong import overlong_penalty
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.grpo.advantages import group_advantages
from components.training.grpo.episodes import Episode, StepContext
from components.training.grpo.trainer import GRPOTrainer
from components.training.losses import policy_loss
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.variants import drop_homogeneous_groups, variant_params

RECIPE = "volcengine/verl@4f80e465"
MANAGER = "volcengine/verl@b178a3cd:verl/workers/reward_manager/dapo.py"
TRAINER = f"{RECIPE}:recipe/dapo/src/dapo_ray_trainer.py"
SCRIPT = f"{RECIPE}:recipe/dapo/run_dapo_qwen2.5_32b.sh"


# --- the reference, re-derived ------------------------------------------------------------------------------

def verl_overlong_reward(valid_response_length: int, max_resp_len: int, overlong_buffer_len: int,
                         overlong_penalty_factor: float) -> float:
    """dapo.py:116-122 (DAPORewardManager.__call__, overlong_buffer_cfg.enable)."""
    expected_len = max_resp_len - overlong_buffer_len  # :118
    exceed_len = valid_response_length - expected_len  # :119
    return min(-exceed_len / overlong_buffer_len * overlong_penalty_factor, 0)  # :121


def verl_kept_trajectories(uids: list[int], metric_vals: list[float]) -> list[int]:
    """dapo_ray_trainer.py:187-205: a prompt's trajectories are kept when their metric's std is above 0 (or the
    prompt has one trajectory); the indices of the kept trajectories."""
    prompt_uid2metric_vals: dict[int, list[float]] = {}
    for uid, metric_val in zip(uids, metric_vals):  # :188-190
        prompt_uid2metric_vals.setdefault(uid, []).append(metric_val)
    prompt_uid2metric_std = {uid: np.std(vals) for uid, vals in prompt_uid2metric_vals.items()}  # :192-194
    kept_prompt_uids = [uid for uid, std in prompt_uid2metric_std.items()
                        if std > 0 or len(prompt_uid2metric_vals[uid]) == 1]  # :196-199
    return [idx for idx, uid in enumerate(uids) if uid in kept_prompt_uids]  # :202-205


def verl_filled_batch(signal: list[bool], train_prompt_bsz: int, gen_prompt_bsz: int,
                      max_num_gen_batches: int) -> tuple[list[int], int]:
    """dapo_ray_trainer.py:89-227: generation batches of ``gen_prompt_bsz`` prompts in data order, each filtered
    (:196-207), until ``train_prompt_bsz`` prompts have signal (:213-219), then the batch cut to that size
    (:226-227). Returns the kept prompts and how many prompts the step consumed; raises past the bound (:220-223)."""
    batch: list[int] = []
    num_prompt_in_batch = num_gen_batches = cursor = 0
    while True:
        prompts = list(range(cursor, cursor + gen_prompt_bsz))  # :90 the dataloader's next batch
        cursor += gen_prompt_bsz
        num_gen_batches += 1  # :94
        kept = [p for p in prompts if signal[p]]
        num_prompt_in_batch += len(kept)  # :200
        batch += kept  # :208-211
        if num_prompt_in_batch < train_prompt_bsz:  # :214
            if max_num_gen_batches <= 0 or num_gen_batches < max_num_gen_batches:  # :217
                continue
            raise ValueError(f"{num_gen_batches=} >= {max_num_gen_batches=}")  # :221-223
        return batch[:train_prompt_bsz], cursor  # :226-227


def verl_dapo_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                          clip_ratio_c):
    """verl@4f80e465:verl/trainer/ppo/core_algos.py:297-362 (compute_policy_loss) with loss_agg_mode token-mean
    (agg_loss :283-284, masked_mean verl/utils/torch_functional.py:118-120)."""
    negative_approx_kl = log_prob - old_log_prob  # :339
    ratio = torch.exp(negative_approx_kl)  # :340
    pg_losses1 = -advantages * ratio  # :343
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)  # :348-349
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # :350-351
    pg_losses3 = -advantages * clip_ratio_c  # :354
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)  # :355
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)  # :359
    return (pg_losses * response_mask).sum() / (response_mask.sum() + 1e-8)  # :360 -> :284 -> :120


# --- the checks -----------------------------------------------------------------------------------------------

def test_overlong_shaping_is_verls_dapo_reward_manager(conformance, repo_root):
    paper = variant_params(load_params(repo_root / "params.yaml", "paper"), "dapo").dapo
    # the recipe's numbers (run_dapo_qwen2.5_32b.sh:18-21): max_response_length 20480, buffer 4096, factor 1.0
    assert (paper.overlong_buffer_tokens, paper.overlong_penalty_factor) == (4096, 1.0)
    for max_len, buffer, factor in ((20480, 4096, 1.0), (1536, 256, 1.0), (50, 7, 0.5)):
        lengths = range(0, max_len + 1, max(max_len // 400, 1))
        ours = [overlong_penalty(n, max_len, buffer, factor) for n in lengths]
        theirs = [verl_overlong_reward(n, max_len, buffer, factor) for n in lengths]
        conformance.check(f"DAPO overlong reward shaping (L_max {max_len}, L_cache {buffer}, factor {factor})",
                          f"{MANAGER}:116-122", ours, theirs, tol=1e-12,
                          note=f"lengths 0..L_max; the recipe's values: {SCRIPT}:18-21")
    # past L_max (verl never sees one: a response stops at max_response_length) Eq. 13 gives -1, verl's line
    # extrapolated keeps falling; an agent's episode can pass a set max_response_tokens
    beyond = [20480 + 1024, 20480 + 4096]
    conformance.differs("DAPO overlong shaping past L_max", f"{MANAGER}:121 extrapolated",
                        [overlong_penalty(n, 20480, 4096) for n in beyond],
                        [verl_overlong_reward(n, 20480, 4096, 1.0) for n in beyond], at_least=0.25,
                        note="DAPO Eq. 13's -1 beyond L_max; verl cuts responses there")


def test_the_group_filter_is_verls_dynamic_sampling_filter(conformance):
    rng = np.random.default_rng(0)
    groups, size = 12, 4
    uids = [g for g in range(groups) for _ in range(size)]
    # accuracies, many groups all-0 or all-1, some with ties inside
    values = [float(rng.integers(0, 2)) if g % 3 else float(g % 2) for g in uids]
    episodes = [Episode(prompt=None, group=g, rows=[]) for g in uids]
    out = drop_homogeneous_groups(lambda eps, ctx: values)(episodes, StepContext(step=1, groups=uids))
    ours = [float(s is not None) for s in out.scores]
    kept = verl_kept_trajectories(uids, values)
    theirs = [float(i in kept) for i in range(len(uids))]
    assert 0 < sum(theirs) < len(theirs)  # both kinds of group are in the case
    conformance.check("DAPO dynamic-sampling group filter", f"{TRAINER}:187-205", ours, theirs, tol=0.0,
                      note=f"{groups} groups of {size}; a one-trajectory group (verl keeps it) has no GRPO signal")


def test_the_refill_keeps_the_groups_verls_loop_keeps(conformance, repo_root):
    """The trainer's refill against verl's generation loop: the same prompts, in data order, end up in the step.
    verl generates 3x the batch a round and cuts the excess (the consumed prompts differ); a step that reaches the
    bound trains on what it has, where verl raises."""
    torch.set_num_threads(1)
    signal = [False, True, False, False, True, True, False, True, True, True]  # prompt i's group varies
    tok = CharTokenizer("abcdefghijklmn")
    prompts = [tok.decode([i % 10 + 2, (i + 1) % 10 + 2]) for i in range(len(signal))]
    index = {p: i for i, p in enumerate(prompts)}
    trained: list[int] = []

    def reward(episodes, ctx):  # one group per prompt: [1, 0] when it has signal, [1, 1] when not
        return [float(k % 2 == 0 or not signal[index[e.prompt]]) for k, e in enumerate(episodes)]

    def advantages(episodes, scores, ctx):
        trained.extend(dict.fromkeys(index[e.prompt] for e in episodes))
        return group_advantages(scores, [e.group for e in episodes])

    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(tok.vocab_size, seed=0), lora=LoRASettings(r=2, alpha=4))
    dapo = load_params(repo_root / "params.yaml").dapo
    config = GRPOParams(group_size=2, prompts_per_step=3, lr=1e-3, kl_coef=0.0, shuffle=False,
                        dynamic_sampling_max_rounds=dapo.max_num_gen_batches - 1)
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tok), drop_homogeneous_groups(reward), prompts, config,
                          advantage_fn=advantages, sampling=SamplingParams(max_new_tokens=2, temperature=1.0))
    trainer.step()
    theirs, consumed = verl_filled_batch(signal, train_prompt_bsz=3, gen_prompt_bsz=3 * 3,
                                         max_num_gen_batches=dapo.max_num_gen_batches)  # gen_prompt_bsz: script :29
    conformance.check("DAPO dynamic-sampling refill (groups kept in a step)", f"{TRAINER}:89-227",
                      sorted(trained), theirs, tol=0.0, note="prompts in data order; 3 groups a step")
    conformance.differs("DAPO refill: prompts a step consumes", f"{TRAINER}:90-94 with {SCRIPT}:29 (3x the batch)",
                        [trainer.sampler.cursor], [consumed], at_least=1,
                        note="each refill draws only the missing groups' prompts")


@pytest.mark.parametrize("profile", ["paper", "embedded"])
def test_the_dapo_loss_is_the_recipes(conformance, repo_root, profile):
    config = variant_params(load_params(repo_root / "params.yaml", profile), "dapo").grpo
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 7, generator=g, dtype=torch.float64) * 3
    new = old + torch.randn(4, 7, generator=g, dtype=torch.float64) * 0.6  # ratios well past 1.28 and 0.8
    new[0, 0] = old[0, 0] + 2.5  # a ratio past the dual clip's 10 with a negative advantage below
    adv = torch.randn(4, 7, generator=g, dtype=torch.float64)
    adv[0, 0] = -1.0
    mask = (torch.rand(4, 7, generator=g) > 0.2).to(torch.float64)
    mask[0, 0] = 1.0
    ours, _ = policy_loss(new, old, adv, mask, None, clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high,
                          kl_coef=config.kl_coef, agg=config.loss_agg, dual_clip_c=config.dual_clip_c)
    theirs = verl_dapo_policy_loss(old, new, adv, mask, 0.2, 0.28, 10.0)  # script :14-15, :78; no KL loss :11-12
    conformance.check(f"DAPO objective ({profile} profile's dapo)", f"{RECIPE}:verl/trainer/ppo/core_algos.py:297-362",
                      ours, theirs, tol=1e-9, note="clip 0.2/0.28, dual clip 10, token-mean, kl_coef 0 "
                      "(verl's masked_mean adds 1e-8 to the token count)")
    symmetric = verl_dapo_policy_loss(old, new, adv, mask, 0.2, 0.2, 10.0)
    conformance.differs("DAPO clip-higher against a symmetric 0.2 clip", "the same loss at clip_ratio_high 0.2",
                        ours, symmetric, at_least=1e-4)
