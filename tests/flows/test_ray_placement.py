"""Placement of the sweep's tasks on Ray: training tasks ask for ``sweep.ray_gpus_per_training_task`` GPUs,
evaluation tasks for none. With a local Ray instance that declares one GPU (this machine has none; Ray only
counts it), two training runs and two evaluations submitted together: the second training run waits for the
first one's GPU slot while both evaluations run on CPUs meanwhile. The stubs record when they ran and what Ray
gave them; ``pytest -s`` prints the timeline and who waited for what.

The Ray test needs the ``ray`` extra (pip install -e '.[ray]') and skips without it."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

import pytest
from prefect import task

from components.params import SweepParams
from components.params_load import load_params
from components.params_section import ParamsError
from flows import sweep as sweep_module
from flows.placement import TRAINING_TASKS, ray_placement, ray_resources
from tests.reporting.helpers import dev, make_evaluation, make_run

HAS_RAY = importlib.util.find_spec("prefect_ray") is not None and importlib.util.find_spec("ray") is not None
TRAIN_S, EVAL_S = 6.0, 1.5  # the first training run holds the GPU for 6 s; evaluations fit well inside


def test_training_tasks_ask_for_gpus_and_the_rest_for_none():
    gpu = SweepParams(ray_gpus_per_training_task=1)
    assert TRAINING_TASKS == {"train_policy", "sft", "train_rubric_generator"}
    assert all(ray_resources(name, gpu) == {"num_gpus": 1} for name in TRAINING_TASKS)
    assert ray_resources("evaluate", gpu) == {} and ray_resources("report", gpu) == {}
    assert ray_resources("train_policy", SweepParams()) == {}  # the default: a CPU run asks for no GPU
    assert ray_resources("sft", SweepParams(ray_gpus_per_training_task=0.5)) == {"num_gpus": 0.5}
    with ray_placement("train_policy", gpu, "thread") as options:  # the thread runner has nothing to place
        assert options == {}


def test_gpu_counts_ray_cannot_take_are_refused(repo_root):
    with pytest.raises(ParamsError, match="ray_gpus_per_training_task"):
        load_params(repo_root / "params.yaml", overrides=["sweep.ray_gpus_per_training_task=1.5"])
    with pytest.raises(ParamsError, match="ray_gpus_per_training_task"):
        load_params(repo_root / "params.yaml", overrides=["sweep.ray_gpus_per_training_task=-1"])


def _record(kind: str, name: str, params, started: float) -> None:
    import ray

    context = ray.get_runtime_context()
    record = {"kind": kind, "name": name, "seed": params.seed, "start": started, "end": time.time(),
              "pid": os.getpid(), "resources": context.get_assigned_resources(),
              "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    with open(os.environ["STUB_CALLS"], "a") as fh:
        fh.write(json.dumps(record) + "\n")


@task(name="train_policy")
def slow_train(params, variant: str = "grpo", parent_run_id: str | None = None):
    started = time.time()
    time.sleep(TRAIN_S)
    rng = random.Random(f"{variant}-{params.seed}")
    make_run(Path(params.run.out_dir) / "train" / variant, [round(rng.random(), 6) for _ in range(4)],
             final=dev(0.1, 0.2, 0.1, 0.2), wall_s=TRAIN_S)
    _record("train", variant, params, started)


@task(name="evaluate")
def quick_evaluate(params, method: str = "react", parent_run_id: str | None = None):
    started = time.time()
    time.sleep(EVAL_S)
    make_evaluation(Path(params.run.out_dir) / "eval" / method, {"n": 5.0, "em": 0.5, "f1": 0.5})
    _record("eval", method, params, started)


@pytest.fixture
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=600):
        yield


@pytest.mark.skipif(not HAS_RAY, reason="needs the ray extra (pip install -e '.[ray]')")
def test_training_waits_for_the_gpu_slot_while_evaluations_run(prefect_api, repo_root, tmp_path, monkeypatch):
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this test module
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    monkeypatch.setenv("STUB_CALLS", str(calls))
    monkeypatch.setattr(sweep_module, "STAGES", {"train": slow_train, "eval": quick_evaluate})
    made_runner = sweep_module.task_runner

    def one_declared_gpu(runner, settings):  # the local instance counts one GPU this machine does not have
        pool = made_runner(runner, settings)
        pool.init_kwargs["num_gpus"] = 1
        return pool

    monkeypatch.setattr(sweep_module, "task_runner", one_declared_gpu)
    out = tmp_path / "out"
    for folder in ("data", "index", "sft/adapter"):
        (out / folder).mkdir(parents=True)
    (out / "data" / "train.jsonl").write_text("the questions\n")
    params = load_params(repo_root / "params.yaml", overrides=[
        f"run.out_dir={out}", "grpo.steps=4", "sweep.final_steps=2", "sweep.workers=4",
        "sweep.ray_gpus_per_training_task=1"])
    assert not ray.is_initialized()
    try:
        sweep_module.sweep(params, variants=["grpo", "dapo"], methods=["sft", "coreact"], seeds=[1], runner="ray")
    finally:
        if ray.is_initialized():
            ray.shutdown()

    runs = [json.loads(line) for line in calls.read_text().splitlines()]
    trains = sorted((r for r in runs if r["kind"] == "train"), key=lambda r: r["start"])
    evals = sorted((r for r in runs if r["kind"] == "eval"), key=lambda r: r["start"])
    assert len(trains) == 2 and len(evals) == 2
    first, second = trains
    t0 = min(r["start"] for r in runs)

    print("\nRay placement (a local instance: 4 CPUs, 1 declared GPU); times in s from the first start")
    for r in sorted(runs, key=lambda r: r["start"]):
        label = f"{'train_policy' if r['kind'] == 'train' else 'evaluate'}@{r['name']}"
        print(f"  {label:22s} start {r['start'] - t0:6.2f}  end {r['end'] - t0:6.2f}  pid {r['pid']}  "
              f"resources {r['resources']}  gpu_ids {r['gpu_ids']}  CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']}")
    print(f"  train_policy@{second['name']} waited for the GPU held by train_policy@{first['name']}: it started "
          f"{second['start'] - first['end']:.2f} s after that run ended ({second['start'] - t0:.2f} s in)")
    for e in evals:
        print(f"  evaluate@{e['name']} asked for no GPU and waited for none: ran {e['start'] - t0:.2f}-"
              f"{e['end'] - t0:.2f} s on a CPU, beside train_policy@{first['name']}'s GPU hold "
              f"({first['start'] - t0:.2f}-{first['end'] - t0:.2f} s), before train_policy@{second['name']} started")

    for r in trains:  # each training run got the one GPU, and Ray pointed CUDA at it
        assert r["resources"].get("GPU") == 1.0 and r["gpu_ids"] == ["0"] and r["cuda_visible_devices"] == "0"
    for r in evals:
        assert "GPU" not in r["resources"] and r["gpu_ids"] == []
    assert second["start"] >= first["end"]  # one GPU slot: the training runs never overlap
    for e in evals:  # the evaluations did not queue behind the GPU: they ran while the first run held it
        assert e["start"] < first["end"] and e["end"] <= second["start"]
    assert (out / "sweep" / "comparison.csv").exists()  # the sweep still compared every run
