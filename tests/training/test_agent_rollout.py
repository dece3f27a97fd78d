"""Multi-turn ReAct rollouts as training rows: layout, observation masks, and sampling log-probs that
match what the trainer recomputes on the assembled row (so the trained context is the sampled one).

A tiny random Qwen2 with a character tokenizer stands in for the policy; a plain ChatML-like renderer
stands in for a chat template. ``ForcedEngine`` replays chosen replies but scores them with the model
under the exact context it receives, so a wrong splice shows up as a log-prob mismatch.
"""

import asyncio

import pytest
import torch

from components.agents.react import FORMAT_REMINDER, ReActAgent
from components.llm.base import Message
from components.params import AgentParams
from components.schemas import Question, ToolCall
from components.training.advantages import episode_group_advantages
from components.training.agent_rollout import EpisodePolicy, TurnBatcher, make_agent_rollout
from components.training.model import LoRASettings, build_policy
from components.training.rollout import Generation, HFRolloutEngine, SamplingParams, assemble
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.training.trainer import GRPOConfig, GRPOTrainer

TOK = CharTokenizer("".join(chr(c) for c in range(32, 127)) + "\n")
SYSTEM = "Use search[x] or finish[x]."
Q1 = Question(id="q1", question="Where was Ossian Threll born?", answers=["Kestrow"], source="world")
Q2 = Question(id="q2", question="Which river is in Kestrow?", answers=["Ammel"], source="world")


def render(messages: list[Message], add_generation_prompt: bool) -> str:
    text = "".join(f"<{m.role}>{m.content}</>\n" for m in messages)
    return text + ("<assistant>" if add_generation_prompt else "")


class Toolbox:
    def call(self, name, argument):
        return ToolCall(name=name, arguments={"query": argument}, doc_ids=[f"d-{argument}"],
                        observation=f"[1] (d-{argument}) {argument}: born in Kestrow")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def policy():
    return build_policy(tiny_qwen2(TOK.vocab_size, max_positions=1024, seed=0), lora=LoRASettings(r=4, alpha=8))


class ForcedEngine:
    """Returns the next scripted reply for each prompt, with the model's log-probs of it in that prompt."""

    def __init__(self, model, replies, eos=True):
        self.model, self.replies, self.eos = model, list(replies), eos
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    @torch.no_grad()
    def generate(self, prompts, sampling):
        self.calls.append(([list(p) for p in prompts], sampling))
        out = []
        for prompt in prompts:
            text = self.replies.pop(0)
            ids = TOK.encode(text) + ([TOK.eos_token_id] if self.eos else [])
            full = torch.tensor([list(prompt) + ids])
            logits = self.model(input_ids=full).logits[0, len(prompt) - 1 : -1].float() / sampling.temperature
            lps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
            out.append(Generation(list(prompt), ids, lps, "stop", text))
        return out


def agent_factory(history_format, **settings):
    settings = {"max_turns": 4, "max_search_calls": 3, "max_tokens": 40, "force_answer": False, **settings}
    params = AgentParams(history_format=history_format, **settings)
    return lambda p: ReActAgent(p, Toolbox(), params, system_prompt=SYSTEM)


def recomputed_matches_sampled(policy, samples, temperature):
    batch = assemble([s.segments for s in samples], pad_token_id=TOK.pad_token_id)
    with torch.no_grad():
        lp = policy.token_logprobs(batch.input_ids, batch.attention_mask, temperature=temperature)
    mask = batch.loss_mask
    assert mask.any()
    return torch.allclose(lp[mask], batch.old_logprobs[mask], atol=1e-4), batch


def decode(segment):
    return TOK.decode(segment.token_ids)


REPLIES = ["Thought: find him\nAction: search[Ossian Threll]", "Thought: done\nAction: finish[Kestrow]"]


def test_chat_history_is_one_row_with_verbatim_turns_and_masked_observations(policy):
    engine = ForcedEngine(policy.model, REPLIES)
    rollout = make_agent_rollout(agent_factory("chat"), TOK, render=render)
    samples = rollout(engine, [Q1], 1, SamplingParams(temperature=0.7, top_p=0.9))

    assert len(samples) == 1
    sample = samples[0]
    assert sample.info["final_answer"] == "Kestrow" and sample.info["episode"] == 0
    segs = sample.segments
    assert [s.trainable for s in segs] == [False, True, False, True]
    assert [decode(s) for s in segs if s.trainable] == REPLIES
    observation = decode(segs[2])
    assert "Observation: [1] (d-Ossian Threll)" in observation and observation.startswith("</>\n<user>")
    assert all("Observation" not in decode(s) for s in segs if s.trainable)
    # the row is what the template renders for the last turn, followed by the last reply
    last_messages = engine.calls[-1][0][0]
    row = [t for s in segs for t in s.token_ids]
    assert row[: len(last_messages)] == last_messages
    assert TOK.decode(last_messages).startswith(f"<system>{SYSTEM}</>\n<user>Question: {Q1.question}</>\n<assistant>")
    ok, batch = recomputed_matches_sampled(policy, samples, 0.7)
    assert ok
    obs_start = len(segs[0].token_ids) + len(segs[1].token_ids)
    assert not batch.loss_mask[0, obs_start : obs_start + len(segs[2].token_ids)].any()
    # the agent's protocol (stop strings, reply length) reaches the engine; the trainer's knobs too
    sampling = engine.calls[0][1]
    assert sampling.stop_strings == ("\nObservation:", "Observation:")
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p) == (40, 0.7, 0.9)


