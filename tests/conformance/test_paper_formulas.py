"""ARBOR's reward shaping and RubricEM's SS-GRPO returns against their papers' formulas, re-derived here in numpy.
Neither method's code is released (ARBOR: "we will release our code after the review process"; RubricEM builds on
DR Tulu's open-instruct, which has no SS-GRPO), so the paper is the reference: ARBOR 3.4, Eq. 3-4 and the text
around them (../shared/papers/001_afa2764a7d05899b.txt:117-127); RubricEM 3.3 and F.1.2
(004_6d3f41bd36471190.txt:96-104), its Std the population std as open-instruct computes it
(allenai/open-instruct@e6c3044a open_instruct/data_loader.py:1476, numpy std, ddof 0).

    .venv/bin/python -m pytest -q tests/conformance/test_paper_formulas.py
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from components.methods.arbor.shaping import shape_group
from components.methods.rubricem.stage_returns import StageReturns

ARBOR = "ARBOR 3.4 Eq. 3-4 (paper text; no released code)"
RUBRICEM = "RubricEM 3.3 G = R Lambda^T, A = (G - mean) / (Std + eps) per stage (paper; no released code)"


@dataclass
class Episode:
    group: int


PAPER_LAMBDA = [[1.0, 0.4, 0.6, 0.8], [0.0, 1.0, 0.4, 0.8], [0.0, 0.0, 1.0, 0.8], [0.0, 0.0, 0.0, 1.0]]  # F.1.2


def arbor_reference(base, valid, scores, lam, alpha, delta_v):
    """The paper's shaping: drop rubrics whose within-group variance is below delta_v, average the rest into
    s_i, centre within the group (Eq. 3), attenuate negative centred scores by alpha, add lambda times it to the
    base reward (Eq. 4), and force the rubric term to 0 for a format-invalid trajectory."""
    scores = np.asarray(scores, dtype=float)
    kept = scores[[np.var(row) >= delta_v for row in scores]]
    if len(kept) == 0:
        return np.asarray(base, dtype=float)
    s = kept.mean(axis=0)
    centred = s - s.mean()
    centred = np.where(centred < 0, alpha * centred, centred)
    return np.asarray(base, dtype=float) + np.where(valid, lam * centred, 0.0)


def test_arbor_shaping_is_the_papers_eq_3_4(conformance):
    rng = np.random.default_rng(0)
    worst = 0.0
    for case in range(200):
        n, m = int(rng.integers(2, 9)), int(rng.integers(1, 4))
        base = rng.choice([-1.0, 0.0, 0.5, 1.0], size=n).tolist()
        valid = (rng.random(n) > 0.2).tolist()
        scores = rng.choice([0.0, 0.5, 1.0], size=(m, n)).tolist()  # win / tie / loss means over edges
        ours = shape_group(base, valid, scores, lam=0.1, alpha=0.25, delta_v=0.05).total
        worst = max(worst, float(np.abs(np.asarray(ours) - arbor_reference(base, valid, scores, 0.1, 0.25, 0.05)).max()))
    conformance.check("ARBOR shaping: variance filter, centring, alpha on negatives, format gate (200 groups)", ARBOR,
                      worst, 0.0, tol=1e-12)


def test_arbor_attenuation_is_on_the_negative_side_only(conformance):
    """The docstring's example, and the same group with alpha 1 (no attenuation): the paper's alpha applies to
    negative centred scores alone."""
    ours = shape_group([0, 0, 0, 0], [True] * 4, [[1, .5, .5, 0]], lam=0.1, alpha=0.25, delta_v=0.05).total
    conformance.check("ARBOR shaping, all-wrong group [1, .5, .5, 0]", ARBOR, ours,
                      arbor_reference([0] * 4, [True] * 4, [[1, .5, .5, 0]], 0.1, 0.25, 0.05), tol=1e-12)
    plain = shape_group([0, 0, 0, 0], [True] * 4, [[1, .5, .5, 0]], lam=0.1, alpha=1.0, delta_v=0.05).total
    conformance.differs("ARBOR shaping with alpha 1 (no attenuation)", ARBOR + ", alpha 0.25", plain, ours,
                        at_least=0.03, note="alpha 1 leaves negative terms whole: -0.05 against -0.0125")


def rubricem_reference(scores, groups, lam, eps=1e-6):
    g = np.asarray(scores) @ np.asarray(lam).T
    out = np.zeros_like(g)
    for gid in set(groups):
        rows = [i for i, x in enumerate(groups) if x == gid]
        block = g[rows]
        std = block.std(axis=0)  # population, ddof 0
        out[rows] = np.where(std > 0, (block - block.mean(axis=0)) / (np.where(std > 0, std, 1.0) + eps), 0.0)
    return out


def test_ss_grpo_advantages_are_the_papers(conformance):
    rng = np.random.default_rng(1)
    scores = rng.random((16, 4))
    groups = [i // 8 for i in range(16)]  # two groups of n = 8
    episodes = [Episode(group=g) for g in groups]
    ours = StageReturns(PAPER_LAMBDA)(episodes, torch.tensor(scores, dtype=torch.float64))
    conformance.check("RubricEM SS-GRPO stage advantages (paper Lambda, 2 groups of 8)", RUBRICEM, ours,
                      rubricem_reference(scores, groups, PAPER_LAMBDA), tol=1e-5,
                      note="float32 returns against float64")
    identity = torch.eye(4).tolist()  # each stage its own score alone
    conformance.differs("RubricEM stage advantages with Lambda = I (no credit from later stages)",
                        RUBRICEM + ", paper Lambda", StageReturns(identity)(episodes, torch.tensor(scores)),
                        ours, at_least=0.1, note="the paper's Lambda is live: without it the advantages differ")
