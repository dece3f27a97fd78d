"""The train_policy and sft stages on 2 data-parallel ranks (issue 75): ``torchrun --nproc_per_node 2 -m
tasks.train_policy`` under ``--profile paper --overlay smoke`` (tiny random Qwen2, the generated world, no warm
start) leaves one set of files in its folder, written once, one MLflow run holding both ranks' model calls, and a
response record with each request once: each rank wrote the checklists of its own share of the groups, as one
process writes them all. ``-m tasks.sft`` on 2 ranks (over the sft_data stage's trajectories) likewise.

    .venv/bin/python -m pytest -q tests/tasks/test_data_parallel_stage.py           # ~1.5 min: train_policy
    .venv/bin/python -m pytest -q tests/tasks/test_data_parallel_stage.py -m slow   # sft, ZeRO-3 recipe: ~1 min each

The variant is ``rar`` (a checklist written per question by the rubric_evaluator role, then a rating per
trajectory): its model calls go through the stage's pool, where ``grpo`` makes none.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import requires_embedded
from tests.reliability.kill import DATA, PARAMS, ROOT, SMOKE, Workspace, build_inputs, environment

pytestmark = requires_embedded  # the tiny model's tokenizer is read from the embedded 0.5B GGUF

STEPS = 2
FILES = ["adapter", "ckpt", "dev_after.jsonl", "dev_before.json", "dev_before.jsonl", "lineage.json", "metrics.csv",
         "metrics.json", "run_key.json", "timings.json"]


def run(ws: Workspace, module: str, *args: str, sets: tuple[str, ...] = (), ranks: int = 2) -> None:
    every = [*DATA, f"run.out_dir={ws.out_dir}", f"run.cache_dir={ws.cache_dir}",
             f"run.mlflow_tracking_uri=sqlite:///{ws.root / 'mlflow.db'}", f"run.mlflow_artifact_root={ws.root / 'mlruns'}",
             *sets]
    env = {**environment(), "RUBRICFLOW_MLFLOW": "1", "OMP_NUM_THREADS": "1", "RUBRICFLOW_RANK_TIMEOUT_S": "120"}
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    cmd = [sys.executable, *launch, "-m", module, *args, "--params", str(ws.root / PARAMS), *SMOKE,
           *(x for s in every for x in ("--set", s))]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]


def mlflow_runs(ws: Workspace):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{ws.root / 'mlflow.db'}")
    return mlflow.search_runs(search_all_experiments=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_inputs(tmp_path_factory.mktemp("dp") / "base", ["prepare", "index"])


@pytest.fixture(scope="module")
def two_ranks(base):
    ws = Workspace.fresh(base.root.parent / "two", base.root)
    run(ws, "tasks.train_policy", "--variant", "rar", sets=(
        "train_policy.warm_start.react=null", "train_policy.n_questions=2",  # one question (group) a rank
        *(f"{section}.{k}" for section in ("grpo", "arbor.shared.grpo")
          for k in ("prompts_per_step=2", f"steps={STEPS}", "checkpoint_every=1"))))
    return ws


def test_rank_0_alone_writes_the_stage_files(two_ranks):
    folder = two_ranks.out_dir / "train" / "rar"
    assert sorted(p.name for p in folder.iterdir()) == FILES
    # timings.json adds each invocation's time to the earlier ones': a second writer would have added its own
    assert len(json.loads((folder / "timings.json").read_text())["sessions_s"]) == 1
    csv = pd.read_csv(folder / "metrics.csv")
    assert csv["step"].tolist() == list(range(1, STEPS + 1)) and (csv["episodes"] == 4).all()  # both ranks' groups
    step = folder / "ckpt" / f"step_{STEPS:06d}"
    assert (step / "ranks" / "rank_00001" / "optimizer.pt").exists()
    assert json.loads((step / "trainer_state.json").read_text())["world_size"] == 2
    assert json.loads((folder / "metrics.json").read_text())["step"] == STEPS


def test_one_mlflow_run_counts_both_ranks_calls_and_the_record_holds_each_request_once(two_ranks):
    runs = mlflow_runs(two_ranks)
    assert runs["tags.mlflow.runName"].tolist() == ["train_policy@rar"]  # rank 0's run only
    csv = pd.read_csv(two_ranks.out_dir / "train" / "rar" / "metrics.csv")
    judged = float(csv["reward/checklist/calls"].sum() + csv["reward/judge/calls"].sum())  # the reward's own count
    assert judged >= 2  # a checklist for each of the 2 questions at least
    pool = [c for c in runs.columns if c.startswith("metrics.llm.") and c.endswith(".calls")]
    assert sum(runs[c].iloc[0] for c in pool) == judged  # the pools' counts, summed over the ranks
    keys = [json.loads(line)["key"] for line in
            (two_ranks.out_dir / "responses" / "train_policy" / "rar.jsonl").read_text().splitlines()]
    # greedy requests, each question's the same every step: one line per question, as one process records them
    assert len(keys) == len(set(keys)) == 2


@pytest.mark.slow
def test_the_full_fine_tuning_recipe_runs_on_two_ranks_under_zero3(base):
    """docs/data_parallel.md's recipe as written (``lora.r=0``, ``train_policy.deepspeed.zero_stage=3``,
    ``train_policy.engine=hf``; every parameter sharded here): rollouts and dev evaluations on each rank's share,
    one set of files, and the saved model the whole trained weights, as the checkpoint gathered them."""
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file

    ws = Workspace.fresh(base.root.parent / "zero3", base.root)
    run(ws, "tasks.train_policy", "--variant", "grpo", sets=(
        "lora.r=0", "train_policy.deepspeed.zero_stage=3", "train_policy.engine=hf",
        "train_policy.deepspeed.param_persistence_threshold=0", "train_policy.warm_start.react=null",
        "train_policy.n_questions=2", "grpo.prompts_per_step=2", f"grpo.steps={STEPS}", "grpo.checkpoint_every=1"))
    folder = ws.out_dir / "train" / "grpo"
    assert sorted(p.name for p in folder.iterdir()) == FILES
    assert (pd.read_csv(folder / "metrics.csv")["episodes"] == 4).all()  # both ranks' groups
    step = folder / "ckpt" / f"step_{STEPS:06d}"
    assert json.loads((step / "trainer_state.json").read_text())["world_size"] == 2
    saved = load_file(str(next((folder / "adapter").glob("*.safetensors"))))
    gathered = load_file(str(step / "weights" / "model.safetensors"))
    assert saved and all(saved[k].numel() > 0 for k in saved)  # ZeRO-3's shards were written as empty tensors
    assert all(bool((saved[k].float() == gathered[k].float()).all()) for k in saved)


@pytest.mark.slow
def test_sft_on_two_ranks_writes_its_files_once(base):
    """Two oracle trajectories, one a rank each step: rank 0 alone keys the folder, writes and logs."""
    ws = Workspace.fresh(base.root.parent / "sft", base.root)
    run(ws, "tasks.sft_data", sets=("sft.n_oracle=2",), ranks=1)
    ws_runs_before = len(mlflow_runs(ws))
    run(ws, "tasks.sft", sets=("sft.n_oracle=2", "sft.batch_size=2", "sft.epochs=2", "sft.max_steps=2",
                               "sft.checkpoint_every=1"))
    folder = ws.out_dir / "sft"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter", "ckpt", "loss.csv", "metrics.json", "run_key.json",
                                                       "timings.json"]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["rows"] == 2 and metrics["optimizer_steps"] == 2
    assert pd.read_csv(folder / "loss.csv")["step"].tolist() == [1, 2]
    assert (folder / "ckpt" / "step_000002" / "ranks" / "rank_00001" / "optimizer.pt").exists()
    runs = mlflow_runs(ws)
    assert len(runs) == ws_runs_before + 1 and "sft" in runs["tags.mlflow.runName"].tolist()
