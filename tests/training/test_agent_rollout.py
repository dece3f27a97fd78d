"""Multi-turn ReAct rollouts as training rows: layout, observation masks, and sampling log-probs that
match what the trainer recomputes on the assembled row (so the trained context is the sampled one).

A tiny random Qwen2 with a character tokenizer stands in for the policy; a plain ChatML-like renderer
stands in for a chat template. ``ForcedEngine`` replays chosen replies but scores them with the model
under the exact context it receives, so a wrong splice shows up as a log-prob mismatch.
"""

import asyncio

import pytest
import torch

from components.agents.params import AgentParams
from components.agents.react import FORMAT_REMINDER, Proposal, ReActAgent
from components.llm.base import Message
from components.schemas import Question, ToolCall
from components.training.engines.rollout import Generation, HFRolloutEngine, SamplingParams, assemble
from components.training.grpo.agent_rollout import EpisodePolicy, TurnBatcher, make_agent_rollout
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2

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


def recomputed_matches_sampled(policy, episodes, temperature):
    batch = assemble([row for e in episodes for row in e.rows], pad_token_id=TOK.pad_token_id)
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

    assert len(samples) == 1 and len(samples[0].rows) == 1
    sample = samples[0]
    assert sample.info["final_answer"] == "Kestrow" and sample.info["episode"] == 0
    segs = sample.rows[0]
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
    assert decode(sample.rows[0][2]).startswith("</>\n<user>Observation:")
    assert recomputed_matches_sampled(policy, [sample], 1.0)[0]


def test_scratchpad_history_gives_a_row_per_turn_of_one_episode(policy):
    engine = ForcedEngine(policy.model, REPLIES)
    rollout = make_agent_rollout(agent_factory("scratchpad"), TOK, render=render)
    [episode] = rollout(engine, [Q1], 1, SamplingParams(temperature=1.0))

    assert len(episode.rows) == 2 and episode.info["turns"] == 2  # one episode, a row per turn
    for row, reply in zip(episode.rows, REPLIES, strict=True):
        assert [seg.trainable for seg in row] == [False, True]
        assert decode(row[1]) == reply
    assert [row[1].segment_id for row in episode.rows] == [0, 1]  # the step each turn made
    assert "Observation: [1] (d-Ossian Threll)" in decode(episode.rows[1][0])
    assert recomputed_matches_sampled(policy, [episode], 1.0)[0]


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
        assert [seg.trainable for seg in s.rows[0]] == [False, True, False, True]
        assert FORMAT_REMINDER in decode(s.rows[0][2])
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


def test_grpo_step_through_the_agent_loop_trains_on_every_policy_token(policy):
    e = TOK.encode("e")[0]

    def episode_reward(episodes, ctx):  # the share of "e" over all turns: one value per episode
        return [sum(t == e for t in ep.response_ids) / len(ep.response_ids) for ep in episodes]

    seen = []
    inner = make_agent_rollout(agent_factory("scratchpad", max_turns=2), TOK, render=render)

    def rollout(*args):
        seen.extend(inner(*args))
        return seen[-3:]

    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), episode_reward, [Q1, Q2],
                          GRPOParams(group_size=3, prompts_per_step=1, lr=1e-2, kl_coef=1e-3),
                          rollout_fn=rollout, sampling=SamplingParams(temperature=1.0))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    torch.manual_seed(0)
    metrics = trainer.step()
    assert len(seen) == 3 and all(len(ep.rows) == 2 for ep in seen)  # 3 episodes x 2 turns
    assert metrics["tokens"] == sum(len(ep.response_ids) for ep in seen)
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed and torch.isfinite(torch.tensor(metrics["loss"]))


class RetryOnceAgent(ReActAgent):
    """A Co-ReAct-shaped variant that overrides only the proposal step: it injects a hint into the prompt,
    rejects a draft that searches before any observation, and retries once with feedback. The loop,
    budgets, tools, parser and Trajectory record are ReAct's."""

    HINT = "Hint: check each claim against an observation."

    async def propose(self, state, seed=None):
        messages = self.messages(state)
        messages = messages[:-1] + [Message(role="user", content=messages[-1].content + "\n" + self.HINT)]
        out, call = await self.call_policy(state, messages, self.sampling(seed=seed), kind="draft")
        draft = Proposal.from_text(out.text)
        if draft.parsed.kind == "search" and "retry" not in out.text and not state.steps:
            call.trainable = False  # rejected after the fact: the draft stays context, never trained
            retry = messages + [Message(role="assistant", content=out.text),
                                Message(role="user", content="Feedback: that search repeats the question; retry.")]
            out, call = await self.call_policy(state, retry, self.sampling(seed=seed), kind="retry")
            return Proposal(raw=out.text, parsed=Proposal.from_text(out.text).parsed, call=call,
                            step_fields={"rubric": self.HINT})
        return Proposal(raw=out.text, parsed=draft.parsed, call=call, step_fields={"rubric": self.HINT})


