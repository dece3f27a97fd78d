"""Clipped surrogate (with the dual clip), k3 KL (with its clamp), aggregation and masking checked against numbers
computed by hand; the selective log-softmax checked against the full fp32 log-softmax it replaced (values and
gradients); the trainer passing the grpo options on."""

import math

import pytest
import torch

from components.training.losses import (
    aggregate,
    clipped_surrogate,
    kl_k3,
    masked_logprobs,
    policy_loss,
    selective_log_softmax,
    token_logprobs,
)

EPS = 0.2


@pytest.mark.parametrize(
    ("ratio", "adv", "expected_loss", "expected_grad", "clipped"),
    [
        # inside the clip range: loss = -ratio * A, d loss / d logp = -ratio * A
        (1.1, 2.0, -2.2, -2.2, False),
        (0.9, -3.0, 2.7, 2.7, False),
        # A > 0, ratio above 1 + eps: objective capped at 1.2 * A, no gradient
        (1.5, 1.0, -1.2, 0.0, True),
        # A > 0, ratio below 1 - eps: the unclipped term is smaller, gradient flows
        (0.5, 1.0, -0.5, -0.5, False),
        # A < 0, ratio above 1 + eps: unclipped -1.5 is smaller, gradient flows
        (1.5, -1.0, 1.5, 1.5, False),
        # A < 0, ratio below 1 - eps: objective capped at 0.8 * A, no gradient
        (0.5, -1.0, 0.8, 0.0, True),
    ],
)
def test_clipped_surrogate_matches_hand_values(ratio, adv, expected_loss, expected_grad, clipped):
    logp = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, dtype=torch.float64)
    loss, r, was_clipped = clipped_surrogate(logp, old, torch.tensor([adv], dtype=torch.float64), EPS, EPS)
    loss.sum().backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert r.item() == pytest.approx(ratio, abs=1e-12)
    assert logp.grad.item() == pytest.approx(expected_grad, abs=1e-12)
    assert bool(was_clipped.item()) is clipped


def test_asymmetric_clip_high():
    logp = torch.tensor([math.log(1.25)], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    old = torch.zeros(1, dtype=torch.float64)
    assert clipped_surrogate(logp, old, adv, 0.2, 0.28)[0].item() == pytest.approx(-1.25)
    assert clipped_surrogate(logp, old, adv, 0.2, 0.2)[0].item() == pytest.approx(-1.2)


def test_k3_on_known_values():
    # p(token) = 0.5 under the policy, 0.25 under the reference: exp(d) - d - 1 with d = ln 0.5
    got = kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])).item()
    assert got == pytest.approx(0.5 - math.log(0.5) - 1.0, abs=1e-7)  # 0.193147...
    assert got == pytest.approx(0.1931471806, abs=1e-7)
    assert kl_k3(torch.tensor([-1.3]), torch.tensor([-1.3])).item() == 0.0


def test_k3_expectation_is_exact_kl_for_two_outcome_distributions():
    p = [0.5, 0.5]
    q = [0.25, 0.75]
    k3 = kl_k3(
        torch.log(torch.tensor(p, dtype=torch.float64)), torch.log(torch.tensor(q, dtype=torch.float64))
    )
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.1438410362
    assert float((torch.tensor(p, dtype=torch.float64) * k3).sum()) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.1438410362, abs=1e-9)


def _batch():
    ratios = [[1.0, 1.1, 1.5, 0.7], [0.5, 1.0, 1.3, 1.0]]
    advs = [[0.0, 2.0, 1.0, -1.0], [-1.0, 0.5, 0.5, 9.0]]
    mask = [[0, 1, 1, 1], [0, 1, 1, 0]]
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64))
    return logp, torch.zeros_like(logp), torch.tensor(advs, dtype=torch.float64), torch.tensor(mask).bool()


def _hand_token_losses():
    # -min(r*A, clip(r, 0.8, 1.2)*A) for the unmasked tokens of _batch()
    row0 = [-min(1.1 * 2.0, 1.1 * 2.0), -min(1.5 * 1.0, 1.2 * 1.0), -min(0.7 * -1.0, 0.8 * -1.0)]
    row1 = [-min(1.0 * 0.5, 1.0 * 0.5), -min(1.3 * 0.5, 1.2 * 0.5)]
    return row0, row1  # [-2.2, -1.2, 0.8], [-0.5, -0.6]


