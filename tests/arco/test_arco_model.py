"""mu on a tiny random Qwen2: score-head shapes and read positions, where gradients flow (mu's adapter and head
only; never the policy's adapter, the KL reference or the base), reply parsing, and its tensors round trip."""

import pytest
import torch

from components.methods.arco.criteria import WarmupRow, step_messages, trajectory_steps
from components.methods.arco.decomposition import decomposition_loss
from components.methods.arco.rubric_model import ADAPTER, REFERENCE, CriteriaSample, RubricModel
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2
from tests.arco.helpers import CRITERIA, GOOD, TOK, MuWriter, Q, render, trajectory
from tests.autograd_saved import saved_tensor_count

LORA = LoRASettings(r=4, alpha=8)


def rows():
    steps = trajectory_steps(trajectory(GOOD))
    return [WarmupRow(step_messages(Q.question, steps, 0, 3), ["Looks up the person", "One name", "No guess"]),
            WarmupRow(step_messages(Q.question, steps, 1, 3), ["Looks up the town", "Uses Kestrow"])]


def shared_mu(**options):
    policy = build_policy(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), lora=LORA)
    before = {id(p) for p in policy.trainable_parameters()}
    mu = RubricModel(policy.model, TOK, lora=LORA, head_width=8, k=3, engine=MuWriter(), render=render, seed=1,
                     **options)
    assert {id(p) for p in policy.trainable_parameters()} == before  # the policy's optimizer never sees mu
    return policy, mu


def grads(model, tag):
    return [p.grad for n, p in model.named_parameters() if tag(n)]


@torch.no_grad()
def test_criterion_end_scores_each_criterion_at_its_last_token():
    _, mu = shared_mu(score_readout="criterion_end", score_head="mlp2")
    samples = [mu.target_sample(r) for r in rows()]
    assert [len(s.ends) for s in samples] == [3, 2]
    # each end is the last character of its criterion in the reply
    reply = TOK.decode(samples[0].criteria_ids)
    assert [reply[: e + 1].endswith(c) for e, c in zip(samples[0].ends, samples[0].criteria)] == [True] * 3
    out = mu.forward(samples)
    assert out.scores.shape == (2, 3) and out.valid.tolist() == [[True, True, True], [True, True, False]]
    assert out.scores[1, 2] == 0 and out.step_rewards.shape == (2,)
    assert out.step_rewards[1] == pytest.approx(float(out.scores[1, :2].mean()))
    # causality tells the read positions apart: changing criterion 2 leaves criterion 1's score alone
    edited = CriteriaSample(samples[0].prompt_ids, list(samples[0].criteria_ids), samples[0].criteria, samples[0].ends)
    edited.criteria_ids[samples[0].ends[1]] = TOK.encode("Q")[0]
    again = mu.forward([edited])
    assert again.scores[0, 0] == pytest.approx(float(out.scores[0, 0]), abs=1e-6)
    assert again.scores[0, 1] != pytest.approx(float(out.scores[0, 1]), abs=1e-6)
    assert mu.model.active_adapter == "default"  # the policy's adapter is active again after mu's pass


@torch.no_grad()
def test_mean_pool_gives_k_bounded_scores_from_every_token_of_the_step():
    """The released readout: one vector per step (every token's last hidden state averaged), K tanh scores."""
    _, mu = shared_mu()
    assert [type(m).__name__ for m in mu.head.net] == ["Linear", "GELU", "Linear", "GELU", "Linear", "Tanh"]
    samples = [mu.target_sample(r) for r in rows()]
    out = mu.forward(samples)
    assert out.scores.shape == (2, 3) and out.valid.all() and (out.scores.abs() < 1).all()
    assert torch.allclose(out.step_rewards, out.scores.mean(dim=1))
    # a prompt token far from the criteria moves every score (the mean reads it), a criterion without a readable
    # end is still scored
    edited = CriteriaSample(list(samples[0].prompt_ids), samples[0].criteria_ids, [], [])
    edited.prompt_ids[5] = TOK.encode("Q")[0]
    again = mu.forward([edited])
    assert (again.scores[0] - out.scores[0]).abs().min() > 0


