"""Stage `train_policy@<variant>`: GRPO of the search agent from the warm start, with a method's variant
(grpo, dapo, each method's own, and each method's matched baselines: grpo_arbor, dapo_arbor, scaffold_grpo,
grpo_arco) plugged into the one trainer. A method's variants and its matched baselines train under the method's
settings (its ``shared`` block); dapo under the ``dapo`` section (components.variants.variant_params).

    python -m tasks.train_policy --variant grpo [--set grpo.steps=4]
    torchrun --nproc_per_node 2 -m tasks.train_policy --variant grpo   # data-parallel: docs/data_parallel.md

Reads outputs/data/train.jsonl, the corpus and index, and the warm-start adapter of the variant's agent
(``train_policy.warm_start``: react -> the ``sft`` stage's, scaffold -> ``sft_scaffold``'s; merged into the base
so the KL reference is the warm-started policy).
Writes under outputs/train/<variant>/: adapter/ (the RL LoRA over the merged base), ckpt/ (resumable:
weights, optimizer, scheduler, RNG, data position, method state), metrics.csv (one row per step; a DVC
plot) and metrics.json (last step, plus ``dev_before.*`` / ``dev_after.*``: EM, F1, answered rate and
search-budget endings of greedy episodes on ``train_policy.eval_questions`` dev questions, served by the
same rollout engine before the first and after the last update, batch-invariant by default:
``train_policy.eval_batch_invariant``), dev_{before,after}.jsonl (those trajectories). Fresh runs that
start from the same weights and evaluate the same way (the variants of one warm start in a sweep) measure
``dev_before`` once and share it through ``run.cache_dir``/dev_before/ (batch-invariant evaluations only).

``--set train_policy.branch_from=outputs/train/arco/ckpt/step_000001`` starts a run from another run's
checkpoint (an ablation sharing that run's first steps); its ``dev_before`` is then the policy at the branch
point, and its metrics.csv starts with the source run's steps. The recipe is
:class:`components.policy_run.PolicyRun`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

from prefect import task
from pydantic import BaseModel

from components.io import read_jsonl, write_json
from components.llm.accounting import Accounting
from components.llm.factory import LLMPool
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.policy_run import PolicyRun, accumulated_timings
from components.run_files import keep_record, out_path, record_path
from components.schemas import Question
from components.training.distributed import current_ranks
from components.variants import VARIANTS, get_variant, variant_params
from tasks.runtime import NullTracker, resolve, run_toolbox, tracking


class TrainResult(BaseModel):
    variant: str
    adapter: str
    metrics: dict[str, float]


@task(name="train_policy")
def train_policy(params: Params | None = None, variant: str = "grpo", parent_run_id: str | None = None,
                 pool: LLMPool | None = None) -> TrainResult:
    params = variant_params(resolve(params), variant)  # its method's (or dapo's) settings over the shared blocks
    from components.training.checkpoint import seed_rngs

    seed_rngs(params.seed)  # python, numpy and torch: what a checkpoint saves and a resumed run restores
    if params.run.torch_threads:  # as the sft stage: OpenMP threads spinning against a busy machine slow a step
        import torch

        torch.set_num_threads(params.run.torch_threads)
    get_variant(variant)  # an unknown variant fails here, before any input is read
    ranks = current_ranks()  # under torchrun: rank 0 alone writes, logs and publishes; rank 0 of 1 without
    questions = read_jsonl(out_path(params.run, "data", "train.jsonl"), Question)[params.train_policy.question_slice()]
    toolbox = run_toolbox(params)
    folder = out_path(params.run, "train", variant, "metrics.json").parent
    own_pool = pool is None
    pool = pool or LLMPool(params, record_path=record_path(params.run, f"train_policy@{variant}"))
    started = time.perf_counter()
    try:
        with PolicyRun(params, variant, pool.role, toolbox, folder) as run, \
                (tracking(params, f"train_policy@{variant}", parent_run_id, tags={"method": variant, "variant": variant})
                 if ranks.main else nullcontext(NullTracker())) as tracker:
            tracker.log_params({"variant": variant, "grpo": params.grpo.model_dump(), "lora": params.lora.model_dump(),
                                "train_policy": params.train_policy.model_dump(), "agent": params.agent.model_dump()})
            dev = read_jsonl(out_path(params.run, "data", "dev.jsonl"), Question)[: params.train_policy.eval_questions]
            last = run.train(questions, dev, on_metrics=lambda step, metrics: tracker.log_metrics(metrics, step=step),
                             calls=lambda: sum(s.calls for s in pool.accounting.roles.values()))
            usage = Accounting()  # every rank's model calls: each rank judged its own episodes
            usage.roles = ranks.sum_fields(pool.accounting.roles)
            if ranks.main:
                if dev:
                    tracker.log_metrics({k: v for k, v in last.items() if k.startswith("dev_")})
                write_json(folder / "metrics.json", last)
                keep_record(params.run, f"train_policy@{variant}")
                write_json(folder / "timings.json",
                           accumulated_timings(folder / "timings.json", time.perf_counter() - started))
                tracker.log_metrics(usage.metrics())
                tracker.log_artifact(folder / "metrics.csv")
                for snapshots in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in ("ckpt", "adapter")):
                    tracker.log_artifact(snapshots, artifact_path=f"method_state/{snapshots.name}")  # memories, banks
            ranks.barrier()  # the other ranks end once rank 0's files are written
    finally:
        if own_pool:
            pool.close()
    return TrainResult(variant=variant, adapter=str(folder / "adapter"), metrics=last)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--variant", default="grpo", help=f"one of {VARIANTS.names()}")
    args = parser.parse_args()
    print(train_policy.fn(params_from_args(args), variant=args.variant).model_dump_json(indent=2))


if __name__ == "__main__":
    main()
