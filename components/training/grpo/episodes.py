"""The contract between a rollout, a reward and a method: episodes, scores with missing values, step hooks.

One trainer step sees a list of :class:`Episode` objects: one per sampled trajectory, whatever the history
format (a chat-history agent episode is one token row, a scratchpad episode one row per turn, a single-turn
completion one row). A reward is a callable over the whole step::

    async def reward_fn(episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        ...                                    # may be a plain function too
        return RewardOutput(scores=[0.5, None, [1.0, None, 0.0], ...], metrics={"judge/calls": 12})

A score is a float, ``None`` (nothing could be scored: a failed judge), or one value per stage/step
(RubricEM's stages, ARCO's steps) in which any value may be ``None``. Missing values are NaN in the
``[n, K]`` score matrix: they are left out of the group normalisation and their tokens out of the loss;
an episode with nothing scored is dropped from the step and counted. Never a 0.

A :class:`MethodState` (rubric memory, judge buffers, banks, a rubric model) is saved inside every
checkpoint and may implement ``on_step_end(trainer, ctx, episodes, scores)``: the place for ARBOR's
memory lifecycle, RubricEM's bank and buffers, or ARCO's rubric-model update; metrics it returns join the
step's metrics.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from components.training.engines.rollout import RolloutSegment

__all__ = [
    "Episode",
    "MethodState",
    "RewardFn",
    "RewardOutput",
    "Score",
    "StepContext",
    "call_reward",
    "score_matrix",
]

Score = float | None | Sequence[float | None]


@dataclass
class Episode:
    """One sampled trajectory of a step: the dataset item it answers, its group (the prompt's index in
    the step), its token rows (each a list of segments; observations and prompts are not trainable),
    the decoded response text when known, and ``info`` for rewards (``trajectory``, ``final_answer``...)."""

    prompt: Any
    group: int
    rows: list[list[RolloutSegment]]
    text: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def response_ids(self) -> list[int]:
        """Every trainable token of the episode, in order."""
        return [t for row in self.rows for s in row if s.trainable for t in s.token_ids]


@dataclass
class StepContext:
    """What a reward, an advantage function and a method hook know about the step being run."""

    step: int  # 1-based number of the step being run
    groups: list[int]  # group of each episode, in order
    method: Any = None  # the run's MethodState (None when the method keeps none)
    metrics: dict[str, float] = field(default_factory=dict)  # filled as the step runs


@dataclass
class RewardOutput:
    """Scores (one per episode, see :data:`Score`) and the reward's own metrics (judge calls, failures...)."""

    scores: list[Score]
    metrics: dict[str, float] = field(default_factory=dict)


RewardFn = Callable[[list[Episode], StepContext], "RewardOutput | Sequence[Score] | Awaitable[Any]"]


@runtime_checkable
class MethodState(Protocol):
    """Method-specific state stored inside each checkpoint (rubric memory, judge buffers, banks).

    Optional members: ``write_files(folder)`` for state that is not JSON,
    ``on_step_end(trainer, ctx, episodes, scores) -> dict | None`` run after each update,
    ``on_train_end(trainer, ctx) -> dict | None`` run once the last step is done, for work a method defers
    past a step (RubricEM's reflection batch is judged during the next step; the last one lands here), and
    ``attach(trainer)``, called once when the trainer is built (before ``resume``), so a method can share
    the policy's model (a second adapter on the same base) instead of loading its own copy.
    On N data-parallel ranks a method needs ``rank_share() -> Any`` (what this rank's reward left in it for the
    draw, taken: picklable) and ``merge_ranks(parts)`` (every rank's shares in rank order, merged the same way on
    every rank); its hooks then run on rank 0 alone and the others load its ``state_dict`` with the files its
    ``write_files`` wrote on rank 0 (``files_dir`` a folder holding them, None when there are none).
    A method without them is refused there, with its ``not_data_parallel`` reason when it gives one.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any] | None, files_dir: Path | None) -> None: ...


def call_reward(reward_fn: RewardFn, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
    """Run a sync or async reward and normalise what it returns into a :class:`RewardOutput`."""
    out = reward_fn(episodes, ctx)
    if inspect.isawaitable(out):
        out = asyncio.run(_await(out))
    if not isinstance(out, RewardOutput):
        out = RewardOutput(scores=list(out))
    if len(out.scores) != len(episodes):
        raise ValueError(f"reward_fn returned {len(out.scores)} scores for {len(episodes)} episodes")
    return out


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _value(v: Any, where: str) -> float:
    if v is None:
        return math.nan
    x = float(v)
    if math.isnan(x):
        raise ValueError(f"{where}: NaN score; return None for a missing value")
    return x


def score_matrix(scores: Sequence[Score]) -> torch.Tensor:
    """``[n, K]`` float tensor with NaN where a value is missing. Scalars and ``None`` give ``K == 1``;
    per-stage lists must all have the same length K (a ``None`` episode becomes a row of NaN)."""
    lengths = {len(s) for s in scores if s is not None and not isinstance(s, (int, float))}
    if len(lengths) > 1:
        raise ValueError(f"per-segment scores of different lengths in one step: {sorted(lengths)}")
    if lengths and any(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
        raise ValueError("a step mixes scalar and per-segment scores")
    k = lengths.pop() if lengths else 1
    rows = []
    for i, s in enumerate(scores):
        if s is None:
            rows.append([math.nan] * k)
        elif isinstance(s, (int, float)):
            rows.append([_value(s, f"episode {i}")])
        else:
            rows.append([_value(v, f"episode {i} segment {j}") for j, v in enumerate(s)])
    return torch.tensor(rows, dtype=torch.float32).reshape(len(scores), k)


def run_method_hook(method: Any, name: str, *args: Any) -> dict[str, float]:
    """Call ``method.<name>(*args)`` (``on_step_end`` or ``on_train_end``) when the method has it, sync or
    async; its metrics are prefixed ``method/``."""
    hook = getattr(method, name, None)
    if hook is None:
        return {}
    out = hook(*args)
    if inspect.isawaitable(out):
        out = asyncio.run(_await(out))
    return {f"method/{k}": float(v) for k, v in (out or {}).items()}
