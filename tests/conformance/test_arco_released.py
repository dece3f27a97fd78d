"""ARCO under the paper profile beside the released code's, on the same small inputs: the score head (its size at
H=896 and its forward with the released weights copied in), mean pooling over the non-pad tokens, mu's
class-balanced fit loss, the EM terminal reward, the dense (position buckets) and sparse (group mean) advantages,
and the full-vocabulary KL(ref || mu) with its per-step reduction.

The released code is not a package: it is re-derived here from zihangtian/ARCO at 5974454e
(``src/training/dual_head_mu.py``, ``src/training/rl_trainer.py``, ``src/utils/metrics.py``; lines cited at each
function), run on a tiny random Qwen2 (the same weights and adapters as our mu) the way the released trainer runs
it: one unpadded sequence per step for mu's loss, left-padded batches for scoring. Our side is ours as the
variants run it (``RubricModel``, ``ArcoState.advantages``, ``ArcoState._loss_pass``) with the paper profile's
``arco`` section and ``arco.shared`` applied. The named options that depart on purpose (the previous defaults)
are recorded with ``conformance.differs``.

    .venv/bin/python -m pytest -q tests/conformance/test_arco_released.py
"""

from __future__ import annotations

import re
import string
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from components.methods.arco.criteria import WarmupRow, step_messages, trajectory_steps
from components.methods.arco.decomposition import decomposition_loss, terminal_reward
from components.methods.arco.rubric_model import ADAPTER, REFERENCE, RubricModel, ScoreHead
from components.methods.arco.variants import ArcoState
from components.params import with_method_settings
from components.params_load import load_params
from components.training.model import LoRASettings
from components.training.tiny import tiny_qwen2
from tests.arco.helpers import BAD, GOOD, TOK, MuWriter, Q, render, trajectory

REPO = "zihangtian/ARCO@5974454e"
MU = f"{REPO}:src/training/dual_head_mu.py"
TRAINER = f"{REPO}:src/training/rl_trainer.py"
METRICS = f"{REPO}:src/utils/metrics.py"
PAPER = with_method_settings(load_params(Path(__file__).resolve().parents[2] / "params.yaml", "paper"), "arco")
LORA = LoRASettings(r=4, alpha=8)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()  # a tiny model's matmuls: one thread is faster than two busy ones
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# ------------------------------------------------------------------------- the released code, re-derived


def released_score_head(hidden_size: int, n: int = 3) -> nn.Sequential:  # dual_head_mu.py:29-36
    return nn.Sequential(nn.Linear(hidden_size, 512), nn.GELU(), nn.Linear(512, 128), nn.GELU(), nn.Linear(128, n),
                         nn.Tanh())


