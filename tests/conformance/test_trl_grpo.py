"""The shared GRPO loss and advantages against huggingface/trl's GRPOTrainer, on the same small float64 inputs.

The loss is TRL's own code: ``GRPOTrainer._compute_loss`` is imported from the installed trl (1.16.0, the
``dev`` extra) and run on a stand-in for the trainer that hands it our log-probabilities (the model forward is
the one thing stubbed), for the loss types ``grpo`` (seq-mean-token-mean), ``bnpo`` (token-mean) and ``dapo``
(token-mean over the generation batch's token count: micro-batches accumulate). For those loss types its
``_compute_loss`` is the code of huggingface/trl@f2cd5771 (the commit issue 71 read), except the ``dapo``
normalizer's rescaling by ``gradient_accumulation_steps / steps_per_generation`` added since, which is 1 here.
TRL computes its advantages and its vLLM importance weights inside ``_generate_and_score_completions`` (a
rollout, not callable alone): those are re-derived from trl@f2cd5771:trl/trainer/grpo_trainer.py, with TRL's
own ``nanstd`` imported for the std. TRL's ``grpo`` mean runs over every row, so every row here has tokens.

    .venv/bin/python -m pytest -q tests/conformance/test_trl_grpo.py
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from components.training.grpo.advantages import broadcast_sequence_advantages, group_advantages
from components.training.losses import policy_loss

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")

TRL = "huggingface/trl@f2cd5771:trl/trainer/grpo_trainer.py"


class _Accelerator:
    """One process: gathers and reductions are the identity."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_compute_loss(logp, old, adv, mask, ref=None, *, loss_type, beta=0.0, epsilon=0.2, epsilon_high=None,
                     importance_sampling_ratio=None, num_items_in_batch=None, accumulation_steps=1):
    """TRL's ``GRPOTrainer._compute_loss`` on ``logp`` (the log-probs its model forward would give) and its
    metrics; ``importance_sampling_ratio`` turns on its vLLM importance-sampling correction."""
    b, t = mask.shape
    trainer = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        loss_type=loss_type, epsilon_low=epsilon, epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=accumulation_steps),
        use_vllm=importance_sampling_ratio is not None,
        vllm_importance_sampling_correction=importance_sampling_ratio is not None,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=accumulation_steps,
        accelerator=_Accelerator(), _entropy_bonus_enabled=False, aux_loss_enabled=False, max_completion_length=t,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=lambda *a, **kw: (logp, torch.zeros_like(logp), None),
    )
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    if num_items_in_batch is not None:
        inputs["num_items_in_batch"] = torch.tensor(float(num_items_in_batch))
    loss = grpo_trainer.GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def trl_token_truncate_ratio(old, sampling, mask, clip_max):
    """trl@f2cd5771:trl/trainer/grpo_trainer.py:2581 (per-token log-ratio, masked), :2590 (exp), :2597-2601
    (``vllm_importance_sampling_mode="token_truncate"``: clamped to [clip_min, clip_max]; clip_min None)."""
    per_token_logps_diff = (old - sampling) * mask
    return torch.clamp(torch.exp(per_token_logps_diff), min=None, max=clip_max)