def test_decomposition_gradient_reaches_mu_adapter_and_head_only():
    policy, mu = shared_mu()
    before = {id(p) for p in policy.trainable_parameters()}
    with mu.adapter(ADAPTER):  # mu's backward runs with its adapter active (see RubricModel.adapter)
        out = mu.forward([mu.target_sample(r) for r in rows()])
        decomposition_loss([out.step_rewards], torch.tensor([1.0])).backward()
    assert {id(p) for p in policy.trainable_parameters()} == before and mu.model.active_adapter == "default"
    assert all(g is not None and g.abs().sum() > 0 for g in (p.grad for p in mu.head.parameters()))
    assert any(g is not None and g.abs().sum() > 0 for g in grads(mu.model, lambda n: f".{ADAPTER}." in n))
    assert all(g is None for g in grads(mu.model, lambda n: ".default." in n))  # the policy's adapter
    assert all(g is None for g in grads(mu.model, lambda n: f".{REFERENCE}." in n))
    assert all(g is None for g in grads(mu.model, lambda n: "lora_" not in n))  # base weights


@pytest.mark.parametrize("estimator", ["full", "k3"])
def test_kl_is_zero_at_the_reference_and_its_gradient_skips_the_head(estimator):
    _, mu = shared_mu(kl_estimator=estimator)
    samples = [mu.target_sample(r) for r in rows()]
    kl, tokens = mu.kl_to_reference(mu.forward(samples))
    assert float(kl.detach()) == pytest.approx(0.0, abs=1e-6) and tokens == sum(len(s.criteria_ids) for s in samples)
    with torch.no_grad():  # move mu away from its reference
        for n, p in mu.model.named_parameters():
            if f"lora_B.{ADAPTER}." in n:
                p.normal_(0, 0.5)
    with mu.adapter(ADAPTER):
        kl, _ = mu.kl_to_reference(mu.forward(samples))
        assert float(kl.detach()) > 0
        kl.backward()
    assert all(p.grad is None for p in mu.head.parameters())
    assert any(g is not None and g.abs().sum() > 0 for g in grads(mu.model, lambda n: f".{ADAPTER}." in n))
    assert all(g is None for g in grads(mu.model, lambda n: f".{REFERENCE}." in n or ".default." in n))


def test_own_backbone_trains_only_its_adapter_and_head():
    mu = RubricModel(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), TOK, lora=LORA, head_width=8,
                     engine=MuWriter(), render=render)
    trainable = {id(p) for p in mu.parameters()}
    named = dict(mu.model.named_parameters())
    assert trainable == {id(p) for n, p in named.items() if f".{ADAPTER}." in n} | {id(p) for p in mu.head.parameters()}
    assert not any(p.requires_grad for n, p in named.items() if "lora_" not in n)


def test_write_parses_mu_replies_and_marks_unreadable_ones():
    _, mu = shared_mu(score_readout="criterion_end")
    mu.engine = MuWriter(junk_for="step 2")
    steps = trajectory_steps(trajectory(GOOD))
    samples = mu.write([step_messages(Q.question, steps, t, 3) for t in range(2)])
    assert samples[0].criteria == [line[3:] for line in CRITERIA.split("\n")]
    text = TOK.decode(samples[0].criteria_ids)
    assert [text[: e + 1].endswith(c) for e, c in zip(samples[0].ends, samples[0].criteria)] == [True] * 3
    assert samples[1].criteria == [] and samples[1].ends == []
    rewards = mu.score(samples)
    assert rewards[1] is None and isinstance(rewards[0], float)
    _, pooled = shared_mu()  # the released readout scores the step from its tokens alone
    assert all(isinstance(r, float) for r in pooled.score(samples))


def test_state_tensors_round_trip_exactly():
    _, mu = shared_mu()
    with torch.no_grad():
        for n, p in mu.model.named_parameters():
            if f".{ADAPTER}." in n:
                p.add_(0.1)
    saved = mu.state_tensors()
    _, other = shared_mu()
    assert any(not torch.equal(v, saved[k]) for k, v in other.state_tensors().items() if k.startswith("adapter/"))
    other.load_state_tensors(saved)
    loaded = other.state_tensors()
    assert set(loaded) == set(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)
    with pytest.raises(ValueError, match="does not fit"):
        other.load_adapter_state({"x": torch.zeros(1)})


