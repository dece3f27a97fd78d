"""Multi-turn tool rollouts for GRPO: the walking skeleton's ReAct loop, sampled from the policy in training.

The agent loop is not re-implemented here. :class:`EpisodePolicy` is a :class:`ChatModel` that the
unchanged :class:`~components.agents.react.ReActAgent` (or any agent built on it) calls for each turn;
it renders the messages with the chat template, samples through a :class:`RolloutEngine` (HF on CPU,
vLLM on GPU) and records the exact token ids and log-probs of every turn. So a training rollout takes
the same prompts, parser, budgets and tools as an evaluation episode.

Token layout of one episode:

- **chat history** (``agent.history_format: chat``): a turn's messages extend the previous turn's
  messages by the assistant reply and the observation, so its context is built as *previous context +
  previous sampled ids, verbatim + the template's closing and observation tokens*, never by re-tokenizing
  the reply text. The episode is one row: ``[prompt | turn 1 | observation 1 | turn 2 | ...]``, trainable
  on sampled tokens only.
- **scratchpad history** (each turn is one fresh prompt): a row per turn, ``[prompt with history | turn]``.
  Rows of one episode carry the same ``info["episode"]``; the trainer's default advantages
  (:func:`~components.training.advantages.episode_group_advantages`) normalise over episodes, not rows,
  and give every row its episode's advantage.

Either way observations are context only (``loss_mask`` 0), and the sampled log-probs are those of the
very context the trainer scores, which ``tests/training/test_agent_rollout.py`` checks token by token.

Concurrent episodes of a group share one :class:`TurnBatcher`: all turns that are waiting at the same
time go to the engine as one batch (in episode order, so sampling is reproducible under a fixed seed).

Usage::

    rollout_fn = make_agent_rollout(lambda policy: ReActAgent(policy, toolbox, params.agent), tokenizer)
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tokenizer), reward_fn, questions, config,
                          rollout_fn=rollout_fn)      # reward_fn reads sample.info["trajectory"]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from components.llm.base import ChatModel, Completion, Message, PermanentLLMError, Sampling
from components.schemas import Question, Trajectory
from components.training.rollout import Generation, RolloutEngine, RolloutSegment, SamplingParams

__all__ = [
    "EpisodePolicy",
    "TurnBatcher",
    "TurnRecord",
    "chat_template_renderer",
    "make_agent_rollout",
]

Renderer = Callable[[list[Message], bool], str]
_MARK = "\x00REPLY\x00"


def chat_template_renderer(tokenizer: Any) -> Renderer:
    """``render(messages, add_generation_prompt)`` through the tokenizer's own chat template."""

    def render(messages: list[Message], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            [m.model_dump() for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render


@dataclass
class TurnRecord:
    """One policy call of an episode. ``context_ids`` is everything the model saw; ``new_context`` is the
    part of it that was not already in the row it extends (the whole context when it starts a row)."""

    messages: list[Message]
    context_ids: list[int]
    new_context: list[int]
    generation: Generation
    extends_previous: bool


class TurnBatcher:
    """Collects the turns that concurrent episodes request and samples them in one engine call."""

    def __init__(self, engine: RolloutEngine, sampling: SamplingParams):
        self.engine, self.sampling = engine, sampling
        self._pending: list[tuple[int, list[int], SamplingParams, asyncio.Future]] = []
        self._flush_scheduled = False

    async def generate(self, episode: int, context_ids: list[int], sampling: SamplingParams) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((episode, context_ids, sampling, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        # Let every episode that is runnable now reach its next turn before sampling.
        for _ in range(3):
            await asyncio.sleep(0)
        pending, self._pending, self._flush_scheduled = self._pending, [], False
        pending.sort(key=lambda p: p[0])
        by_sampling: dict[SamplingParams, list[tuple[int, list[int], SamplingParams, asyncio.Future]]] = {}
        for p in pending:
            by_sampling.setdefault(p[2], []).append(p)
        for sampling, group in by_sampling.items():
            try:
                gens = self.engine.generate([p[1] for p in group], sampling)
            except Exception as exc:  # noqa: BLE001 - handed to every waiting episode as its failed call
                for p in group:
                    p[3].set_exception(exc)
                continue
            for p, g in zip(group, gens, strict=True):
                p[3].set_result(g)


class EpisodePolicy(ChatModel):
    """The policy of one training episode, as a :class:`ChatModel` the agent loop can call.

    Sampling knobs come from the trainer (``temperature``, ``top_p``, ``top_k``, stop tokens); the agent's
    own ``max_tokens`` and stop strings are kept, since they are part of its protocol.
    """

    def __init__(self, batcher: TurnBatcher, tokenizer: Any, episode: int, *, render: Renderer | None = None,
                 name: str = "trainable_policy"):
        self.batcher, self.tokenizer, self.episode, self.name = batcher, tokenizer, episode, name
        self.render = render or chat_template_renderer(tokenizer)
        self.turns: list[TurnRecord] = []
        self._closing = self._reply_closing()

    def cache_identity(self) -> str:  # never cached: every call must sample from the current weights
        return f"{self.name}/episode-{self.episode}/{id(self)}"

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _reply_closing(self) -> str:
        """What the template writes after an assistant reply's text (``<|im_end|>\\n`` for ChatML)."""
        text = self.render([Message(role="user", content="u"), Message(role="assistant", content=_MARK)], False)
        return text[text.index(_MARK) + len(_MARK):]

    def _extension(self, messages: list[Message]) -> tuple[list[int], list[int]] | None:
        """Context ids and new ids when ``messages`` continue the last turn's conversation, else None."""
        if not self.turns:
            return None
        last = self.turns[-1]
        n = len(last.messages)
        if len(messages) <= n + 1 or messages[:n] != last.messages or messages[n].role != "assistant":
            return None
        prefix = self.render(messages[: n + 1], False)
        full = self.render(messages, True)
        if not full.startswith(prefix):
            return None
        sampled = last.generation.token_ids
        sampled_text = self.tokenizer.decode(sampled, skip_special_tokens=False)
        closing = self._closing
        for k in range(len(closing), 0, -1):  # the reply may already end with part of the closing (EOS)
            if sampled_text.endswith(closing[:k]):
                closing = closing[k:]
                break
        new = self._encode(closing + full[len(prefix):])
        return last.context_ids + list(sampled) + new, new

    async def _complete(self, messages: list[Message], sampling: Sampling) -> Completion:
        if sampling.n != 1:
            raise PermanentLLMError("a training episode samples one reply per turn (n=1)")
        extension = self._extension(messages)
        if extension is None:
            context = self._encode(self.render(messages, True))
            new, extends = context, False
        else:
            (context, new), extends = extension, True
        engine_sampling = replace(
            self.batcher.sampling, max_new_tokens=sampling.max_tokens, stop_strings=tuple(sampling.stop)
        )
        gen = await self.batcher.generate(self.episode, context, engine_sampling)
        self.turns.append(TurnRecord(list(messages), context, new, gen, extends))
        text = gen.text if gen.text is not None else self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return Completion(texts=[text], model=self.name, prompt_tokens=len(context),
                          completion_tokens=len(gen.token_ids), finish_reasons=[gen.finish_reason])

    def rows(self) -> list[list[RolloutSegment]]:
        """The episode's training rows: turns that extend the previous one are appended to its row."""
        rows: list[list[RolloutSegment]] = []
        for i, turn in enumerate(self.turns):
            g = turn.generation
            segs = [RolloutSegment(turn.new_context, False), RolloutSegment(list(g.token_ids), True, g.logprobs, i)]
            if turn.extends_previous and rows:
                rows[-1].extend(segs)
            else:
                rows.append(segs)
        return rows


def make_agent_rollout(
    make_agent: Callable[[ChatModel], Any],
    tokenizer: Any,
    *,
    render: Renderer | None = None,
    to_question: Callable[[Any], Question] | None = None,
) -> Callable[[RolloutEngine, list[Any], int, SamplingParams], list[Any]]:
    """A ``GRPOTrainer`` ``rollout_fn`` that runs ``group_size`` agent episodes per prompt item.

    ``make_agent(policy)`` builds the agent around an episode's policy; prompt items are
    :class:`Question` objects (or anything ``to_question`` maps to one). Each returned sample is one row;
    ``info`` holds ``episode``, ``row``, ``trajectory`` (the full :class:`Trajectory`) and
    ``final_answer``. Segment ids number the turns, so per-turn advantages can be placed with
    ``segment_advantages``.
    """
    from components.training.trainer import Sample

    convert = to_question or (lambda item: item if isinstance(item, Question) else Question.model_validate(item))

    def rollout(engine: RolloutEngine, prompts: list[Any], group_size: int, sampling: SamplingParams) -> list[Any]:
        batcher = TurnBatcher(engine, sampling)
        jobs = [(g, item) for g, item in enumerate(prompts) for _ in range(group_size)]

        async def episode(i: int, item: Any) -> tuple[Trajectory, EpisodePolicy]:
            policy = EpisodePolicy(batcher, tokenizer, i, render=render)
            trajectory = await make_agent(policy).run(convert(item))
            return trajectory, policy

        async def run_all() -> list[tuple[Trajectory, EpisodePolicy]]:
            return list(await asyncio.gather(*(episode(i, item) for i, (_, item) in enumerate(jobs))))

        samples = []
        for i, ((group, item), (trajectory, policy)) in enumerate(zip(jobs, asyncio.run(run_all()), strict=True)):
            for r, segments in enumerate(policy.rows()):
                text = tokenizer.decode([t for s in segments if s.trainable for t in s.token_ids],
                                        skip_special_tokens=True)
                samples.append(Sample(prompt=item, group=group, segments=segments, text=text, info={
                    "episode": i, "row": r, "trajectory": trajectory, "final_answer": trajectory.final_answer,
                    "finish_reason": trajectory.finish_reason}))
        return samples

    return rollout