def trl_group_advantages(rewards, num_generations, scale_rewards="group"):
    """trl@f2cd5771:trl/trainer/grpo_trainer.py:2685-2707 (``multi_objective_aggregation="sum_then_normalize"``;
    one reward function, so the weighted nansum is the reward): nanmean and TRL's ``nanstd`` (Bessel) per group,
    ``/ (std + 1e-4)`` unless ``scale_rewards="none"``. Before :2730 zeroes a NaN (unscorable) row's advantage."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    std_rewards = trl_utils.nanstd(rewards.view(-1, num_generations), dim=1)
    std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


def batch(ratio_spread: float = 0.35, seed: int = 0):
    """Eight completions of up to six tokens, every one with at least one; one advantage per completion."""
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 2, 5, 3, 4, 1, 6, 3]
    mask = torch.zeros(8, 6, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    old = -1.5 + 0.5 * torch.randn(8, 6, generator=g, dtype=torch.float64)
    logp = old + ratio_spread * torch.randn(8, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(8, generator=g, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(8, 6, generator=g, dtype=torch.float64)
    sampling = old + 0.6 * torch.randn(8, 6, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, ref, sampling


LOSS_TYPES = [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean")]


@pytest.mark.parametrize(("loss_type", "agg"), LOSS_TYPES)
def test_loss_and_gradient_with_k3_kl(conformance, loss_type, agg):
    logp, old, adv, mask, ref, _ = batch(ratio_spread=0.6)
    ratio = torch.exp(logp - old)
    high, low = (adv[:, None] > 0) & (ratio > 1.28) & mask, (adv[:, None] < 0) & (ratio < 0.8) & mask
    assert bool(high.any()) and bool(low.any())  # both sides of the clip bind
    ours_lp, trl_lp = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours, m = policy_loss(ours_lp, old, broadcast_sequence_advantages(adv, mask), mask, ref, clip_eps=0.2,
                          clip_eps_high=0.28, kl_coef=0.04, agg=agg)
    theirs, metrics = trl_compute_loss(trl_lp, old, adv, mask, ref, loss_type=loss_type, beta=0.04, epsilon=0.2,
                                       epsilon_high=0.28)
    conformance.check(f"clipped surrogate 0.2 / 0.28 + k3 KL in the loss, {agg}",
                      f"{TRL}:3084-3125 _compute_loss loss_type={loss_type} (trl 1.16.0 imported)", ours, theirs,
                      tol=1e-12)
    ours.backward()
    theirs.backward()
    conformance.check(f"its gradient, {agg}", f"{TRL}:2991 _compute_loss, autograd", ours_lp.grad, trl_lp.grad,
                      tol=1e-12)
    conformance.check(f"k3 KL metric (token mean), {loss_type}", f"{TRL}:3071-3073 per_token_kl", m.kl,
                      metrics["kl"], tol=1e-12)
    conformance.check(f"clip fraction metric, {loss_type}", f"{TRL}:3244-3246 clip_ratio/region_mean", m.clip_fraction,
                      metrics["clip_ratio/region_mean"], tol=1e-12)


def test_token_level_truncated_importance_sampling(conformance):
    logp, old, adv, mask, _, sampling = batch()
    weights = trl_token_truncate_ratio(old, sampling, mask.double(), 2.0)
    assert bool((weights[mask] >= 2.0).any()) and bool((weights[mask] < 2.0).any())
    ours, _ = policy_loss(logp, old, broadcast_sequence_advantages(adv, mask), mask, clip_eps=0.2,
                          rollout_logp=sampling, tis_cap=2.0)
    theirs, _ = trl_compute_loss(logp, old, adv, mask, loss_type="bnpo", importance_sampling_ratio=weights)
    conformance.check("token-level TIS, cap 2 (grpo.tis_cap)",
                      f"{TRL}:2581-2601 token_truncate, :3118 per_token_loss * ratio", ours, theirs, tol=1e-12)


def test_micro_batches_accumulate_the_whole_batch_gradient(conformance):
    """TRL's ``dapo`` loss divides every micro-batch by the generation batch's token count
    (``num_items_in_batch``), so its micro-batches sum to the token mean of the whole batch, as ours do with
    ``num_tokens``."""
    logp, old, adv, mask, ref, _ = batch(ratio_spread=0.6)
    micros = (slice(0, 3), slice(3, 4), slice(4, 8))
    num_tokens = int(mask.sum())
    token_adv = broadcast_sequence_advantages(adv, mask)
    ours_lp, trl_lp = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    for rows in micros:
        policy_loss(ours_lp[rows], old[rows], token_adv[rows], mask[rows], ref[rows], clip_eps=0.2,
                    clip_eps_high=0.28, kl_coef=0.04, num_tokens=num_tokens)[0].backward()
        trl_compute_loss(trl_lp[rows], old[rows], adv[rows], mask[rows], ref[rows], loss_type="dapo", beta=0.04,
                         epsilon_high=0.28, num_items_in_batch=num_tokens,
                         accumulation_steps=len(micros))[0].backward()
    whole_lp = logp.clone().requires_grad_(True)
    trl_compute_loss(whole_lp, old, adv, mask, ref, loss_type="dapo", beta=0.04, epsilon_high=0.28,
                     num_items_in_batch=num_tokens)[0].backward()
    conformance.check("micro-batch gradient accumulation, token_mean", f"{TRL}:3139-3142 dapo over num_items_in_batch",
                      ours_lp.grad, trl_lp.grad, tol=1e-12)
    conformance.check("micro-batches against the whole batch, token_mean", f"{TRL}:3139-3142 one batch", ours_lp.grad,
                      whole_lp.grad, tol=1e-12)


REWARDS = [0.1, 0.9, 0.4, 0.4, 1.0, 0.0, 0.0, 0.3, 0.7, 0.2, 0.65, 0.05, 0.5, 0.9, 0.8, 0.75]


@pytest.mark.parametrize("group_size", [4, 8])
def test_group_advantages_with_the_sample_std(conformance, group_size):
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    groups = [i // group_size for i in range(len(REWARDS))]
    theirs = trl_group_advantages(rewards, group_size)
    ours = group_advantages(rewards, groups, eps=1e-4, unbiased_std=True)
    conformance.check(f"group advantages, sample std, G={group_size} (grpo.adv_std: sample)",
                      f"{TRL}:2685-2707 scale_rewards=group, trl.trainer.utils.nanstd", ours, theirs, tol=1e-7,
                      note="nanstd's Bessel factor count / (count - 1) divides int tensors: float32")
    population = group_advantages(rewards, groups, eps=1e-4)
    conformance.differs(f"group advantages, population std, G={group_size} (the embedded default)",
                        f"{TRL}:2690 nanstd (Bessel)", population, theirs, at_least=0.02,
                        note=f"x{(group_size / (group_size - 1)) ** 0.5:.3f}")


def test_missing_rewards_leave_the_group_statistics(conformance):
    """A NaN reward (an unscorable completion) takes no part in its group's mean and std, in both. TRL then sets
    its advantage to 0 (:2730) where ours stays NaN and its tokens leave the loss (place_episode_advantages)."""
    rewards = torch.tensor(REWARDS[:8], dtype=torch.float64)
    rewards[[1, 6]] = float("nan")
    theirs = trl_group_advantages(rewards, 4)
    ours = group_advantages(rewards, [0, 0, 0, 0, 1, 1, 1, 1], eps=1e-4, unbiased_std=True)
    conformance.check("group advantages with missing rewards (NaN-aware mean and std)",
                      f"{TRL}:2679-2707 nanmean / nanstd", ours, theirs, tol=1e-12)


def test_dr_grpo_leaves_out_the_std(conformance):
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    theirs = trl_group_advantages(rewards, 8, scale_rewards="none")
    ours = group_advantages(rewards, [i // 8 for i in range(16)], normalize_std=False)
    conformance.check("Dr.GRPO advantages (grpo.std_normalize: false)", f"{TRL}:2706-2707 scale_rewards=none", ours,
                      theirs, tol=1e-12)
