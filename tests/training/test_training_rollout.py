"""Segment assembly for multi-turn rollouts and the HF engine's log-probs, on a tiny random Qwen2."""

import pytest
import torch

from components.training.engines.rollout import (
    HFRolloutEngine,
    RolloutSegment,
    SamplingParams,
    assemble,
)
from components.training.losses import policy_loss
from components.training.model import LoRASettings, build_policy
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefghijklmn")


def test_assemble_multi_turn_masks_prompt_and_observations():
    rollouts = [
        [
            RolloutSegment([2, 3, 4], False),  # prompt
            RolloutSegment([5, 6], True, [-0.1, -0.2], segment_id=0),  # policy turn 1
            RolloutSegment([7, 8, 9], False, segment_id=0),  # tool observation
            RolloutSegment([10], True, [-0.3], segment_id=1),  # policy turn 2
        ],
        [RolloutSegment([2], False), RolloutSegment([11, 12], True, [-1.0, -2.0])],
    ]
    b = assemble(rollouts, pad_token_id=0)
    assert b.input_ids.tolist() == [[2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 11, 12, 0, 0, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 9, [1, 1, 1] + [0] * 6]
    assert b.loss_mask.int().tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 1], [0, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert b.segment_ids.tolist() == [[-1, -1, -1, 0, 0, 0, 0, 0, 1], [-1] * 9]
    assert b.old_logprobs[0, 3:5].tolist() == pytest.approx([-0.1, -0.2])
    assert b.old_logprobs[0, 8].item() == pytest.approx(-0.3)
    assert b.old_logprobs[1, 1:3].tolist() == pytest.approx([-1.0, -2.0])
    # one trainable segment without log-probs: the batch has none
    assert (
        assemble([[RolloutSegment([2], False), RolloutSegment([3], True)]], pad_token_id=0).old_logprobs
        is None
    )
    sub = b.select([1])
    assert sub.input_ids.tolist() == [[2, 11, 12]]


def test_segment_logprob_length_is_checked():
    with pytest.raises(ValueError, match="logprobs"):
        RolloutSegment([1, 2], True, [0.0])


def _policy():
    model = tiny_qwen2(TOK.vocab_size, seed=3)
    return build_policy(model, lora=LoRASettings(r=4, alpha=8))


def test_hf_engine_logprobs_match_training_forward():
    torch.manual_seed(0)
    policy = _policy()
    with torch.no_grad():  # make the adapter non-trivial so the check involves LoRA weights
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    engine = HFRolloutEngine(policy.model, TOK)
    sampling = SamplingParams(max_new_tokens=6, temperature=0.7)
    gens = engine.generate(["abc", "abc", "defgh"], sampling)
    for g in gens:  # each ends at the length limit or right after EOS (id 1)
        assert (len(g.token_ids) == 6 and g.finish_reason == "length") or (
            g.token_ids[-1] == TOK.eos_token_id and g.finish_reason == "stop" and 1 not in g.token_ids[:-1]
        )
    assert gens[2].prompt_ids == TOK.encode("defgh")
    batch = assemble(
        [[RolloutSegment(g.prompt_ids, False), RolloutSegment(g.token_ids, True, g.logprobs)] for g in gens],
        pad_token_id=0,
    )
    with torch.no_grad():
        lp = policy.token_logprobs(batch.input_ids, batch.attention_mask, temperature=0.7)
    m = batch.loss_mask
    assert torch.allclose(lp[m], batch.old_logprobs[m], atol=1e-4)
    # the same sampled tokens under a different temperature have different log-probs
    with torch.no_grad():
        lp1 = policy.token_logprobs(batch.input_ids, batch.attention_mask, temperature=1.0)
    assert not torch.allclose(lp1[m], batch.old_logprobs[m], atol=1e-3)


def test_hf_engine_stops_at_stop_token_and_is_seeded():
    policy = _policy()
    engine = HFRolloutEngine(policy.model, TOK)
    torch.manual_seed(1)
    a = engine.generate([[2, 3]] * 4, SamplingParams(max_new_tokens=12))
    torch.manual_seed(1)
    b = engine.generate([[2, 3]] * 4, SamplingParams(max_new_tokens=12))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    stop = a[0].token_ids[2]
    torch.manual_seed(1)
    c = engine.generate([[2, 3]] * 4, SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)))
    assert c[0].token_ids == a[0].token_ids[: a[0].token_ids.index(stop) + 1]
    assert c[0].finish_reason == "stop"
    assert all(stop not in g.token_ids[:-1] for g in c)


