"""The HF rollout engine skips scoring its samples when the trainer does not read the scores (TRL's transformers
path never scores them): the same tokens, the same update, and the scores still come when TIS or
``old_logprobs: engine`` read them.

    .venv/bin/python -m pytest -q tests/training/test_engine_logprobs_skip.py
"""

from dataclasses import replace

import pytest
import torch

from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.grpo.trainer import GRPOTrainer, rollout_sampling
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefghijklmn")
PROMPTS = ["abc", "bcd", "cde", "def"]

pytestmark = pytest.mark.usefixtures("one_thread")


def even_fraction(episodes, ctx=None):
    return [sum(t % 2 == 0 for t in e.response_ids) / max(len(e.response_ids), 1) for e in episodes]


class RecordingEngine(HFRolloutEngine):
    """Records what each call was asked and returned; ``force_logprobs`` makes it score the samples anyway."""

    def __init__(self, *args, force_logprobs=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.force_logprobs, self.asked, self.returned = force_logprobs, [], []

    def generate(self, prompts, sampling):
        self.asked.append(sampling.logprobs)
        if self.force_logprobs:
            sampling = replace(sampling, logprobs=True)
        gens = super().generate(prompts, sampling)
        self.returned.extend(g.logprobs for g in gens)
        return gens


def make_trainer(config, **engine_kwargs):
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=8, alpha=16))
    engine = RecordingEngine(policy.model, TOK, **engine_kwargs)
    return GRPOTrainer(policy, engine, even_fraction, PROMPTS, config,
                       sampling=SamplingParams(max_new_tokens=6, logprobs=True))


def test_engine_without_logprobs_samples_the_same_tokens():
    model = tiny_qwen2(TOK.vocab_size, seed=0)
    engine = HFRolloutEngine(model, TOK)
    out = {}
    for scored in (True, False):
        torch.manual_seed(3)
        out[scored] = engine.generate(["abc", "de", "fgh"], SamplingParams(max_new_tokens=7, logprobs=scored))
    assert [g.token_ids for g in out[True]] == [g.token_ids for g in out[False]]
    assert all(len(g.logprobs) == len(g.token_ids) for g in out[True])
    assert all(g.logprobs is None for g in out[False])


@pytest.mark.parametrize(("config", "reads"), [
    (GRPOParams(), False),
    (GRPOParams(old_logprobs="recompute"), False),
    (GRPOParams(old_logprobs="engine"), True),
    (GRPOParams(tis_cap=2.0), True),
])
def test_the_trainer_asks_for_engine_logprobs_only_when_its_update_reads_them(config, reads):
    assert rollout_sampling(config).logprobs is reads
    assert make_trainer(config).sampling.logprobs is reads  # whatever the sampling passed in says


def test_the_update_is_unchanged_when_the_engine_skips_its_logprobs():
    config = GRPOParams(group_size=4, prompts_per_step=2, lr=1e-2, kl_coef=5e-3, checkpoint_every=0)
    runs = {}
    for forced in (False, True):
        trainer = make_trainer(config, force_logprobs=forced)
        torch.manual_seed(11)
        metrics = [trainer.step() for _ in range(2)]
        weights = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
        runs[forced] = (metrics, weights, trainer.engine)
    skipped, scored = runs[False][2], runs[True][2]
    assert skipped.asked == scored.asked == [False, False]
    assert all(lp is None for lp in skipped.returned) and all(lp is not None for lp in scored.returned)
    for a, b in zip(runs[False][0], runs[True][0], strict=True):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "clip_fraction", "reward/mean", "tokens"):
            assert a[key] == b[key], key
    for name, value in runs[False][1].items():
        assert torch.equal(value, runs[True][1][name]), name


def test_tis_still_gets_the_engines_logprobs():
    trainer = make_trainer(GRPOParams(group_size=4, prompts_per_step=1, lr=1e-2, tis_cap=2.0, checkpoint_every=0))
    metrics = trainer.step()
    assert trainer.engine.asked == [True]
    assert all(lp is not None for lp in trainer.engine.returned)
    assert metrics["tis_skipped"] == 0.0
