"""The stages issue 48 kills with -9: collect, sft, train_policy for one variant of each method, evaluate and the
sweep, each under the smoke overlay with counts raised so that there is something between the first record and
the last (three questions, three optimizer steps with a checkpoint after each), and the kill points each is
killed at (the default suite takes the first of each family; ``-m slow`` and scripts/kill_table.py take all).

UPSTREAM lists the smoke DAG's stages the cases read, built once into a base out_dir (:func:`kill.build_inputs`).
``train_policy@grpo-2ranks`` is train_policy@grpo on 2 data-parallel ranks (issue 75): torchrun's worker of rank 1
is the one killed, mid-step (its rollout or its update of step 2); the launcher must stop rank 0 (a collective
with the dead peer fails at once, or after ``RUBRICFLOW_RANK_TIMEOUT_S``: 60 s here) and exit, and 2 ranks resume.
"""

from __future__ import annotations

import random

from tests.reliability.kill import Case, KillPoint, checkpoint_step, count_lines, total

UPSTREAM = ["sft", "sft_scaffold", "index"]
"""Every case's inputs: data, index and both warm starts (sft_data and sft_data_scaffold come with them)."""

STEPS = 2


def _train(variant: str, section: str | None, *extra: str) -> Case:
    sets = [f"grpo.steps={STEPS}", "grpo.checkpoint_every=1", *extra]
    if section is not None:  # the method's `shared` grpo block (paper values) is applied over grpo: raise it there
        sets += [f"{section}.shared.grpo.steps={STEPS}", f"{section}.shared.grpo.checkpoint_every=1"]
    return Case(name=f"train_policy@{variant}", family="train_policy",
                args=("-m", "tasks.train_policy", "--variant", variant), sets=tuple(sets),
                folders=(f"train/{variant}",), progress=checkpoint_step("train", variant, "ckpt"), unit="step")


def _two_ranks(variant: str) -> Case:
    one = _train(variant, None, "grpo.prompts_per_step=2", "train_policy.n_questions=2")  # one group a rank
    return Case(name=f"{one.name}-2ranks", family="train_policy",
                args=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *one.args),
                sets=one.sets, folders=one.folders, progress=one.progress, unit=one.unit, victim=1,
                env=(("RUBRICFLOW_RANK_TIMEOUT_S", "60"), ("OMP_NUM_THREADS", "1")))


SWEEP_DIR = ("sweep", "seed_1")

CASES: dict[str, Case] = {c.name: c for c in [
    Case(name="collect", family="collect", args=("-m", "tasks.collect"), sets=("collect.n_questions=3",),
         folders=("collect",), progress=count_lines("collect", "shard-0-of-1", "done.jsonl"), unit="question"),
    Case(name="sft", family="sft", args=("-m", "tasks.sft"),
         sets=("sft.epochs=3", f"sft.max_steps={STEPS}", "sft.checkpoint_every=1"),
         folders=("sft",), progress=checkpoint_step("sft", "ckpt"), unit="step"),
    _train("grpo", None),
    _train("arbor", "arbor"),
    _train("rubricem", "rubricem"),
    # the paper profile runs ARCO only on its released setup, whose n_train is the smoke overlay's 2 (it trains
    # on train_policy.n_questions=1 of the three prepared questions either way)
    _train("arco", "arco", "data.n_train=2"),
    _two_ranks("grpo"),
    Case(name="evaluate@sft", family="evaluate", args=("-m", "tasks.evaluate", "--method", "sft"),
         sets=("evaluation.n_questions=3",), folders=("eval/sft",),
         progress=count_lines("eval", "sft", "trajectories.jsonl"), unit="episode"),
    Case(name="sweep", family="sweep",
         args=("-m", "flows.sweep", "--variants", "grpo", "--methods", "sft", "--seeds", "1", "--runner", "thread"),
         sets=(f"grpo.steps={STEPS}", "grpo.checkpoint_every=1", "evaluation.n_questions=3", "sweep.workers=1"),
         folders=("sweep",),
         progress=total(checkpoint_step(*SWEEP_DIR, "train", "grpo", "ckpt"),
                        count_lines(*SWEEP_DIR, "eval", "sft", "trajectories.jsonl")),
         unit="record",
         # the flow's Prefect threads draw from python's global generator while the training runs (one draw a
         # step, more or fewer before the first by thread timing), so its position in a checkpoint is not a
         # function of the seed even uninterrupted; training never reads it (tensors and metrics are compared)
         unchecked=(("rng.json", "python"),)),
]}


def kill_points(case: Case, seed: int = 0) -> list[list[KillPoint]]:
    """The runs each case is killed in: a list per killed-and-resumed run, of the points it is killed at one
    after another (each restart resumed, then killed again at the next). After the first record; at a share of
    the uninterrupted run's wall time drawn from an RNG seeded with the case's name; and twice in one run, after
    records 1 and 2 (the sweep: within its training run, then after its evaluation's first episode)."""
    rng = random.Random(f"{seed}:{case.name}")
    twice = [KillPoint(after=2), KillPoint(after=STEPS + 1)] if case.family == "sweep" else \
        [KillPoint(after=1), KillPoint(after=2)]
    return [[KillPoint(after=1)], [KillPoint.random(rng)], twice]