def test_own_backbone_recomputes_activations_for_the_same_gradient():
    grads_by_mode, saved_by_mode = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation
        mu = RubricModel(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), TOK, lora=LORA, head_width=8,
                         engine=MuWriter(), render=render, gradient_checkpointing=checkpointing)
        mu.model.train()
        with saved_tensor_count() as saved:
            out = mu.forward([mu.target_sample(r) for r in rows()])
        decomposition_loss([out.step_rewards], torch.tensor([1.0])).backward()
        grads_by_mode.append([p.grad.clone() for p in mu.parameters()])
        saved_by_mode.append(saved[0])
    assert saved_by_mode[1] * 2 < saved_by_mode[0]  # only the layers' inputs are kept
    for plain, recomputed in zip(*grads_by_mode):
        assert torch.allclose(plain, recomputed, atol=1e-6)


def own_mu(**options):
    torch.manual_seed(0)  # the same LoRA initialisation
    mu = RubricModel(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), TOK, lora=LORA, head_width=8,
                     render=render, **options)
    with torch.no_grad():  # mu away from its reference, as after the warm-up
        for n, p in mu.model.named_parameters():
            if ".lora_B." in n and f".{ADAPTER}." in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.05)
    return mu


def mu_pass(mu):
    mu.model.train()
    out = mu.forward([mu.target_sample(r) for r in rows()])
    kl, tokens = mu.kl_to_reference(out)
    loss = decomposition_loss([out.step_rewards], torch.tensor([1.0])) + kl / tokens
    loss.backward()
    return out.logp.detach(), out.step_rewards.detach(), kl.detach(), [p.grad.clone() for p in mu.parameters()]


def test_the_fused_lora_forward_gives_mu_peft_numbers_to_the_bit():
    """LORA's alpha / r = 2: mu's log-probs, step rewards, KL to its reference and gradients equal peft's."""
    plain, fused = own_mu(), own_mu(fused_lora=True)
    assert sum("forward" in m.__dict__ for m in fused.model.modules()) == 7 * 2  # q k v o gate up down x 2 layers
    assert not any("forward" in m.__dict__ for m in plain.model.modules())
    a, b = mu_pass(plain), mu_pass(fused)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) and a[2] > 0
    assert all(torch.equal(x, y) for x, y in zip(a[3], b[3]))
    prompts = [plain._encode(render(step_messages(Q.question, trajectory_steps(trajectory(GOOD)), 0, 3), True))]
    from components.training.engines.rollout import SamplingParams

    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    with plain.adapter(ADAPTER), fused.adapter(ADAPTER):
        assert plain.engine.generate(prompts, greedy)[0].token_ids == fused.engine.generate(prompts, greedy)[0].token_ids


def test_mu_on_an_int8_base_trains_its_adapter_close_to_fp32():
    plain, int8 = own_mu(), own_mu(int8_base=True, fused_lora=True)
    assert all(hasattr(m.get_base_layer(), "_int8_w_t") for m in int8.model.modules() if hasattr(m, "lora_A"))
    a, b = mu_pass(plain), mu_pass(int8)
    assert not torch.equal(a[0], b[0]) and (a[0] - b[0]).abs().mean() < 0.02 and torch.allclose(a[0], b[0], atol=0.25)
    cosine = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in a[3]]),
                                                   torch.cat([g.flatten() for g in b[3]]), dim=0)
    assert cosine > 0.95


def test_a_shared_base_keeps_the_policys_execution():
    policy = build_policy(tiny_qwen2(TOK.vocab_size, max_positions=2048, seed=0), lora=LORA)
    with pytest.raises(ValueError, match="shared base"):
        RubricModel(policy.model, TOK, lora=LORA, head_width=8, engine=MuWriter(), render=render, fused_lora=True)


