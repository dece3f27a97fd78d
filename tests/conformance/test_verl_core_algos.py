"""The shared GRPO math against volcengine/verl at b178a3cd: clipped surrogate with low/high epsilons, dual clip,
k3 KL in the loss and its clamp, token-level truncated importance sampling, the three loss aggregations,
micro-batch splitting, GRPO group advantages (sample std) and Dr.GRPO, on the same small float64 inputs.

verl is on the registry (0.9.1), but ``import verl.trainer.ppo.core_algos`` pulls ``verl.protocol``, which
imports ray (not installed here, and heavy): the reference functions below are therefore re-derived from the
fetched source, transcribed line for line and cited as ``repo@commit:path:line``; nothing here imports verl.

    .venv/bin/python -m pytest -q tests/conformance/test_verl_core_algos.py
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from components.training.grpo.advantages import broadcast_sequence_advantages, group_advantages
from components.training.losses import aggregate, clipped_surrogate, kl_k3, policy_loss

VERL = "volcengine/verl@b178a3cd"
CORE = f"{VERL}:verl/trainer/ppo/core_algos.py"


# --- the reference, re-derived ------------------------------------------------------------------------------

def verl_masked_sum(values, mask, axis=None):
    """verl@b178a3cd:verl/utils/torch_functional.py:283-284."""
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    """core_algos.py:1025-1082 (agg_loss; the seq-mean-token-sum-norm mode is not ours)."""
    if loss_agg_mode == "token-mean":  # :1055-1058
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "seq-mean-token-sum":  # :1059-1064
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    elif loss_agg_mode == "seq-mean-token-mean":  # :1065-1071
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    else:
        raise ValueError(loss_agg_mode)
    return loss


def verl_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", *,
                             clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, rollout_is_weights=None,
                             **global_batch_info):
    """core_algos.py:1160-1251 (compute_policy_loss_vanilla): the per-token losses and their aggregate."""
    assert clip_ratio_c > 1.0  # :1205
    negative_approx_kl = log_prob - old_log_prob  # :1210
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)  # :1212
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio  # :1216
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)  # :1221
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # :1224
    pg_losses3 = -advantages * clip_ratio_c  # :1229
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)  # :1230
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)  # :1235
    if rollout_is_weights is not None:  # :1238-1239
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = verl_agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info)  # :1241
    return pg_losses, pg_loss


def verl_clipfrac_lower(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
                        clip_ratio_c):
    """core_algos.py:1231-1233: the fraction of tokens whose loss the dual clip capped (verl_F.masked_mean,
    verl@b178a3cd:verl/utils/torch_functional.py:300-301)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    clip_pg_losses1 = torch.maximum(-advantages * ratio,
                                    -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
    pg_losses3 = -advantages * clip_ratio_c
    lower = torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float()
    return verl_masked_sum(lower, response_mask) / (response_mask.sum() + 1e-8)


def verl_low_var_kl(logprob, ref_logprob):
    """core_algos.py:1890-1896 (kl_penalty_forward, ``low_var_kl`` / ``k3``)."""
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


def verl_ppo_loss(old, logp, adv, mask, ref, *, loss_agg_mode, kl_loss_coef, rollout_is_weights=None,
                  clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, **global_batch_info):
    """The actor's loss with ``use_kl_loss`` (KL in the loss, not the reward):
    verl@b178a3cd:verl/workers/utils/losses.py:134-150 (policy loss) and :162-170 (``kl_penalty``, ``agg_loss``,
    ``policy_loss += kl_loss * kl_loss_coef``); verl/workers/actor/dp_actor.py:640-648 is the same sum."""
    _, pg_loss = verl_policy_loss_vanilla(old, logp, adv, mask, loss_agg_mode, clip_ratio_low=clip_ratio_low,
                                          clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                                          rollout_is_weights=rollout_is_weights, **global_batch_info)
    kl_loss = verl_agg_loss(verl_low_var_kl(logp, ref), mask, loss_agg_mode, **global_batch_info)
    return pg_loss + kl_loss * kl_loss_coef


def verl_token_tis_weights(old_log_prob, rollout_log_prob, response_mask, rollout_is_threshold=2.0):
    """verl@b178a3cd:verl/trainer/ppo/rollout_corr_helper.py:779 (log_ratio = old - rollout) and :531-566
    (compute_rollout_correction_weights, ``rollout_is="token"``: exp of the clamped log ratio, masked, truncated
    at the threshold, detached)."""
    log_ratio = old_log_prob - rollout_log_prob
    w = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    w = w * response_mask
    return w.clamp(max=rollout_is_threshold).detach()


def verl_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                norm_adv_by_std_in_grpo=True):
    """core_algos.py:267-331 (compute_grpo_outcome_advantage): torch.std is Bessel-corrected (the sample std)."""
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:  # :314-316
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            else:  # :317-320
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:  # :324-327
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