def test_reply_without_eos_gets_the_template_closing_before_the_observation(policy):
    engine = ForcedEngine(policy.model, REPLIES, eos=False)
    rollout = make_agent_rollout(agent_factory("chat"), TOK, render=render)
    [sample] = rollout(engine, [Q1], 1, SamplingParams(temperature=1.0))
    assert decode(sample.segments[2]).startswith("</>\n<user>Observation:")
    assert recomputed_matches_sampled(policy, [sample], 1.0)[0]


def test_scratchpad_history_gives_a_row_per_turn_of_one_episode(policy):
    engine = ForcedEngine(policy.model, REPLIES)
    rollout = make_agent_rollout(agent_factory("scratchpad"), TOK, render=render)
    samples = rollout(engine, [Q1], 1, SamplingParams(temperature=1.0))

    assert [s.info["episode"] for s in samples] == [0, 0] and [s.info["row"] for s in samples] == [0, 1]
    for sample, reply in zip(samples, REPLIES, strict=True):
        assert [seg.trainable for seg in sample.segments] == [False, True]
        assert decode(sample.segments[1]) == reply
    assert "Observation: [1] (d-Ossian Threll)" in decode(samples[1].segments[0])
    assert recomputed_matches_sampled(policy, samples, 1.0)[0]


def test_sampled_episodes_are_batched_per_turn_and_reproducible(policy):
    class Counting:
        def __init__(self, inner):
            self.inner, self.batch_sizes = inner, []

        def generate(self, prompts, sampling):
            self.batch_sizes.append(len(prompts))
            return self.inner.generate(prompts, sampling)

    def run():
        torch.manual_seed(3)
        engine = Counting(HFRolloutEngine(policy.model, TOK))
        rollout = make_agent_rollout(agent_factory("chat", max_turns=2), TOK, render=render)
        return rollout(engine, [Q1, Q2], 3, SamplingParams(temperature=1.0)), engine

    samples, engine = run()
    assert engine.batch_sizes == [6, 6]  # two turns, six episodes each
    assert [s.group for s in samples] == [0, 0, 0, 1, 1, 1] and len({s.info["episode"] for s in samples}) == 6
    for s in samples:  # random text never parses: the reminder is the (masked) observation
        assert [seg.trainable for seg in s.segments] == [False, True, False, True]
        assert FORMAT_REMINDER in decode(s.segments[2])
    assert recomputed_matches_sampled(policy, samples, 1.0)[0]
    again, _ = run()
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]


def test_stop_string_ends_the_turn_and_is_cut_from_the_text(policy):
    engine = HFRolloutEngine(policy.model, TOK)
    torch.manual_seed(0)
    free = engine.generate([TOK.encode("abc")], SamplingParams(max_new_tokens=30))[0]
    stop = TOK.decode(free.token_ids[5:7])  # a string the model does produce at this seed
    torch.manual_seed(0)
    cut = engine.generate([TOK.encode("abc")], SamplingParams(max_new_tokens=30, stop_strings=(stop,)))[0]
    first = TOK.decode(free.token_ids).find(stop)
    assert cut.finish_reason == "stop"
    assert TOK.decode(cut.token_ids).endswith(stop) and len(TOK.decode(cut.token_ids)) == first + len(stop)
    assert cut.text == TOK.decode(free.token_ids)[:first]
    assert cut.logprobs == pytest.approx(free.logprobs[: len(cut.token_ids)], abs=1e-6)


def test_episode_advantages_count_each_episode_once():
    # episode 0 has two rows (reward 1), episode 1 one row (reward 0), same group
    adv = episode_group_advantages([1.0, 1.0, 0.0], [0, 0, 0], [0, 0, 1], eps=0.0)
    assert adv.tolist() == pytest.approx([1.0, 1.0, -1.0])
    # rows counted separately would give mean 2/3 and unequal magnitudes
    assert episode_group_advantages([1.0, 1.0, 0.0], [0, 0, 0], [0, 1, 2], eps=0.0).tolist() != adv.tolist()
    with pytest.raises(ValueError, match="different rewards"):
        episode_group_advantages([1.0, 0.5], [0, 0], [7, 7])


def test_grpo_step_through_the_agent_loop_trains_on_every_policy_token(policy):
    e = TOK.encode("e")[0]

    def episode_reward(samples):  # the share of "e" over all turns of the episode: one value per episode
        tokens = {}
        for s in samples:
            tokens.setdefault(s.info["episode"], []).extend(s.response_ids)
        return [sum(t == e for t in tokens[s.info["episode"]]) / len(tokens[s.info["episode"]]) for s in samples]

    seen = []
    config = GRPOConfig(group_size=3, prompts_per_step=1, learning_rate=1e-2, kl_coef=1e-3,
                        sampling=SamplingParams(temperature=1.0), seed=0)
    inner = make_agent_rollout(agent_factory("scratchpad", max_turns=2), TOK, render=render)

    def rollout(*args):
        seen.extend(inner(*args))
        return seen[-6:]

    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), episode_reward, [Q1, Q2], config,
                          rollout_fn=rollout)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    torch.manual_seed(0)
    metrics = trainer.step()
    assert len(seen) == 6 and {s.info["row"] for s in seen} == {0, 1}  # 3 episodes x 2 turns
    assert metrics["tokens"] == sum(len(s.response_ids) for s in seen)
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed and torch.isfinite(torch.tensor(metrics["loss"]))


def test_episode_policy_refuses_several_samples_per_turn():
    batcher = TurnBatcher(ForcedEngine(None, []), SamplingParams())
    from components.llm.base import Sampling, user

    out = asyncio.run(EpisodePolicy(batcher, TOK, 0, render=render).chat([user("hi")], Sampling(n=2)))
    assert not out.ok and "n=1" in out.message
