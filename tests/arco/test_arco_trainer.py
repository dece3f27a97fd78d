"""ARCO through the real GRPO trainer (tiny random Qwen2s for the policy and mu, replayed ReAct turns, a scripted
teacher and a scripted criteria writer): the phases and the alternation of policy and mu updates as configured,
the frozen variant, teacher failures, and mu's score head, LoRA and optimizer restored exactly by resume."""

from itertools import pairwise

import pytest
import torch

from components.agents.react import ReActAgent
from components.methods.arco.variants import ArcoReward, ArcoState
from components.agents.params import AgentParams
from components.methods.arco.params import ArcoParams
from components.training.params import GRPOParams
from components.methods.arco.rubric_model import RubricModel
from components.training.grpo.agent_rollout import make_agent_rollout
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2
from components.training.grpo.trainer import GRPOTrainer
from tests.arco.helpers import TOK, MuWriter, PolicyEngine, Q, Tools, render, teacher

LORA = LoRASettings(r=4, alpha=8)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def clone(tensors):
    return {k: v.detach().clone() for k, v in tensors.items()}


def build(folder, *, frozen=False, loss="decomposition", update_every=2, fail_on=None):
    settings = ArcoParams(k=3, warmup_steps=1, warmup_epochs=1, update_every=update_every, micro_batch=2,
                          head_width=8, lr=1e-2, kl_coef=0.1)

    def factory():
        return RubricModel(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=3), TOK, lora=LORA, head_width=8,
                           k=3, engine=MuWriter(), render=render, seed=5)

    state = ArcoState(settings, factory, teacher(fail_on=fail_on), loss=loss, frozen=frozen, sparse_steps=2)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), lora=LORA)
    agent = AgentParams(history_format="scratchpad", max_turns=4, max_search_calls=3, max_tokens=64)
    rollout = make_agent_rollout(lambda p: ReActAgent(p, Tools(), agent, system_prompt="Answer by searching."),
                                 TOK, render=render)
    shapes, snapshots = [], []

    def advantages(episodes, scores, ctx):
        shapes.append(tuple(scores.shape))
        return state.advantages(episodes, scores, ctx)

    def on_metrics(step, metrics):
        mu = clone(state.mu.state_tensors()) if state._mu is not None else None
        snapshots.append((step, mu, clone({n: p for n, p in policy.model.named_parameters() if p.requires_grad})))

    config = GRPOParams(group_size=2, prompts_per_step=1, steps=5, checkpoint_every=1, keep_last=None, shuffle=False,
                        lr=1e-3)
    trainer = GRPOTrainer(policy, PolicyEngine(), ArcoReward(state), [Q], config, rollout_fn=rollout,
                          advantage_fn=advantages, method=state, checkpoint_dir=folder, pad_token_id=0,
                          on_metrics=on_metrics)
    return trainer, state, shapes, snapshots


def changed(a, b):
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_warm_up_then_policy_and_mu_updates_alternate_as_configured(tmp_path):
    trainer, _, shapes, snapshots = build(tmp_path / "ckpt")
    history = trainer.train(5)
    m = [{k.removeprefix("method/"): v for k, v in h.items()} for h in history]
    # step 1: outcome reward, the teacher annotates both episodes, mu warms up on them
    assert m[0]["teacher/annotated"] == 2 and m[0]["teacher/failures"] == 0
    assert m[0]["mu/warm"] == 1 and m[0]["mu/warmup_optimizer_steps"] == 1 and "reward/arco/steps" not in m[0]
    # from step 2 mu writes and scores 3 criteria for each of the 2 x 3 steps
    assert all(h["reward/arco/steps"] == 6 and h["reward/arco/unscored_steps"] == 0 for h in m[1:])
    assert [h["policy_dense"] for h in m] == [0, 0, 1, 1, 1]
    assert [h["mu/updated"] for h in m] == [0, 0, 1, 0, 1] and m[-1]["mu/updates"] == 2
    assert all(h["mu/update_trajectories"] == 2 for h in (m[2], m[4]))
    # the policy sees one outcome per episode, then one reward per step
    assert shapes == [(2, 1), (2, 1), (2, 3), (2, 3), (2, 3)]
    # the good path retrieves each next gold paragraph, the bad one none: the oracle correlation is defined
    assert all(-1 <= h["reward/arco/oracle_corr"] <= 1 for h in m[1:])
    assert m[1]["reward/arco/oracle_good_fraction"] == 0.5
    # parameters: the policy moves every step, mu at its warm-up (step 1) and its updates (steps 3 and 5) only
    assert all(changed(a[2], b[2]) for a, b in pairwise(snapshots))
    mu_moved = [changed(a[1], b[1]) for a, b in pairwise(snapshots)]
    assert snapshots[0][1] is not None and mu_moved == [False, True, False, True]
    # the KL reference is the warm-up adapter: it never moves after step 1
    reference = [{k: v for k, v in s[1].items() if k.startswith("reference/")} for s in snapshots]
    assert not any(changed(reference[0], r) for r in reference[1:])
    assert m[2]["mu/kl"] >= 0 and m[4]["mu/kl"] > 0


