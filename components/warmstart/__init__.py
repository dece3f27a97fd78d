"""The SFT warm start's data: trajectories in the agent's own format from the world oracle and from the
teacher role, rejection-sampled. Run as the ``sft_data`` stage (``python -m tasks.sft_data``).

Modules: ``worlds`` (training worlds from other seeds, with their corpus, index and toolbox), ``oracle``
(the gold chain followed through the real tools, recorded by the ReAct agent), ``thoughts`` (the oracle's
varied short thoughts), ``teacher`` (the teacher running the agent, several samples per question),
``rejection`` (what is kept, and every rejection with its reason), ``formats`` (the turn formats a warm start is
written in: ReAct here, RubricEM's scaffold registered by its package, whose
``warmstart_reflections`` adds the teacher's reflections for its meta-policy).

    from components.warmstart import oracle_trajectory, select
    traj = asyncio.run(oracle_trajectory(question, toolbox.for_question(question), params.agent))
    kept, rejected = select([(traj, question, "oracle")], min_f1=params.sft.min_f1)
"""

from components.warmstart.oracle import OracleEpisodeError, oracle_episodes, oracle_trajectory, plan_turns
from components.warmstart.rejection import REASONS, Rejection, grounded, problems, select
from components.warmstart.teacher import teacher_episodes
from components.warmstart.worlds import TrainingWorld, build_training_world, training_seeds

__all__ = [
    "REASONS",
    "OracleEpisodeError",
    "Rejection",
    "TrainingWorld",
    "build_training_world",
    "grounded",
    "oracle_episodes",
    "oracle_trajectory",
    "plan_turns",
    "problems",
    "select",
    "teacher_episodes",
    "training_seeds",
]