def test_agent_overriding_only_propose_gives_a_valid_trajectory_and_an_untrained_draft(policy):
    replies = ["Thought: look\nAction: search[Where was Ossian Threll born]",
               "Thought: retry with the name\nAction: search[Ossian Threll]",
               "Thought: done\nAction: finish[Kestrow]"]
    engine = ForcedEngine(policy.model, replies)
    settings = AgentParams(history_format="chat", max_turns=4, max_search_calls=3, max_tokens=60, force_answer=False)
    rollout = make_agent_rollout(lambda p: RetryOnceAgent(p, Toolbox(), settings, system_prompt=SYSTEM), TOK,
                                 render=render)
    [episode] = rollout(engine, [Q1], 1, SamplingParams(temperature=1.0))
    trajectory = episode.info["trajectory"]
    assert Trajectory_ok(trajectory)
    assert [s.action for s in trajectory.steps] == ["search[Ossian Threll]", "finish[Kestrow]"]
    assert trajectory.steps[0].rubric == RetryOnceAgent.HINT
    assert trajectory.metadata["policy_calls"] == [
        {"kind": "draft", "trainable": False}, {"kind": "retry", "trainable": True},
        {"kind": "draft", "trainable": True}]
    # the retry extends the rejected draft's conversation (one row, the draft is context without loss); the
    # next turn's prompt shows only the accepted step, so it starts a new row
    first, second = episode.rows
    assert [(decode(s), s.trainable) for s in first if decode(s) in replies] == [(replies[0], False),
                                                                                 (replies[1], True)]
    assert [(decode(s), s.trainable) for s in second if decode(s) in replies] == [(replies[2], True)]
    ok, batch = recomputed_matches_sampled(policy, [episode], 1.0)
    assert ok
    draft_tokens = len(TOK.encode(replies[0])) + 1
    assert int(batch.loss_mask.sum()) == sum(len(TOK.encode(r)) + 1 for r in replies[1:])
    assert draft_tokens > 1


def Trajectory_ok(trajectory):
    from components.schemas import Trajectory

    return Trajectory.model_validate(trajectory.model_dump()) == trajectory and trajectory.finish_reason == "answer"


def test_reply_spans_tag_stages_inside_one_turn(policy):
    """One reply closes stage 0 and opens stage 1: the agent splits it by character offset."""

    class TwoStage(ReActAgent):
        async def propose(self, state, seed=None):
            proposal = await super().propose(state, seed)
            cut = proposal.raw.index("Action:")
            proposal.call.spans = [(0, 0), (cut, 1)]
            return proposal

    engine = ForcedEngine(policy.model, ["Thought: it is Kestrow\nAction: finish[Kestrow]"])
    rollout = make_agent_rollout(lambda p: TwoStage(p, Toolbox(), AgentParams(history_format="chat", max_tokens=60),
                                                    system_prompt=SYSTEM), TOK, render=render)
    [episode] = rollout(engine, [Q1], 1, SamplingParams(temperature=1.0))
    trainable = [s for s in episode.rows[0] if s.trainable]
    assert [s.segment_id for s in trainable] == [0, 1]
    assert decode(trainable[0]) == "Thought: it is Kestrow\n"
    assert decode(trainable[1]).startswith("Action: finish[Kestrow]")


def test_batcher_waits_for_episodes_that_await_other_models(policy):
    """Episodes that await a judge between turns (different delays) still share one engine call per turn."""

    class Slow(ReActAgent):
        async def propose(self, state, seed=None):
            await asyncio.sleep(0.01 * (self.delay + 1))  # e.g. a rubric generator or verifier call
            return await super().propose(state, seed)

    class Counting:
        def __init__(self, inner):
            self.inner, self.batch_sizes = inner, []

        def generate(self, prompts, sampling):
            self.batch_sizes.append(len(prompts))
            return self.inner.generate(prompts, sampling)

    made = []

    def factory(p):
        agent = Slow(p, Toolbox(), AgentParams(history_format="chat", max_turns=2, max_tokens=20, force_answer=False),
                     system_prompt=SYSTEM)
        agent.delay = len(made)
        made.append(agent)
        return agent

    engine = Counting(HFRolloutEngine(policy.model, TOK))
    torch.manual_seed(0)
    make_agent_rollout(factory, TOK, render=render)(engine, [Q1, Q2], 2, SamplingParams(temperature=1.0))
    assert engine.batch_sizes == [4, 4]


def test_episode_policy_refuses_several_samples_per_turn():
    batcher = TurnBatcher(ForcedEngine(None, []), SamplingParams())
    from components.llm.base import Sampling, user

    out = asyncio.run(EpisodePolicy(batcher, TOK, 0, render=render).chat([user("hi")], Sampling(n=2)))
    assert not out.ok and "n=1" in out.message


def test_an_episode_whose_context_fills_the_engines_window_ends_alone_with_an_llm_failure(policy):
    class Windowed(ForcedEngine):
        def generate(self, prompts, sampling):
            assert all(len(p) < self.context_window for p in prompts)  # the server would refuse the batch
            return super().generate(prompts, sampling)

    long_question = Question(id="q3", question="Where? " + "x" * 500, answers=["Kestrow"], source="world")
    engine = Windowed(policy.model, [REPLIES[0], REPLIES[1]])
    engine.context_window = 400
    rollout = make_agent_rollout(agent_factory("chat", max_turns=2), TOK, render=render)
    samples = rollout(engine, [Q1, long_question], 1, SamplingParams(temperature=1.0))
    by_question = {s.info["trajectory"].question_id: s.info["trajectory"] for s in samples}
    assert by_question["q1"].finish_reason == "answer", by_question["q1"]
    assert by_question["q1"].final_answer == "Kestrow"
    assert by_question["q3"].finish_reason == "llm_failure" and by_question["q3"].final_answer is None
    assert "400-token window" in by_question["q3"].metadata.get("error", "") + str(by_question["q3"].steps)