def test_grouped_passes_give_one_padded_pass_numbers_with_rows_back_in_order():
    """``micro_batch_tokens``: each step in its own pass (the longer first, so sorting reorders them) computes
    what one padded pass computes: log-probs, step rewards, KL and gradients, row for row."""
    padded, grouped = own_mu(), own_mu(micro_batch_tokens=1)
    samples = [padded.target_sample(r) for r in rows()][::-1]
    lengths = [len(s.prompt_ids) + len(s.criteria_ids) for s in samples]
    assert lengths[0] > lengths[1]
    batch = grouped._batch(samples)
    assert padded.groups(batch) == [[0, 1]] and grouped.groups(batch) == [[1], [0]]
    assert padded.pass_tokens(samples) == 2 * lengths[0] and grouped.pass_tokens(samples) == sum(lengths)

    def run(mu):
        mu.model.train()
        out = mu.forward(samples)
        kl, tokens = mu.kl_to_reference(out)
        (decomposition_loss([out.step_rewards], torch.tensor([1.0])) + kl / tokens).backward()
        return out, kl.detach(), [p.grad.clone() for p in mu.parameters()]

    (a, kl_a, g_a), (b, kl_b, g_b) = run(padded), run(grouped)
    assert b.logp.shape == a.logp.shape and torch.equal(b.mask, a.mask) and torch.equal(b.valid, a.valid)
    assert torch.allclose(a.logp, b.logp, atol=1e-5) and torch.allclose(a.scores, b.scores, atol=1e-5)
    assert torch.allclose(a.step_rewards, b.step_rewards, atol=1e-5) and a.step_rewards[0] != a.step_rewards[1]
    assert torch.allclose(kl_a, kl_b, atol=1e-5) and kl_a > 0
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(g_a, g_b))


def run_update(mu, samples):
    """mu's forward, KL and backward over ``samples``: the outputs, the KL and the gradients."""
    mu.model.train()
    out = mu.forward(samples)
    kl, tokens = mu.kl_to_reference(out)
    (decomposition_loss([out.step_rewards], torch.tensor([1.0])) + kl / tokens).backward()
    return out, kl.detach(), [p.grad.clone() for p in mu.parameters()]


@pytest.mark.parametrize("budget", [None, 1])
def test_shared_prefix_packs_give_the_padded_passes_numbers(budget):
    """``prefix_packing``: the two steps share the system prompt and the question, computed once in one pack
    (or, at a budget of 1 token, each step alone): log-probs, scores, step rewards, KL and gradients as one padded
    pass computes them, row for row (the longer step second: the pack lays it out first)."""
    padded, packed = own_mu(), own_mu(prefix_packing=True, micro_batch_tokens=budget)
    samples = [padded.target_sample(r) for r in rows()]
    lengths = [len(s.prompt_ids) + len(s.criteria_ids) for s in samples]
    assert lengths[1] > lengths[0] and packed.packs(packed._batch(samples))[0].rows[0] == 1
    shared = next(i for i, (a, b) in enumerate(zip(samples[0].prompt_ids, samples[1].prompt_ids)) if a != b)
    assert shared > 100  # system prompt and question
    assert packed.pass_tokens(samples) == (sum(lengths) - shared if budget is None else sum(lengths))
    (a, kl_a, g_a), (b, kl_b, g_b) = run_update(padded, samples), run_update(packed, samples)
    assert b.logp.shape == a.logp.shape and torch.equal(b.mask, a.mask) and torch.equal(b.valid, a.valid)
    assert torch.allclose(a.logp, b.logp, atol=1e-5) and torch.allclose(a.scores, b.scores, atol=1e-5)
    assert torch.allclose(a.step_rewards, b.step_rewards, atol=1e-5) and a.step_rewards[0] != a.step_rewards[1]
    assert torch.allclose(kl_a, kl_b, atol=1e-5) and kl_a > 0
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(g_a, g_b))
    assert packed.score(samples) == pytest.approx(padded.score(samples), abs=1e-5)


def test_a_short_micro_batch_keeps_its_activations_for_the_same_gradient():
    """``checkpoint_min_tokens``: under it mu's recomputing layers keep their activations; at or above, recompute."""
    samples = None
    saved, grads_by = {}, {}
    for label, min_tokens in (("recompute", 0), ("kept", 10_000), ("too_long", 1)):
        mu = own_mu(gradient_checkpointing=True, checkpoint_min_tokens=min_tokens)
        samples = samples or [mu.target_sample(r) for r in rows()]
        mu.model.train()
        with saved_tensor_count() as count:
            out = mu.forward(samples)
        decomposition_loss([out.step_rewards], torch.tensor([1.0])).backward()
        saved[label], grads_by[label] = count[0], [p.grad.clone() for p in mu.parameters()]
    assert saved["kept"] > 2 * saved["recompute"] and saved["too_long"] == saved["recompute"]
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(grads_by["kept"], grads_by["recompute"]))
    assert any(f.is_nonzero() if f.numel() == 1 else bool(f.abs().sum()) for f in grads_by["kept"])