def test_mu_s_adapter_is_handed_to_its_engine_after_the_warm_up_and_each_update(tmp_path):
    """An engine that samples from a copy of mu (a llama.cpp server) is given mu's adapter, as it is then."""
    trainer, state, _, snapshots = build(tmp_path / "ckpt")
    trainer.train(5)
    writer = state.mu.engine
    assert [(step, active) for step, active, _ in writer.published] == [(0, "arco_mu"), (1, "arco_mu"), (2, "arco_mu")]
    adapter = lambda snapshot: {k.removeprefix("adapter/"): v for k, v in snapshot[1].items() if k.startswith("adapter/")}
    for (_, _, weights), at in zip(writer.published, (snapshots[0], snapshots[2], snapshots[4])):  # steps 1, 3, 5
        assert set(weights) == set(adapter(at)) and not changed(weights, adapter(at))
    assert changed(writer.published[0][2], writer.published[1][2])
    state.close()
    assert writer.closed


def test_frozen_mu_is_never_updated_but_still_scores(tmp_path):
    trainer, state, shapes, snapshots = build(tmp_path / "ckpt", frozen=True, update_every=1)
    history = trainer.train(4)
    assert [h["method/mu/updated"] for h in history] == [0, 0, 0, 0] and state.updates == 0
    assert not any(changed(snapshots[1][1], s[1]) for s in snapshots[2:])
    assert shapes[2:] == [(2, 3), (2, 3)]


def test_failed_teacher_calls_are_counted_and_skipped(tmp_path):
    trainer, _, _, _ = build(tmp_path / "ckpt", fail_on="Velmora")
    first = trainer.train(1)[0]
    assert first["method/teacher/failures"] == 1 and first["method/teacher/annotated"] == 1
    assert first["method/mu/warmup_trajectories"] == 1


def test_resume_restores_mu_exactly_and_continues_identically(tmp_path):
    trainer, state, _, snapshots = build(tmp_path / "a")
    trainer.train(3)
    at2, at3 = snapshots[1], snapshots[2]
    optimizer_at3 = state.optimizer.state_dict()

    fresh, fresh_state, _, fresh_snapshots = build(tmp_path / "b")
    assert fresh.resume(tmp_path / "a" / "step_000002") and fresh.step_count == 2
    restored = fresh_state.mu.state_tensors()
    assert set(restored) == set(at2[1]) and not changed(at2[1], restored)  # score head, LoRA, reference: exact
    assert fresh_state.warm and fresh_state.updates == 0
    published = fresh_state.mu.engine.published  # the restored adapter, handed to the engine on resume
    assert [s for s, _, _ in published] == [0] and not changed(published[0][2], {
        k.removeprefix("adapter/"): v for k, v in at2[1].items() if k.startswith("adapter/")})
    fresh.train(3)  # step 3 updates mu again, from the restored optimizer state
    assert not changed(at3[1], fresh_snapshots[-1][1]) and not changed(at3[2], fresh_snapshots[-1][2])
    moments = fresh_state.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i]["exp_avg"], optimizer_at3["state"][i]["exp_avg"]) for i in optimizer_at3["state"])
