"""Multi-turn tool rollouts for GRPO: the evaluation agent, unchanged, sampled from the policy in training.
:class:`EpisodePolicy` is the :class:`ChatModel` the agent calls each turn: it renders the messages with the chat
template, samples through a :class:`RolloutEngine` and records the exact token ids and log-probs, so a training
rollout takes the same prompts, parser, budgets and tools as an evaluation episode; concurrent episodes batch their
turns through one :class:`TurnBatcher`. An episode is one row under ``agent.history_format: chat`` (each turn's
context the previous context plus the sampled ids verbatim, never re-tokenized) or a row per turn under
``scratchpad``; observations are context only (``loss_mask`` 0), and a :class:`~components.llm.base.PolicyCall`
tag makes a call non-trainable or gives its tokens stage or step segment ids.

    rollout_fn = make_agent_rollout(lambda policy: ReActAgent(policy, toolbox, params.agent), tokenizer)
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tokenizer), reward_fn, questions, config,
                          rollout_fn=rollout_fn)      # reward_fn reads sample.info["trajectory"]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from components.llm.base import ChatModel, Completion, Message, PermanentLLMError, PolicyCall, Sampling
from components.schemas import Question, Trajectory
from components.training.engines.rollout import Generation, RolloutEngine, RolloutSegment, SamplingParams
from components.training.grpo.episodes import Episode

__all__ = [
    "EpisodePolicy",
    "TurnBatcher",
    "TurnRecord",
    "chat_template_renderer",
    "engine_sampling",
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


def engine_sampling(chat: Sampling, trainer: SamplingParams) -> SamplingParams:
    """The one conversion from an agent's chat :class:`Sampling` to the engine's :class:`SamplingParams`
    during training: temperature, top-p and top-k are the trainer's (the policy is sampled as configured
    for RL); ``max_tokens`` and the stop strings are the agent's, since they are part of its protocol."""
    return replace(trainer, max_new_tokens=chat.max_tokens, stop_strings=tuple(chat.stop))


@dataclass
class TurnRecord:
    """One policy call of an episode. ``context_ids`` is everything the model saw; ``new_context`` is the
    part of it that was not already in the row it extends (the whole context when it starts a row)."""

    messages: list[Message]
    context_ids: list[int]
    new_context: list[int]
    generation: Generation
    extends_previous: bool
    call: PolicyCall | None = None