def test_policy_loss_aggregations_match_hand_values():
    logp, old, adv, mask = _batch()
    row0, row1 = _hand_token_losses()
    assert row0 == pytest.approx([-2.2, -1.2, 0.8]) and row1 == pytest.approx([-0.5, -0.6])
    expected = {
        "token_mean": (sum(row0) + sum(row1)) / 5,
        "seq_mean_token_mean": (sum(row0) / 3 + sum(row1) / 2) / 2,
        "seq_mean_token_sum": (sum(row0) + sum(row1)) / 2,
    }
    for agg, value in expected.items():
        loss, _ = policy_loss(logp, old, adv, mask, clip_eps=EPS, agg=agg)
        assert loss.item() == pytest.approx(value, abs=1e-12), agg
    _, m = policy_loss(logp, old, adv, mask, clip_eps=EPS)
    assert m.num_tokens == 5
    assert m.clip_fraction == pytest.approx(3 / 5)  # r=1.5 and r=1.3 with A>0, r=0.7 with A<0
    assert m.ratio_mean == pytest.approx((1.1 + 1.5 + 0.7 + 1.0 + 1.3) / 5)
    assert (m.ratio_min, m.ratio_max) == pytest.approx((0.7, 1.5))


def test_policy_loss_adds_weighted_k3():
    logp, old, adv, mask = _batch()
    ref = logp + math.log(0.5)  # reference gives half the probability to every token
    loss, m = policy_loss(logp, old, adv, mask, ref, clip_eps=EPS, kl_coef=0.1)
    k3 = 0.5 - math.log(0.5) - 1.0
    pg = (sum(_hand_token_losses()[0]) + sum(_hand_token_losses()[1])) / 5
    assert m.kl == pytest.approx(k3, abs=1e-12)
    assert loss.item() == pytest.approx(pg + 0.1 * k3, abs=1e-12)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logp, old, adv, mask, None, kl_coef=0.1)


def test_masked_positions_never_change_loss_or_gradient():
    logp, old, adv, mask = _batch()
    ref = logp - 0.3

    def run(lp, o, a, r):
        lp = lp.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, o, a, mask, r, clip_eps=EPS, kl_coef=0.05)
        loss.backward()
        return loss.detach(), lp.grad

    base_loss, base_grad = run(logp, old, adv, ref)
    lp2, old2, adv2, ref2 = logp.clone(), old.clone(), adv.clone(), ref.clone()
    masked = ~mask
    lp2[masked] = torch.tensor([float("inf"), -50.0, float("nan")], dtype=torch.float64)
    old2[masked] = 7.0
    adv2[masked] = -123.0
    ref2[masked] = float("nan")
    loss2, grad2 = run(lp2, old2, adv2, ref2)
    assert torch.equal(base_loss, loss2)
    assert torch.equal(base_grad, grad2)
    assert torch.all(grad2[masked] == 0)
    assert torch.all(base_grad[mask] != 0)  # the unmasked positions do carry gradient


def test_micro_batches_with_global_denominators_sum_to_full_loss():
    logp, old, adv, mask = _batch()
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        full, _ = policy_loss(logp, old, adv, mask, agg=agg)
        parts = sum(
            policy_loss(
                logp[i : i + 1],
                old[i : i + 1],
                adv[i : i + 1],
                mask[i : i + 1],
                agg=agg,
                num_tokens=5,
                num_seqs=2,
            )[0]
            for i in range(2)
        )
        assert parts.item() == pytest.approx(full.item(), abs=1e-12), agg


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "sum_everything")


def test_token_logprobs_alignment():
    # vocab 3; logits at position t predict token t+1
    logits = torch.tensor([[[0.0, 0.0, 0.0], [math.log(1.0), math.log(3.0), 0.0], [9.0, 9.0, 9.0]]])
    ids = torch.tensor([[2, 1, 0]])
    lp = token_logprobs(logits, ids)
    assert lp[0, 0].item() == 0.0
    assert lp[0, 1].item() == pytest.approx(math.log(1 / 3))
    assert lp[0, 2].item() == pytest.approx(math.log(1 / 5))
    lp_t = token_logprobs(logits, ids, temperature=2.0)
    assert lp_t[0, 2].item() == pytest.approx(math.log(1 / (1 + math.sqrt(3) + 1)))


