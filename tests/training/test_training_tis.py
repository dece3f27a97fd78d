"""Truncated importance sampling (ARBOR B.2's token-level TIS, ``grpo.tis_cap``): the loss against numbers
computed by hand with the cap binding and not, exactly today's loss when it is off, and the trainer weighting
its update by the engine's log-probs (and saying when the engine gave none)."""

import dataclasses
import math

import pytest
import torch
from pydantic import ValidationError

from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.grpo.trainer import GRPOTrainer
from components.training.losses import policy_loss
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2

pytestmark = pytest.mark.usefixtures("one_thread")

# one row of 4 positions; position 0 is the prompt (masked). The trainer's old policy gives the three sampled
# tokens 0.5, 0.2, 0.9; the rollout engine sampled them with 0.25, 0.4, 0.3: old / rollout = 2, 0.5, 3.
MASK = torch.tensor([[0, 1, 1, 1]], dtype=torch.bool)
OLD = torch.log(torch.tensor([[1.0, 0.5, 0.2, 0.9]], dtype=torch.float64))
ROLLOUT = torch.log(torch.tensor([[1.0, 0.25, 0.4, 0.3]], dtype=torch.float64))
ADV = torch.tensor([[0.0, 1.0, -2.0, 0.5]], dtype=torch.float64)


def loss(logp, **kw):
    return policy_loss(logp, OLD, ADV, MASK, clip_eps=0.2, **kw)


def test_tis_weights_each_token_by_the_truncated_ratio():
    logp = OLD.clone().requires_grad_(True)  # on-policy: ratio 1, the surrogate is -A per token
    # cap 10 does not bind: w = 2, 0.5, 3 -> token terms -2, 1, -1.5 -> token mean -2.5 / 3
    free, m = loss(logp, rollout_logp=ROLLOUT, tis_cap=10.0)
    assert free.item() == pytest.approx(-2.5 / 3, abs=1e-12)
    assert m.tis_weight_mean == pytest.approx(5.5 / 3) and m.tis_capped_fraction == 0.0
    # cap 2.5 binds on the third token: w = 2, 0.5, 2.5 -> -2, 1, -1.25 -> -2.25 / 3
    capped, m = loss(logp, rollout_logp=ROLLOUT, tis_cap=2.5)
    assert capped.item() == pytest.approx(-2.25 / 3, abs=1e-12)
    assert m.tis_weight_mean == pytest.approx(5.0 / 3) and m.tis_capped_fraction == pytest.approx(1 / 3)
    # the weight carries no gradient: d loss / d logp = -w * A * ratio / 3
    capped.backward()
    assert logp.grad[0, 1:].tolist() == pytest.approx([-2.0 / 3, 1.0 / 3, -1.25 / 3], abs=1e-12)
    assert logp.grad[0, 0].item() == 0.0


def test_tis_multiplies_the_clipped_surrogate():
    # the trainer's policy moved: ratio 1.5 on the first token, clipped at 1.2 for A > 0; w = 2 (cap 10)
    logp = OLD.clone()
    logp[0, 1] += math.log(1.5)
    got, _ = loss(logp, rollout_logp=ROLLOUT, tis_cap=10.0)
    assert got.item() == pytest.approx((-1.2 * 2 + 2.0 * 0.5 - 0.5 * 3) / 3, abs=1e-12)


def test_no_cap_is_exactly_todays_loss():
    logp = OLD + torch.tensor([[0.0, 0.1, -0.3, 0.05]], dtype=torch.float64)
    ref = OLD - 0.2
    today, m_today = policy_loss(logp, OLD, ADV, MASK, ref, clip_eps=0.2, kl_coef=0.1)
    off, m_off = policy_loss(logp, OLD, ADV, MASK, ref, clip_eps=0.2, kl_coef=0.1, rollout_logp=ROLLOUT, tis_cap=None)
    assert torch.equal(today, off) and m_today == m_off
    assert (m_off.tis_weight_mean, m_off.tis_capped_fraction) == (1.0, 0.0)
    on_policy, _ = loss(OLD.clone())
    assert on_policy.item() == pytest.approx(-(1.0 - 2.0 + 0.5) / 3, abs=1e-12)  # -mean(A) at ratio 1


def test_tis_needs_the_engines_logprobs():
    with pytest.raises(ValueError, match="rollout engine's log-probs"):
        loss(OLD.clone(), tis_cap=2.0)
    with pytest.raises(ValidationError, match="tis_cap"):
        GRPOParams(tis_cap=2.0, old_logprobs="engine")  # the engine's log-probs as the old ones: w would be 1
    with pytest.raises(ValidationError, match="tis_cap"):
        GRPOParams(tis_cap=0.0)


TOK = CharTokenizer("abcdefghijklmn")


class ShiftedEngine(HFRolloutEngine):
    """An engine that reports each sampled token's probability ``scale`` times what the trained weights give
    (a quantized server's scores), or no log-probs at all (``scale`` None)."""

    def __init__(self, model, tokenizer, scale):
        super().__init__(model, tokenizer)
        self.scale = scale

    def generate(self, prompts, sampling):
        gens = super().generate(prompts, sampling)
        if self.scale is None:
            return [dataclasses.replace(g, logprobs=None) for g in gens]
        # no log-probs when the trainer does not read them (tis_cap None): nothing to shift
        return [dataclasses.replace(g, logprobs=None if g.logprobs is None else
                                    [lp + math.log(self.scale) for lp in g.logprobs]) for g in gens]


def step_metrics(tis_cap, scale=0.5):
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
    target = TOK.encode("e")[0]

    def reward(episodes, ctx):
        return [float(i % 2) + sum(t == target for t in e.response_ids) for i, e in enumerate(episodes)]

    config = GRPOParams(group_size=4, prompts_per_step=2, lr=1e-2, kl_coef=0.0, tis_cap=tis_cap)
    trainer = GRPOTrainer(policy, ShiftedEngine(policy.model, TOK, scale), reward, ["abc", "bcd"], config,
                          sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
    torch.manual_seed(1)
    return trainer.step()


def test_the_trainer_weights_its_update_by_the_engines_logprobs():
    plain = step_metrics(None)
    assert not any(k.startswith("tis") for k in plain)  # off: the step's metrics are today's
    # the engine halves every probability: old / rollout = 2 on every token, capped at 1.5
    capped = step_metrics(1.5)
    assert capped["tis_skipped"] == 0.0
    assert capped["tis_weight_mean"] == pytest.approx(1.5) and capped["tis_capped_fraction"] == 1.0
    # one weight on every token: the policy gradient scales by it (the group-centred loss itself sums to ~0)
    assert plain["grad_norm"] > 1e-3
    assert capped["grad_norm"] == pytest.approx(1.5 * plain["grad_norm"], rel=1e-5)
    free = step_metrics(4.0)
    assert free["tis_weight_mean"] == pytest.approx(2.0, rel=1e-4) and free["tis_capped_fraction"] == 0.0
    assert free["grad_norm"] == pytest.approx(2.0 * plain["grad_norm"], rel=1e-4)
    unscored = step_metrics(1.5, scale=None)  # an engine that gave no log-probs: no weights, and it says so
    assert unscored["tis_skipped"] == 1.0 and unscored["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-6)
