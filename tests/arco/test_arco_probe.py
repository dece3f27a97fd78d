"""ARCO's credit probe: two rubric models score the same fixed trajectories; the probe's oracle correlation
is the one computed by hand from the step rewards mu gave, repeated trajectories are scored once, and two
mus with different score heads give different credit on the same steps."""

import numpy as np
import torch

from components.methods.arco.variants import ArcoState
from components.methods.arco.probe import distinct_trajectories, probe
from components.methods.arco.params import ArcoParams
from components.methods.arco.decomposition import oracle_step_quality
from components.methods.arco.rubric_model import RubricModel
from components.training.model import LoRASettings
from components.training.tiny import tiny_qwen2
from tests.arco.helpers import BAD, GOOD, TOK, MuWriter, Q, render, trajectory


def state(seed: int) -> ArcoState:
    settings = ArcoParams(k=3, warmup_steps=0, head_width=8, micro_batch=2)

    def factory():
        return RubricModel(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=3), TOK, lora=LoRASettings(r=4, alpha=8),
                           head_width=8, k=3, engine=MuWriter(), render=render, seed=seed)

    return ArcoState(settings, factory, None, sparse_steps=0, seed=seed)


def test_probe_scores_fixed_trajectories_and_correlates_with_the_oracle():
    torch.set_num_threads(1)
    fixed = distinct_trajectories([trajectory(GOOD), trajectory(BAD, answer="Nowhere"), trajectory(GOOD),
                                   trajectory(GOOD[:1] + BAD[1:], answer="Nowhere")])
    assert len(fixed) == 3  # the repeated good path once
    first = probe(state(5), fixed, {Q.id: Q}, seed=0, resamples=50)
    assert first["trajectories"] == 3 and first["steps"] == 9 and first["unscored_steps"] == 0
    # recompute the correlation from the rewards the probe's mu gives to the same steps
    mu = state(5)
    again = probe(mu, fixed, {Q.id: Q}, seed=0, resamples=50)
    assert again["oracle_corr"] == first["oracle_corr"]
    # by hand: the same mu scores the steps; Pearson against the oracle's step quality
    from components.training.grpo.episodes import Episode

    episodes = [Episode(prompt=Q, group=i, rows=[], info={"trajectory": t}) for i, t in enumerate(fixed)]
    torch.manual_seed(0)
    mu.score_episodes(episodes)
    rewards = [r for e in episodes for r in e.info["arco"].rewards]
    quality = [q for e in episodes for q in oracle_step_quality(Q, e.info["arco"].steps)]
    assert abs(np.corrcoef(rewards, quality)[0, 1] - first["oracle_corr"]) < 1e-9
    assert first["oracle_corr_ci_low"] <= first["oracle_corr"] <= first["oracle_corr_ci_high"]
    other = probe(state(6), fixed, {Q.id: Q}, seed=0, resamples=50)  # another score head: other credit
    assert other["oracle_corr"] != first["oracle_corr"]