class TurnBatcher:
    """Collects the turns that concurrent episodes request and samples them in one engine call.

    Episodes announce themselves with :meth:`start` and leave with :meth:`end`; the pending turns go to the
    engine as soon as every live episode is waiting for one (with no announced episode, at once).
    """

    def __init__(self, engine: RolloutEngine, sampling: SamplingParams):
        self.engine, self.sampling = engine, sampling
        self._pending: list[tuple[int, list[int], SamplingParams, asyncio.Future]] = []
        self._live: set[int] = set()
        self.flushes = 0

    def start(self, episode: int) -> None:
        self._live.add(episode)

    def end(self, episode: int) -> None:
        self._live.discard(episode)
        self._maybe_flush()

    async def generate(self, episode: int, context_ids: list[int], sampling: SamplingParams) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((episode, context_ids, sampling, future))
        self._maybe_flush()
        return await future

    def _maybe_flush(self) -> None:
        if not self._pending or not {p[0] for p in self._pending} >= self._live:
            return
        pending, self._pending = self._pending, []
        self.flushes += 1
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
        return await self._complete_call(messages, sampling, None)

    async def _complete_call(self, messages: list[Message], sampling: Sampling, call: PolicyCall | None) -> Completion:
        if sampling.n != 1:
            raise PermanentLLMError("a training episode samples one reply per turn (n=1)")
        extension = self._extension(messages)
        if extension is None:
            context = self._encode(self.render(messages, True))
            new, extends = context, False
        else:
            (context, new), extends = extension, True
        window = getattr(self.batcher.engine, "context_window", None)
        if window is not None and len(context) >= window:  # refused here, so the rest of the batch still runs
            raise PermanentLLMError(f"the episode's context of {len(context)} tokens fills the rollout engine's "
                                    f"{window}-token window (train_policy.n_ctx)")
        gen = await self.batcher.generate(self.episode, context, engine_sampling(sampling, self.batcher.sampling))
        self.turns.append(TurnRecord(list(messages), context, new, gen, extends, call))
        text = gen.text if gen.text is not None else self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return Completion(texts=[text], model=self.name, prompt_tokens=len(context),
                          completion_tokens=len(gen.token_ids), finish_reasons=[gen.finish_reason])

    def reply_segments(self, index: int) -> list[RolloutSegment]:
        """The sampled tokens of turn ``index`` as segments: one non-trainable segment when its call is not
        trainable, else trainable segments split at the call's ``spans`` (default: the turn index)."""
        turn = self.turns[index]
        g, call = turn.generation, turn.call or PolicyCall()
        ids, lps = list(g.token_ids), g.logprobs
        if not call.trainable:
            return [RolloutSegment(ids, False, lps)]
        default = index if call.segment is None else call.segment
        spans = sorted(call.spans or [(0, default)])
        # a token belongs to the segment in which its first character falls
        starts, text_len = [], 0
        for j in range(len(ids)):
            starts.append(text_len)
            text_len = len(self.tokenizer.decode(ids[: j + 1], skip_special_tokens=False))
        out: list[RolloutSegment] = []
        for j, start in enumerate(starts):
            seg = next((s for off, s in reversed(spans) if start >= off), spans[0][1])
            if out and out[-1].segment_id == seg:
                out[-1].token_ids.append(ids[j])
                if lps is not None:
                    out[-1].logprobs.append(lps[j])
            else:
                out.append(RolloutSegment([ids[j]], True, None if lps is None else [lps[j]], seg))
        return out

    def rows(self) -> list[list[RolloutSegment]]:
        """The episode's training rows: turns that extend the previous one are appended to its row."""
        rows: list[list[RolloutSegment]] = []
        for i, turn in enumerate(self.turns):
            segs = [RolloutSegment(turn.new_context, False), *self.reply_segments(i)]
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
) -> Callable[[RolloutEngine, list[Any], int, SamplingParams], list[Episode]]:
    """A ``GRPOTrainer`` ``rollout_fn`` that runs ``group_size`` agent episodes per prompt item.

    ``make_agent(policy)`` builds the agent around an episode's policy; prompt items are
    :class:`Question` objects (or anything ``to_question`` maps to one). Each returned
    :class:`Episode` holds the episode's rows and ``info`` with ``episode``, ``trajectory`` (the full
    :class:`Trajectory`), ``final_answer`` and ``finish_reason``.
    """
    convert = to_question or (lambda item: item if isinstance(item, Question) else Question.model_validate(item))

    def rollout(engine: RolloutEngine, prompts: list[Any], group_size: int, sampling: SamplingParams) -> list[Episode]:
        batcher = TurnBatcher(engine, sampling)
        jobs = [(g, item) for g, item in enumerate(prompts) for _ in range(group_size)]

        async def episode(i: int, item: Any) -> tuple[Trajectory, EpisodePolicy]:
            policy = EpisodePolicy(batcher, tokenizer, i, render=render)
            try:
                trajectory = await make_agent(policy).run(convert(item))
            finally:
                batcher.end(i)
            return trajectory, policy

        async def run_all() -> list[tuple[Trajectory, EpisodePolicy]]:
            for i in range(len(jobs)):
                batcher.start(i)
            return list(await asyncio.gather(*(episode(i, item) for i, (_, item) in enumerate(jobs))))

        episodes = []
        for i, ((group, item), (trajectory, policy)) in enumerate(zip(jobs, asyncio.run(run_all()), strict=True)):
            rows = policy.rows()
            text = tokenizer.decode([t for row in rows for s in row if s.trainable for t in s.token_ids],
                                    skip_special_tokens=True)
            episodes.append(Episode(prompt=item, group=group, rows=rows, text=text, info={
                "episode": i, "trajectory": trajectory, "final_answer": trajectory.final_answer,
                "finish_reason": trajectory.finish_reason, "turns": len(policy.turns)}))
        return episodes

    return rollout