def full_log_softmax_token_logprobs(logits, input_ids, temperature=1.0):
    """The implementation before the selective log-softmax: an fp32 log-softmax over the whole block."""
    scaled = logits[:, :-1]
    scaled = scaled.to(torch.promote_types(scaled.dtype, torch.float32))
    if temperature != 1.0:
        scaled = scaled / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(scaled, -1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def _random_logits(dtype, shape=(3, 9, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, generator=g) * 4).to(dtype)
    ids = torch.randint(0, shape[-1], shape[:-1], generator=g)
    weights = torch.randn(shape[:-1], generator=g)  # a non-uniform upstream gradient
    return logits, ids, weights


def _value_and_grad(fn, logits, *args):
    x = logits.clone().requires_grad_(True)
    out = fn(x, *args)
    return out, x


@pytest.mark.parametrize(
    ("dtype", "temperature"),
    [(torch.float32, 1.0), (torch.float32, 0.7), (torch.bfloat16, 1.0), (torch.bfloat16, 1.3)],
)
def test_token_logprobs_equal_the_full_log_softmax_values_and_gradients(dtype, temperature):
    logits, ids, weights = _random_logits(dtype)
    old, x_old = _value_and_grad(full_log_softmax_token_logprobs, logits, ids, temperature)
    new, x_new = _value_and_grad(token_logprobs, logits, ids, temperature)
    assert new.dtype == torch.float32 and new.shape == ids.shape
    assert torch.allclose(new, old, atol=1e-5, rtol=0)
    (old * weights).sum().backward()
    (new * weights).sum().backward()
    assert x_new.grad.dtype == dtype
    # bf16 gradients are fp32 gradients rounded once: they may differ by one bf16 ulp at most
    tol = {"atol": 1e-6, "rtol": 0 if dtype == torch.float32 else 2**-7}
    assert torch.allclose(x_new.grad.float(), x_old.grad.float(), **tol)
    assert x_new.grad.abs().sum() > 1.0


@pytest.mark.parametrize("chunk_rows", [1, 2, 5, None])
def test_selective_log_softmax_chunks_give_the_same_result(chunk_rows):
    logits, ids, weights = _random_logits(torch.float32, shape=(2, 7, 30), seed=1)
    ref, x_ref = _value_and_grad(
        lambda x: torch.log_softmax(x / 0.8, dim=-1).gather(-1, ids[..., None])[..., 0], logits
    )
    out, x = _value_and_grad(lambda x: selective_log_softmax(x, ids, 0.8, chunk_rows=chunk_rows), logits)
    assert torch.allclose(out, ref, atol=1e-6)
    (ref * weights).sum().backward()
    (out * weights).sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-6)
    flat = selective_log_softmax(logits[0], ids[0], 0.8, chunk_rows=chunk_rows)  # [N, V] input
    assert torch.allclose(flat, ref[0].detach(), atol=1e-6)


def test_selective_log_softmax_gradcheck_in_fp64():
    logits, ids, _ = _random_logits(torch.float64, shape=(2, 4, 6), seed=2)
    x = logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: selective_log_softmax(t, ids, 0.6, chunk_rows=3), (x,))
    assert torch.autograd.gradcheck(lambda t: selective_log_softmax(t[:, :-1], ids[:, 1:], 1.0), (x,))


def test_bf16_logits_keep_no_fp32_copy_for_backward():
    logits, ids, _ = _random_logits(torch.bfloat16, shape=(2, 16, 512), seed=3)
    full_block = 2 * 15 * 512

    def saved_fp32_elements(fn):
        saved = []
        x = logits.clone().requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            fn(x, ids).sum()
        return sum(t.numel() for t in saved if t.dtype == torch.float32)

    assert saved_fp32_elements(full_log_softmax_token_logprobs) >= full_block  # the old graph holds one
    assert saved_fp32_elements(token_logprobs) < full_block / 100  # only the per-row log-sum-exp