def released_forward_score(decoder, head, input_ids, attention_mask=None):  # dual_head_mu.py:108-130 (score_only)
    last_hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if attention_mask is not None:
        mask = attention_mask.unsqueeze(-1).float()
        h = (last_hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    else:
        h = last_hidden.mean(dim=1)
    return head(h.float())


def released_left_padded(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:  # rl_trainer.py:1085-1097
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for j, s in enumerate(seqs):
        ids[j, width - len(s):] = torch.tensor(s)
        mask[j, width - len(s):] = 1
    return ids, mask


def released_normalize(s: str) -> str:  # metrics.py:9-17
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def released_em(prediction: str, ground_truth: str) -> int:  # metrics.py:40-45 (hotpotqa.py:115: reward = EM)
    np_, ng_ = released_normalize(prediction), released_normalize(ground_truth)
    if ng_ in ["yes", "no"] and ng_ in np_[:3]:
        return 1
    return 1 if ng_ == np_ else 0


def released_buckets(steps: list[dict]) -> list[str]:  # rl_trainer.py:1166-1198 (dense_bucket_mode search_terminal)
    buckets, search_rank, last_idx = [], 0, len(steps) - 1
    for idx, step in enumerate(steps):
        action = str(step.get("action", "")).strip()
        is_search, is_finish = action.startswith("Search"), action.startswith("Finish")
        if idx == last_idx and not is_finish:
            buckets.append("terminal")
            continue
        if is_search:
            search_rank += 1
            buckets.append(f"search_{search_rank}")
        else:
            buckets.append("terminal")
    return buckets


def released_sum_return(steps: list[dict]) -> list[float]:  # rl_trainer.py:1209-1216 (dense_signal_mode sum_return)
    returns, running = [], 0.0
    for score in reversed([float(s["score"]) for s in steps]):
        running += score
        returns.append(running)
    return returns[::-1]


def released_dense(batch: list[list[dict]], scale: float) -> list[list[float]]:  # rl_trainer.py:1241-1283
    raw = [released_sum_return(t) for t in batch]
    values = [v for vs in raw for v in vs]
    global_baseline = sum(values) / len(values) if values else 0.0
    sums, counts = defaultdict(float), defaultdict(int)  # position_bucket, leave_one_out false, fallback true
    labels = [released_buckets(t) for t in batch]
    for ls, vs in zip(labels, raw):
        for label, value in zip(ls, vs):
            sums[label] += value
            counts[label] += 1
    out = []
    for ls, vs in zip(labels, raw):
        row = []
        for label, value in zip(ls, vs):
            baseline = sums[label] / counts[label] if counts[label] > 1 else global_baseline
            row.append((value - baseline) * scale)
        out.append(row)
    return out


def released_sparse(rewards: list[float], questions: list[str]) -> list[float]:  # rl_trainer.py:1796-1808, 1301
    groups = defaultdict(list)
    for i, q in enumerate(questions):
        groups[q].append(i)
    baseline = [0.0] * len(rewards)
    for idxs in groups.values():
        mean = sum(rewards[i] for i in idxs) / len(idxs)
        for i in idxs:
            baseline[i] = mean
    return [r - b for r, b in zip(rewards, baseline)]  # R = traj["reward"] - reward_baseline


def released_step_kl(model_mu, model_ref, ids: torch.Tensor, plen: int) -> torch.Tensor:  # rl_trainer.py:1395-1410
    logp_current = F.log_softmax(model_mu(input_ids=ids).logits[0, plen - 1:-1], dim=-1)
    with torch.no_grad():
        logp_ref = F.log_softmax(model_ref(input_ids=ids).logits[0, plen - 1:-1], dim=-1)
    return F.kl_div(logp_current, logp_ref, log_target=True, reduction="none").sum(dim=-1).mean()


def released_mu_loss(step_means: list[list[torch.Tensor]], rewards: list[float], beta: float,
                     step_kls: list[list[torch.Tensor]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """rl_trainer.py:1846-1858 (class weights, grads / n_batch) over rl_trainer.py:1415-1422 (one trajectory:
    F.mse_loss(sum of step means, R) x its weight, plus beta x the sum of its steps' KL): (score part, KL part)."""
    n_batch = len(rewards)
    n_pos = max(sum(1 for r in rewards if r > 0.5), 1)
    n_neg = max(sum(1 for r in rewards if r <= 0.5), 1)
    w_pos, w_neg = n_batch / (2.0 * n_pos), n_batch / (2.0 * n_neg)
    score, kl = torch.zeros(()), torch.zeros(())
    for i, (means, r) in enumerate(zip(step_means, rewards)):
        sw = w_pos if r > 0.5 else w_neg
        score = score + F.mse_loss(torch.stack(means).sum(), torch.tensor(r)) * sw
        if step_kls is not None:
            kl = kl + sum(step_kls[i]) * beta
    return score / n_batch, kl / n_batch


# ------------------------------------------------------------------------- ours, on the paper profile


def paper_mu(**options) -> RubricModel:
    torch.manual_seed(0)  # the same LoRA initialisation
    s = PAPER.arco
    options = {"score_head": s.score_head, "score_readout": s.score_readout, "kl_estimator": s.kl_estimator, **options}
    mu = RubricModel(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), TOK, lora=LORA, k=s.k, engine=MuWriter(),
                     render=render, seed=1, **options)
    with torch.no_grad():  # mu away from its reference, as after the warm-up
        for n, p in mu.model.named_parameters():
            if ".lora_B." in n and f".{ADAPTER}." in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.3)
    return mu


def samples(mu: RubricModel):
    steps = trajectory_steps(trajectory(GOOD))
    rows = [WarmupRow(step_messages(Q.question, steps, 0, 3), ["Looks up the person", "One name", "No guess"]),
            WarmupRow(step_messages(Q.question, steps, 1, 3), ["Looks up the town", "Uses Kestrow"]),
            WarmupRow(step_messages(Q.question, steps, 2, 3), ["Answers with the river"])]
    return [mu.target_sample(r) for r in rows]


def paper_state(mu: RubricModel | None = None, *, sparse_steps: int = 0) -> ArcoState:
    settings = PAPER.arco.model_copy(update={"warmup_steps": 0})
    return ArcoState(settings, lambda: mu, sparse_steps=sparse_steps, normalize_std=PAPER.grpo.std_normalize,
                     eps=PAPER.grpo.adv_eps)


def released_steps(t) -> list[dict]:
    """Our trajectory as the released trainer records its steps (its actions are Search[...] / Finish[...])."""
    out = []
    for step in trajectory_steps(t):
        action = f"Finish[{t.final_answer}]" if step.finish else f"Search[{step.query}]" if step.query else step.action
        out.append({"action": action})
    return out


# ------------------------------------------------------------------------- the checks


def test_score_head_size_and_forward_match_the_released_head(conformance):
    s = PAPER.arco
    theirs = sum(p.numel() for p in released_score_head(896, s.k).parameters())
    ours = sum(p.numel() for p in ScoreHead(896, s.head_width, form=s.score_head, outputs=s.k).parameters())
    conformance.check("ARCO score head, parameters at H=896", f"{MU}:29-36", ours, theirs, tol=0, note="525,315")
    small = sum(p.numel() for p in ScoreHead(896, s.head_width, form="mlp2", outputs=1).parameters())
    conformance.differs("ARCO score head, parameters at H=896 (arco.score_head=mlp2)", f"{MU}:29-36", small, theirs,
                        at_least=1e5, note="the earlier head: 114,945, unbounded, one score per criterion")
    torch.manual_seed(3)
    released = released_score_head(32, s.k)
    head = ScoreHead(32, form=s.score_head, outputs=s.k)
    head.net.load_state_dict(released.state_dict())
    hidden = torch.randn(6, 32) * 3
    with torch.no_grad():
        conformance.check("ARCO score head forward (released weights copied in)", f"{MU}:29-36, 129", head(hidden),
                          released(hidden), tol=1e-7)


@pytest.mark.parametrize("packing", [False, True])
@torch.no_grad()
def test_mean_pooled_scores_match_the_released_forward_score(conformance, packing):
    """Our padded passes (right padding) or shared-prefix packs against the released left-padded batch through the
    bare decoder, the same head weights on both."""
    mu = paper_mu(prefix_packing=packing)
    mu.model.eval()
    batch = samples(mu)
    out = mu.forward(batch)
    released = released_score_head(32, PAPER.arco.k)
    released.load_state_dict(mu.head.net.state_dict())
    ids, mask = released_left_padded([s.prompt_ids + s.criteria_ids for s in batch], mu.pad_token_id)
    assert mask.sum(dim=1).unique().numel() == 3  # three lengths: two rows are padded
    with mu.adapter(ADAPTER):
        theirs = released_forward_score(mu.model.get_base_model().get_decoder(), released, ids, mask)
    where = "shared-prefix packs" if packing else "padded passes"
    conformance.check(f"ARCO mean-pooled scores ({where})", f"{MU}:108-130; {TRAINER}:1085-1101", out.scores, theirs,
                      tol=2e-5, note="left padding (released) vs right padding or packs: float rounding")
    conformance.check(f"ARCO step reward = mean of the K scores ({where})", f"{TRAINER}:1119-1121", out.step_rewards,
                      theirs.mean(dim=1), tol=2e-5)


def test_fit_loss_is_the_released_class_balanced_mse(conformance):
    mu = paper_mu()
    batch = samples(mu)
    trajectories = [([batch[0], batch[1], batch[2]], 1.0), ([batch[0]], 0.0), ([batch[1], batch[2]], 0.0),
                    ([batch[2], batch[0]], 0.0)]  # one success in four
    with torch.no_grad():
        mu.head.net[-2].bias.add_(0.6)  # scores near tanh(0.6): the failures' sums are far from their 0
    state = paper_state(mu)
    mu.model.train()
    with mu.adapter(ADAPTER):
        outcomes = [o for _, o in trajectories]
        parts = state._loss_pass(trajectories, len(trajectories), nll=False, kl_tokens=0,
                                 weights=state.fit_weights(outcomes))
        decoder = mu.model.get_base_model().get_decoder()
        released = released_score_head(32, PAPER.arco.k)
        released.load_state_dict(mu.head.net.state_dict())
        with torch.no_grad():  # rl_trainer.py:1386-1393: each step alone, unpadded
            means = [[released_forward_score(decoder, released, torch.tensor([s.prompt_ids + s.criteria_ids])).mean()
                      for s in steps] for steps, _ in trajectories]
    theirs, _ = released_mu_loss(means, outcomes, beta=0.0)
    conformance.check("ARCO fit loss, class-balanced (decomposition_weighting=class_balanced)",
                      f"{TRAINER}:1415-1420, 1846-1858", parts["fit"], theirs, tol=1e-5)
    plain = decomposition_loss([torch.stack(m) for m in means], torch.tensor(outcomes))
    conformance.differs("ARCO fit loss (decomposition_weighting=none)", f"{TRAINER}:1846-1858", plain, theirs,
                        at_least=1e-3, note="every trajectory weighs 1")


def test_terminal_reward_is_the_released_em(conformance):
    answers = ["Ammel", "the Ammel.", "Ammel river", "Kestrow", "AMMEL", "an ammel"]
    ours = [terminal_reward(trajectory(GOOD, answer=a), Q, PAPER.arco.terminal_metric) for a in answers]
    theirs = [released_em(a, Q.answers[0]) for a in answers]
    conformance.check("ARCO terminal reward (terminal_metric=em)", f"{METRICS}:9-17, 40-45", ours, theirs, tol=0,
                      note="no yes/no gold here: the released EM also counts a yes/no gold in the first 3 characters")
    f1 = [terminal_reward(trajectory(GOOD, answer=a), Q, "f1") for a in answers]
    conformance.differs("ARCO terminal reward (terminal_metric=f1)", f"{METRICS}:40-45", f1, theirs, at_least=0.5)


def dense_inputs():
    trajectories = [trajectory(GOOD), trajectory(BAD, answer="Nowhere"), trajectory(GOOD[:2], forced=True),
                    trajectory([GOOD[0], GOOD[2]]), trajectory(BAD[:2]), trajectory([GOOD[1], GOOD[0], GOOD[2]])]
    lengths = [len(trajectory_steps(t)) for t in trajectories]
    g = torch.Generator().manual_seed(7)
    scores = torch.rand((len(trajectories), max(lengths)), generator=g) * 2 - 1
    for i, n in enumerate(lengths):
        scores[i, n:] = float("nan")
    episodes = [SimpleNamespace(group=i // 2, info={"arco": SimpleNamespace(steps=trajectory_steps(t))})
                for i, t in enumerate(trajectories)]
    return trajectories, lengths, scores, episodes


def test_dense_advantages_are_the_released_position_buckets(conformance):
    trajectories, lengths, scores, episodes = dense_inputs()
    ours = paper_state().advantages(episodes, scores, SimpleNamespace(step=1))
    batch = [[{**step, "score": float(scores[i, t])} for t, step in enumerate(released_steps(tr))]
             for i, tr in enumerate(trajectories)]
    assert [released_buckets(t) for t in batch][2] == ["search_1", "search_2", "terminal"]
    theirs = torch.full_like(scores, float("nan"))
    for i, row in enumerate(released_dense(batch, scale=0.5)):
        theirs[i, : len(row)] = torch.tensor(row)
    conformance.check("ARCO dense advantages (dense_baseline=position_bucket, dense_scale=0.5)",
                      f"{TRAINER}:1166-1283; configs/hotpotqa/arco_qwen.yaml:46-51", ours, theirs, tol=1e-6)
    state = paper_state()
    state.settings = state.settings.model_copy(update={"dense_baseline": "step_index", "dense_scale": 1.0,
                                                       "dense_std": True})
    earlier = state.advantages(episodes, scores, SimpleNamespace(step=1))
    conformance.differs("ARCO dense advantages (dense_baseline=step_index, dense_std, scale 1)", f"{TRAINER}:1241-1283",
                        torch.nan_to_num(earlier), torch.nan_to_num(theirs), at_least=0.1,
                        note="the earlier default: per step index within the group, over the group std")


def test_sparse_advantages_are_the_group_mean_baseline(conformance):
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0], [0.5], [0.25], [0.25], [1.0]])
    episodes = [SimpleNamespace(group=i // 4, info={}) for i in range(8)]
    state = paper_state(sparse_steps=5)
    assert not state.dense(1) and PAPER.grpo.std_normalize is False  # arco.shared.grpo
    ours = state.advantages(episodes, rewards, SimpleNamespace(step=1))
    theirs = released_sparse(rewards[:, 0].tolist(), [f"q{i // 4}" for i in range(8)])
    conformance.check("ARCO sparse advantages (arco.shared.grpo.std_normalize=false)", f"{TRAINER}:1796-1808, 1301",
                      ours[:, 0], theirs, tol=1e-7)
    normalised = paper_state(sparse_steps=5)
    normalised.normalize_std = True  # the embedded profile's shared grpo.std_normalize
    conformance.differs("ARCO sparse advantages (grpo.std_normalize=true)", f"{TRAINER}:1796-1808",
                        normalised.advantages(episodes, rewards, SimpleNamespace(step=1))[:, 0], theirs, at_least=0.5,
                        note="group [1, 0, 0, 0]: 1.73 against 0.75")


def test_kl_is_the_released_full_vocabulary_kl_with_its_per_step_reduction(conformance):
    mu = paper_mu()
    batch = samples(mu)
    mu.model.train()

    def released_kls():
        with mu.adapter(ADAPTER):  # the released mu and mu_ref: here mu's adapter and its frozen reference copy
            return [released_step_kl(mu.model, ref_model, torch.tensor([s.prompt_ids + s.criteria_ids]),
                                     len(s.prompt_ids)) for s in batch]

    class ref_model:  # noqa: N801  (the released mu_ref, called as a model)
        def __new__(cls, input_ids):
            with mu.adapter(REFERENCE):
                return mu.model(input_ids=input_ids)

    theirs = released_kls()
    with mu.adapter(ADAPTER):
        sums, counts = mu.kl_per_sample(mu.forward(batch))
    conformance.check("ARCO KL(ref || mu) over the vocabulary, per step (kl_estimator=full)",
                      f"{TRAINER}:1395-1410", sums / counts, torch.stack(theirs), tol=1e-6)
    trajectories = [(batch, 1.0), (batch[:2], 0.0)]
    state = paper_state(mu)
    with mu.adapter(ADAPTER):
        tokens = sum(len(s.criteria_ids) for steps, _ in trajectories for s in steps)
        parts = state._loss_pass(trajectories, len(trajectories), nll=False, kl_tokens=tokens)
    _, kl_term = released_mu_loss([[torch.zeros(())] * len(s) for s, _ in trajectories], [1.0, 0.0], beta=1.0,
                                  step_kls=[[k.detach() for k in theirs], [k.detach() for k in theirs[:2]]])
    conformance.check("ARCO KL term, step means summed over a trajectory / trajectories (kl_reduction=step)",
                      f"{TRAINER}:1410, 1421, 1856-1858", parts["kl"], kl_term, tol=1e-6)
    # the gradient mu's adapter gets from it
    mu.model.zero_grad(set_to_none=True)
    sum(released_kls()).backward()
    lora = mu.lora_parameters()
    want = [p.grad.clone() for p in lora]
    mu.model.zero_grad(set_to_none=True)
    with mu.adapter(ADAPTER):
        sums, counts = mu.kl_per_sample(mu.forward(batch))
        (sums / counts).sum().backward()
    conformance.check("ARCO KL gradient on mu's LoRA (kl_estimator=full)", f"{TRAINER}:1395-1410, 1423",
                      torch.cat([p.grad.flatten() for p in lora]), torch.cat([g.flatten() for g in want]), tol=1e-5,
                      note="gradients up to about 2: float32 rounding")
    k3 = paper_mu(kl_estimator="k3")
    with torch.no_grad(), k3.adapter(ADAPTER):
        sums, counts = k3.kl_per_sample(k3.forward(batch))
    conformance.differs("ARCO KL (kl_estimator=k3: the k3 estimate of KL(mu || ref) at the written token)",
                        f"{TRAINER}:1395-1410", sums / counts, torch.stack(theirs).detach(), at_least=1e-4)