def test_hf_engine_honours_a_request_seed_and_leaves_the_global_rng_alone():
    engine = HFRolloutEngine(_policy().model, TOK)

    def sampled(seed):
        return [g.token_ids for g in engine.generate([[2, 3]] * 3, SamplingParams(max_new_tokens=12, seed=seed))]

    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = sampled(7)
    assert torch.equal(torch.get_rng_state(), state)  # the trainer's RNG stream is not moved by a seeded call
    torch.manual_seed(99)  # another global state: the seed alone decides
    assert sampled(7) == first and sampled(8) != first
    assert len({tuple(t) for t in first}) > 1  # one seeded call, still a different sample per copy


def test_multi_turn_observation_tokens_get_no_gradient():
    torch.manual_seed(0)
    policy = _policy()
    engine = HFRolloutEngine(policy.model, TOK)
    sampling = SamplingParams(max_new_tokens=3)
    context = TOK.encode("abc")
    segments = [RolloutSegment(list(context), False)]
    for obs in ("kl", "mn"):  # two policy turns, each followed by a tool observation
        g = engine.generate([context], sampling)[0]
        segments.append(RolloutSegment(g.token_ids, True, g.logprobs))
        segments.append(RolloutSegment(TOK.encode(obs), False))
        context = context + g.token_ids + TOK.encode(obs)
    batch = assemble([segments], pad_token_id=0)
    assert batch.loss_mask.int().tolist() == [[0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0]]
    logp = policy.token_logprobs(batch.input_ids, batch.attention_mask)
    logp.retain_grad()
    adv = torch.ones_like(logp)
    loss, _ = policy_loss(logp, batch.old_logprobs, adv, batch.loss_mask, clip_eps=0.2)
    loss.backward()
    obs = ~batch.loss_mask
    assert torch.all(logp.grad[obs] == 0)
    assert torch.all(logp.grad[batch.loss_mask] != 0)


def test_hf_engine_generates_each_prompt_alone_inside_batch_invariant(monkeypatch):
    """Padded batches change the numerics of the shorter prompts; inside ``batch_invariant()`` every prompt
    is its own ``generate`` call, and a prompt's greedy log-probs equal those it gets alone."""
    torch.manual_seed(0)
    engine = HFRolloutEngine(_policy().model, TOK)
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    alone = engine.generate(["ab"], greedy)[0]
    sizes = []
    real = engine._generate_batch
    monkeypatch.setattr(engine, "_generate_batch", lambda prompts, s: sizes.append(len(prompts)) or real(prompts, s))
    with engine.batch_invariant():
        crowded = engine.generate(["defghij", "ab", "cd"], greedy)[1]
    assert sizes == [1, 1, 1] and engine.max_batch_size is None
    assert crowded.token_ids == alone.token_ids and crowded.logprobs == alone.logprobs
    engine.generate(["defghij", "ab"], greedy)
    assert sizes[-1] == 2  # batched again after the block


def test_hf_engine_batches_prompts_of_like_length_and_answers_in_order(monkeypatch):
    """A call split into batches groups prompts by length (each batch padded to its own longest prompt); the
    generations come back in the prompts' order, each the one its own prompt got."""
    torch.manual_seed(0)
    engine = HFRolloutEngine(_policy().model, TOK, max_batch_size=2)
    greedy = SamplingParams(max_new_tokens=3, temperature=0.0)
    prompts = ["abcdefg", "a", "abcdef", "ab"]
    batches = []
    real = engine._generate_batch
    monkeypatch.setattr(engine, "_generate_batch",
                        lambda ps, s: batches.append(sorted(len(p) for p in ps)) or real(ps, s))
    got = engine.generate(prompts, greedy)
    assert batches == [[1, 2], [6, 7]]
    for prompt, generation in zip(prompts, got, strict=True):
        assert generation.prompt_ids == engine._encode(prompt)