def test_masked_logprobs_are_the_full_values_at_the_mask_and_zero_elsewhere():
    logits, ids, _ = _random_logits(torch.float32, shape=(2, 8, 20), seed=4)
    full = token_logprobs(logits, ids, 0.9)
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    mask[0, [2, 3, 6]] = True  # two turns of one row, an observation between them
    mask[1, 5] = True
    keep = torch.zeros_like(mask)
    keep[:, :-1] = mask[:, 1:]  # the logits at t-1 predict the token at t
    part = masked_logprobs(logits[keep], ids, mask, 0.9)
    assert part.shape == ids.shape
    assert torch.allclose(part[mask], full[mask], atol=1e-6)
    assert torch.all(part[~mask] == 0)
    empty = masked_logprobs(logits[:0, 0], ids, torch.zeros_like(mask))  # nothing to learn: all zeros
    assert torch.all(empty == 0)
    first = mask.clone()
    first[0, 0] = True
    with pytest.raises(ValueError, match="position 0"):
        masked_logprobs(logits[keep], ids, first)
    with pytest.raises(ValueError, match="one row per masked position"):
        masked_logprobs(logits[keep][:-1], ids, mask)


@pytest.mark.parametrize(
    ("ratio", "adv", "expected_loss", "expected_grad", "capped"),
    [
        # A < 0, ratio 5 past c = 3: the loss -ratio * A = 5 is capped at -c * A = 3, and has no gradient
        (5.0, -1.0, 3.0, 0.0, True),
        (4.0, -0.5, 1.5, 0.0, True),
        # A < 0, ratio 2 below c: the dual clip is idle (loss -ratio * A = 2, gradient -ratio * A)
        (2.0, -1.0, 2.0, 2.0, False),
        # A > 0 is never dual-clipped: ratio 5 stays at the upper clip 1.2 * A
        (5.0, 1.0, -1.2, 0.0, False),
    ],
)
def test_dual_clip_caps_negative_advantage_losses(ratio, adv, expected_loss, expected_grad, capped):
    logp = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, dtype=torch.float64)
    a = torch.tensor([adv], dtype=torch.float64)
    loss, _, clipped = clipped_surrogate(logp, old, a, EPS, EPS, dual_clip_c=3.0)
    loss.sum().backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert logp.grad.item() == pytest.approx(expected_grad, abs=1e-12)
    plain = clipped_surrogate(logp.detach(), old, a, EPS, EPS)[0].item()
    assert (plain != pytest.approx(expected_loss)) is capped  # without the option the loss is -ratio * A
    if capped:
        assert bool(clipped.item())


def test_dual_clip_in_the_policy_loss():
    logp, old, adv, mask = _batch()
    logp = logp.clone()
    logp[0, 3] = math.log(4.0)  # A = -1 at ratio 4: -ratio * A = 4, capped at 3
    loss, m = policy_loss(logp, old, adv, mask, clip_eps=EPS, dual_clip_c=3.0)
    row0 = [-2.2, -1.2, 3.0]
    row1 = _hand_token_losses()[1]
    assert loss.item() == pytest.approx((sum(row0) + sum(row1)) / 5, abs=1e-12)
    assert m.dual_clip_fraction == pytest.approx(1 / 5)
    off, m_off = policy_loss(logp, old, adv, mask, clip_eps=EPS)
    assert off.item() == pytest.approx((-2.2 - 1.2 + 4.0 + sum(row1)) / 5, abs=1e-12)
    assert m_off.dual_clip_fraction == 0.0
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(logp, old, adv, mask, dual_clip_c=1.0)


