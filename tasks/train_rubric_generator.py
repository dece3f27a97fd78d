"""Stage `train_rubric_generator` (Co-ReAct 3.2): GRPO of the rubric generator on the collected branching points
(outputs/collect/branching_points.parquet) through the one GRPO trainer, G single-turn rubrics per point rewarded
by the listwise Spearman reward (or the pairwise one, the "w/o listwise" ablation), from the ``trainable_policy``
role's base with a fresh LoRA (after an oracle-rubric SFT warm start with ``rubric_generator.warm_start=oracle``),
with the held-out Spearman measured before and after. The recipe is
:mod:`components.methods.coreact.generator_training`; what it writes: :func:`train_rubric_generator`.

    python -m tasks.train_rubric_generator [--reward pairwise] [--set rubric_generator.epochs=2]
"""

from __future__ import annotations

import time

from prefect import task

from components.io import read_parquet, write_json
from components.llm.factory import LLMPool
from components.methods.coreact.generator_reward import evaluator_model
from components.methods.coreact.generator_training import GeneratorRun, RewardKind, RubricTrainResult
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.run_files import keep_record, out_path, record_path
from components.schemas import BranchingPoint
from tasks.runtime import resolve, tracking


@task(name="train_rubric_generator")
def train_rubric_generator(params: Params | None = None, reward: RewardKind = "listwise",
                           parent_run_id: str | None = None, pool: LLMPool | None = None) -> RubricTrainResult:
    """Train the generator for ``reward`` and write outputs/train_rubric_generator/<reward>/: ``adapter/`` (everything
    training changed, served as ``rubric_generator_trained`` / ``rubric_generator_pairwise``; after a warm start its
    adapter and GRPO's joined by peft's ``add_weighted_adapter(..., combination_type="cat")``, which adds their deltas
    exactly), ``warm_start/`` (always, so DVC clears it with the stage: ``metrics.json`` with ``kind`` none or
    oracle, and after an oracle warm start its ``adapter/``, ``ckpt/``, ``heldout.json`` and ``grpo_adapter/``),
    ``ckpt/``, ``metrics.csv`` (a row per step: the reward and its terms, evaluator calls and failures),
    ``heldout.json`` (held-out Spearman before, after the warm start and after training, greedy and sampled, each
    rubric with its rho; ``change``, ``change_unparsed_as_chance``, ``change_grpo[_...]``), ``metrics.json`` and
    ``timings.json``. The oracle warm start trains on gold-chain rubrics
    (:mod:`components.methods.coreact.oracle_rubrics`) at the training points and every prefix of outputs/sft_data's
    trajectories; GRPO's KL reference is then the warm start. With no usable branching point the untrained LoRA is
    written as the adapter, the other files say ``skipped`` and why, and a warning names it."""
    params = resolve(params)
    from components.training.checkpoint import seed_rngs

    seed_rngs(params.seed)  # python, numpy and torch: what a checkpoint saves and a resumed run restores
    points = read_parquet(out_path(params.run, "collect", "branching_points.parquet"), BranchingPoint)
    folder = out_path(params.run, "train_rubric_generator", reward, "metrics.json").parent
    own_pool = pool is None
    pool = pool or LLMPool(params, record_path=record_path(params.run, f"train_rubric_generator@{reward}"))
    started = time.perf_counter()
    try:
        with GeneratorRun(params) as run, \
                tracking(params, f"train_rubric_generator@{reward}", parent_run_id, tags={"reward": reward}) as tracker:
            tracker.log_params({"reward": reward, "rubric_generator": params.rubric_generator.model_dump(),
                                "lora": params.lora.model_dump()})
            result = run.train(points, evaluator_model(pool.role, params.rubric_generator), folder, reward=reward,
                               on_metrics=lambda step, metrics: tracker.log_metrics(metrics, step=step))
            write_json(folder / "timings.json", {"wall_s": time.perf_counter() - started})
            keep_record(params.run, f"train_rubric_generator@{reward}")
            tracker.log_metrics({k: v for k, v in result.metrics.items() if k.startswith("heldout")})
            tracker.log_metrics(pool.accounting.metrics())
            tracker.log_artifact(folder / "metrics.csv")
            tracker.log_artifact(folder / "heldout.json")
    finally:
        if own_pool:
            pool.close()
    return result


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--reward", choices=["listwise", "pairwise"], default="listwise")
    args = parser.parse_args()
    print(train_rubric_generator.fn(params_from_args(args), reward=args.reward).model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