# --- shared inputs ----------------------------------------------------------------------------------------

AGGS = [("token_mean", "token-mean"), ("seq_mean_token_mean", "seq-mean-token-mean"),
        ("seq_mean_token_sum", "seq-mean-token-sum")]


def batch(ratio_spread: float = 0.35, seed: int = 0):
    """Six rows of seven positions: position 0 the prompt, rows of 2-6 response tokens, the last row empty."""
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 2, 5, 3, 4, 0]
    mask = torch.zeros(6, 7, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, 1 : 1 + n] = True
    old = -1.5 + 0.5 * torch.randn(6, 7, generator=g, dtype=torch.float64)
    logp = old + ratio_spread * torch.randn(6, 7, generator=g, dtype=torch.float64)
    adv = torch.randn(6, 7, generator=g, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(6, 7, generator=g, dtype=torch.float64)
    rollout = old + 0.6 * torch.randn(6, 7, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, ref, rollout


def test_clipped_surrogate_with_low_and_high_epsilons(conformance):
    logp, old, adv, mask, _, _ = batch()
    assert float(torch.exp(logp - old)[mask].max()) < 3.0  # verl's dual clip (always on) cannot bind here
    ours, _, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    theirs, _ = verl_policy_loss_vanilla(old, logp, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    clipped = ((adv > 0) & (torch.exp(logp - old) > 1.28)) | ((adv < 0) & (torch.exp(logp - old) < 0.8))
    assert bool(clipped[mask].any())  # both sides of the clip are exercised
    conformance.check("clipped surrogate, eps 0.2 / 0.28 (per token)", f"{CORE}:1160 compute_policy_loss_vanilla",
                      ours[mask], theirs[mask], tol=1e-12)


def test_dual_clip(conformance):
    logp, old, adv, mask, _, _ = batch(ratio_spread=1.2)  # ratios up to ~10: the cap -3A binds on some A < 0
    binds = (adv < 0) & (torch.exp(logp - old) > 3.0) & mask
    assert int(binds.sum()) >= 2
    theirs, _ = verl_policy_loss_vanilla(old, logp, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    ours, _, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28, dual_clip_c=3.0)
    conformance.check("dual clip c=3 (grpo.dual_clip_c: 3.0; per token)", f"{CORE}:1229-1235 clip_ratio_c",
                      ours[mask], theirs[mask], tol=1e-12)
    _, m = policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28, dual_clip_c=3.0)
    conformance.check("dual-clip fraction metric", f"{CORE}:1231-1233 pg_clipfrac_lower", m.dual_clip_fraction,
                      verl_clipfrac_lower(old, logp, adv, mask.double(), 0.2, 0.28, 3.0), tol=1e-8,
                      note="verl's masked_mean divides by (count + 1e-8)")
    off, _, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    conformance.differs("dual clip off (grpo.dual_clip_c: null, the embedded default)",
                        f"{CORE}:1197 clip_ratio_c default 3.0", off[mask], theirs[mask], at_least=0.5)


def test_k3_kl(conformance):
    logp, _, _, mask, ref, _ = batch()
    assert float((ref - logp).abs().max()) < 2.5  # k3 < 10: verl's clamp is idle
    conformance.check("k3 KL (per token)", f"{CORE}:1890-1896 kl_penalty_forward low_var_kl",
                      kl_k3(logp, ref)[mask], verl_low_var_kl(logp, ref)[mask], tol=1e-12)


def test_k3_clamp(conformance):
    logp = torch.zeros(1, 9, dtype=torch.float64)
    ref = torch.tensor([[-30.0, -21.0, -12.0, -3.0, 0.0, 1.0, 2.5, 3.0, 25.0]], dtype=torch.float64)
    theirs = verl_low_var_kl(logp, ref)
    conformance.check("k3 KL clamp 10 (grpo.kl_clamp: 10.0)", f"{CORE}:1893,1896 low_var_kl clamps",
                      kl_k3(logp, ref, clamp=10.0), theirs, tol=1e-12)
    conformance.differs("k3 KL unclamped (grpo.kl_clamp: null, the embedded default)", f"{CORE}:1896",
                        kl_k3(logp, ref), theirs, at_least=1.0)


@pytest.mark.parametrize(("ours_agg", "verl_agg"), AGGS)
def test_kl_in_the_loss(conformance, ours_agg, verl_agg):
    logp, old, adv, mask, ref, _ = batch(ratio_spread=1.2)
    loss, _ = policy_loss(logp, old, adv, mask, ref, clip_eps=0.2, clip_eps_high=0.28, kl_coef=0.005,
                          agg=ours_agg, dual_clip_c=3.0, kl_clamp=10.0)
    theirs = verl_ppo_loss(old, logp, adv, mask.double(), ref, loss_agg_mode=verl_agg, kl_loss_coef=0.005,
                           clip_ratio_low=0.2, clip_ratio_high=0.28)
    conformance.check(f"pg + k3 KL in the loss, {ours_agg}", f"{VERL}:verl/workers/utils/losses.py:162-170 use_kl_loss",
                      loss, theirs, tol=1e-9 if ours_agg == "seq_mean_token_mean" else 1e-12,
                      note="verl's seq-mean-token-mean divides by (count + 1e-8)")


def test_token_level_truncated_importance_sampling(conformance):
    logp, old, adv, mask, _, rollout = batch()
    weights = verl_token_tis_weights(old, rollout, mask.double(), 2.0)
    assert bool((weights[mask] >= 2.0).any()) and bool((weights[mask] < 2.0).any())  # the cap binds, not everywhere
    ours, _ = policy_loss(logp, old, adv, mask, clip_eps=0.2, rollout_logp=rollout, tis_cap=2.0)
    _, theirs = verl_policy_loss_vanilla(old, logp, adv, mask.double(), rollout_is_weights=weights)
    conformance.check("token-level TIS, cap 2 (grpo.tis_cap)",
                      f"{VERL}:verl/trainer/ppo/rollout_corr_helper.py:531-566 rollout_is=token", ours, theirs,
                      tol=1e-12)


@pytest.mark.parametrize(("ours_agg", "verl_agg"), AGGS)
def test_aggregation(conformance, ours_agg, verl_agg):
    _, _, values, mask, _, _ = batch()
    values = values.clone()
    values[~mask] = 1e3  # what masked positions hold never counts
    ours = aggregate(values, mask, ours_agg)
    theirs = verl_agg_loss(values, mask.double(), verl_agg)
    conformance.check(f"aggregation {ours_agg}", f"{CORE}:1055-1071 agg_loss {verl_agg}", ours, theirs,
                      tol=1e-9 if ours_agg == "seq_mean_token_mean" else 1e-12)


@pytest.mark.parametrize(("ours_agg", "verl_agg"), AGGS)
def test_micro_batches_accumulate_the_whole_batch_gradient(conformance, ours_agg, verl_agg):
    """Micro-batches of rows [0:2], [2:3], [3:6], each divided by the mini-batch's token and sequence counts
    (verl's ``global_batch_info``: batch_num_tokens, global_batch_size; verl/workers/utils/losses.py:103-105),
    give the gradient of the whole batch."""
    logp, old, adv, mask, ref, _ = batch(ratio_spread=0.8)
    num_tokens, num_seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    kw = {"clip_eps": 0.2, "clip_eps_high": 0.28, "kl_coef": 0.01, "agg": ours_agg, "dual_clip_c": 3.0,
          "kl_clamp": 10.0}

    ours_lp = logp.clone().requires_grad_(True)
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        micro, _ = policy_loss(ours_lp[rows], old[rows], adv[rows], mask[rows], ref[rows], num_tokens=num_tokens,
                               num_seqs=num_seqs, **kw)
        micro.backward()
    verl_lp = logp.clone().requires_grad_(True)
    verl_ppo_loss(old, verl_lp, adv, mask.double(), ref, loss_agg_mode=verl_agg, kl_loss_coef=0.01,
                  clip_ratio_low=0.2, clip_ratio_high=0.28).backward()
    conformance.check(f"micro-batch gradient accumulation, {ours_agg}",
                      f"{CORE}:1025 agg_loss over the whole batch (its gradient)", ours_lp.grad, verl_lp.grad,
                      tol=1e-9 if ours_agg == "seq_mean_token_mean" else 1e-12)


REWARDS = [0.1, 0.9, 0.4, 0.4, 1.0, 0.0, 0.0, 0.3, 0.7, 0.2, 0.65, 0.05, 0.5, 0.9, 0.8, 0.75]
GROUPS = [0, 1, 0, 1, 0, 1, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2]  # two interleaved groups of 4, one of 8


def advantage_inputs():
    mask = torch.zeros(len(REWARDS), 5, dtype=torch.bool)
    for b in range(len(REWARDS)):
        mask[b, 1 : 2 + b % 4] = True
    token_rewards = torch.zeros(len(REWARDS), 5, dtype=torch.float64)
    token_rewards[:, -1] = torch.tensor(REWARDS, dtype=torch.float64)  # verl's outcome reward sits on one token
    return mask, token_rewards


def test_group_advantages_with_the_sample_std(conformance):
    mask, token_rewards = advantage_inputs()
    theirs, _ = verl_grpo_outcome_advantage(token_rewards, mask.double(), np.array(GROUPS), epsilon=1e-6)
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    ours = broadcast_sequence_advantages(group_advantages(rewards, GROUPS, eps=1e-6, unbiased_std=True), mask)
    conformance.check("group advantages, sample std (grpo.adv_std: sample)", f"{CORE}:267 compute_grpo_outcome_advantage",
                      ours, theirs, tol=1e-12)
    population = broadcast_sequence_advantages(group_advantages(rewards, GROUPS, eps=1e-6), mask)
    conformance.differs("group advantages, population std (grpo.adv_std: population, the embedded default)",
                        f"{CORE}:320 torch.std", population, theirs, at_least=0.05,
                        note="x sqrt(G/(G-1)): 1.155 at G=4, 1.069 at G=8")
    ratio = population[mask & (theirs.abs() > 1e-3)] / theirs[mask & (theirs.abs() > 1e-3)]
    assert sorted({round(float(r), 3) for r in ratio}) == [round((8 / 7) ** 0.5, 3), round((4 / 3) ** 0.5, 3)]


def test_dr_grpo_leaves_out_the_std(conformance):
    mask, token_rewards = advantage_inputs()
    theirs, _ = verl_grpo_outcome_advantage(token_rewards, mask.double(), np.array(GROUPS),
                                            norm_adv_by_std_in_grpo=False)
    ours = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), GROUPS, normalize_std=False)
    conformance.check("Dr.GRPO advantages (grpo.std_normalize: false)", f"{CORE}:324-327 norm_adv_by_std_in_grpo",
                      broadcast_sequence_advantages(ours, mask), theirs, tol=1e-12)