def test_kl_clamp_caps_the_k3_term():
    logp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-12.0, 0.5, 3.0]], dtype=torch.float64)
    # k3 = exp(d) - d - 1: 11.000006 (capped at 10, no gradient), 0.1487, 16.0855 (capped)
    k3 = kl_k3(logp, ref, clamp=10.0)
    assert k3[0].tolist() == pytest.approx([10.0, math.exp(0.5) - 1.5, 10.0], abs=1e-12)
    k3.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -(math.exp(0.5) - 1.0), 0.0], abs=1e-12)
    assert kl_k3(logp, ref)[0, 0].item() == pytest.approx(math.exp(-12.0) + 11.0, abs=1e-12)
    mask = torch.ones(1, 3, dtype=torch.bool)
    zero = torch.zeros(1, 3, dtype=torch.float64)
    loss, m = policy_loss(logp.detach(), logp.detach(), zero, mask, ref, kl_coef=0.1, kl_clamp=10.0)
    assert m.kl == pytest.approx((20.0 + math.exp(0.5) - 1.5) / 3, abs=1e-12)
    assert loss.item() == pytest.approx(0.1 * m.kl, abs=1e-12)
    with pytest.raises(ValueError, match="kl_clamp"):
        policy_loss(logp, logp, zero, mask, ref, kl_coef=0.1, kl_clamp=0.0)


def test_the_options_off_are_exactly_todays_loss():
    logp, old, adv, mask = _batch()
    ref = logp - 0.3
    today, m_today = policy_loss(logp, old, adv, mask, ref, clip_eps=EPS, kl_coef=0.1)
    off, m_off = policy_loss(logp, old, adv, mask, ref, clip_eps=EPS, kl_coef=0.1, dual_clip_c=None, kl_clamp=None)
    assert torch.equal(today, off) and m_today == m_off
    idle, _ = policy_loss(logp, old, adv, mask, ref, clip_eps=EPS, kl_coef=0.1, dual_clip_c=3.0, kl_clamp=10.0)
    assert torch.equal(today, idle)  # ratios <= 1.5 and k3 < 10: neither binds


def test_grpo_options_reach_the_loss_and_the_advantages(monkeypatch, one_thread):
    """The trainer passes grpo.dual_clip_c and grpo.kl_clamp to the loss, and grpo.adv_std to the advantages:
    on-policy (ratio 1) the policy gradient is linear in A, so the sample std's step has sqrt(3/4) the gradient
    norm of the population std's at G = 4."""
    from pydantic import ValidationError

    import components.training.grpo.trainer as trainer_module
    from components.training.engines.rollout import HFRolloutEngine, SamplingParams
    from components.training.model import LoRASettings, build_policy
    from components.training.params import GRPOParams
    from components.training.tiny import CharTokenizer, tiny_qwen2

    tok = CharTokenizer("abcdefghijklmn")
    seen = []

    def spy(*args, **kwargs):
        seen.append((kwargs["dual_clip_c"], kwargs["kl_clamp"]))
        return policy_loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", spy)

    def step(**options):
        torch.manual_seed(0)
        policy = build_policy(tiny_qwen2(tok.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
        target = tok.encode("e")[0]

        def reward(episodes, ctx):
            return [float(i % 2) + sum(t == target for t in e.response_ids) for i, e in enumerate(episodes)]

        config = GRPOParams(group_size=4, prompts_per_step=2, lr=1e-2, kl_coef=1e-3, **options)
        trainer = trainer_module.GRPOTrainer(policy, HFRolloutEngine(policy.model, tok), reward, ["abc", "bcd"],
                                             config, sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
        torch.manual_seed(1)
        return trainer.step()

    population = step()
    assert seen[-1] == (None, None) and "dual_clip_fraction" not in population
    sample = step(adv_std="sample", dual_clip_c=3.0, kl_clamp=10.0)
    assert seen[-1] == (3.0, 10.0) and sample["dual_clip_fraction"] == 0.0  # ratio 1: the cap never binds
    assert population["grad_norm"] > 1e-3
    assert sample["grad_norm"] == pytest.approx(math.sqrt(3 / 4) * population["grad_norm"], rel=1e-3)
    with pytest.raises(ValidationError, match="dual_clip_c"):
        GRPOParams(dual_clip_c=1.0)
    with pytest.raises(ValidationError, match="kl_clamp"):
        GRPOParams(kl_clamp=0.0)
    keyed_when_set = {name for name, f in GRPOParams.model_fields.items()
                      if (f.json_schema_extra or {}).get("keyed_when_set")}
    assert {"dual_clip_c", "kl_clamp"} <= keyed_when_set  # left out of run keys while None
