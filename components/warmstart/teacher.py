"""Teacher episodes: the teacher role runs an agent (the evaluation agent, unchanged: ReAct, or RubricEM's
scaffold) on training questions, several samples per question, for rejection sampling (``rejection.select``).

Sample 0 of a question is greedy (the teacher's best guess); samples 1.. are drawn at ``temperature``
with seeds derived from ``seed``, so they differ from each other yet are reproducible and cacheable.
Whole episodes are bounded by ``concurrency`` (interleaved turns of many episodes would evict each other
from a local server's prompt cache).

    episodes = asyncio.run(teacher_episodes(pool.role("teacher"), [(q, toolbox), ...], params.agent,
                                            samples=2, temperature=0.7, seed=params.seed))
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from components.agents.params import AgentParams
from components.agents.react import agent_class
from components.llm.base import ChatModel
from components.schemas import Question, Trajectory


async def teacher_episodes(
    teacher: ChatModel, items: Sequence[tuple[Question, object]], settings: AgentParams, *, samples: int,
    temperature: float, seed: int, concurrency: int = 1, name: str = "teacher", progress=None,
    agent: str = "react", options: dict | None = None,
) -> list[tuple[Trajectory, Question]]:
    """``samples`` episodes per (question, toolbox) item, in item then sample order, by the agent registered
    as ``agent`` with keyword ``options``."""
    cls = agent_class(agent)
    greedy = settings.model_copy(update={"temperature": 0.0})
    sampled = settings.model_copy(update={"temperature": temperature})
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, s: int, question: Question, toolbox) -> tuple[Trajectory, Question]:
        runner = cls(teacher, toolbox.for_question(question), greedy if s == 0 else sampled,
                     **{**(options or {}), "name": name})
        async with gate:
            traj = await runner.run(question, seed=seed + 1000 * i + 100 * s)
        if progress is not None:
            progress.update(1)
        return traj, question

    jobs = [one(i, s, q, tb) for i, (q, tb) in enumerate(items) for s in range(samples)]
    return list(await asyncio.gather(*jobs))
