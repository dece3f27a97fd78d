"""The sweep flow with a stub train task: every (variant, seed) runs once in its own folder, with its seed and
the main job's inputs linked in, the report compares exactly the runs that finished, overrides reach the runs,
and the thread and Ray runners give the same comparison."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from prefect import task
from prefect.testing.utilities import prefect_test_harness

from components.params_load import load_params
from components.params_section import ParamsError
from flows import sweep as sweep_module
from tests.reporting.helpers import dev, make_evaluation, make_run


def expected(variant: str, seed: int, steps: int) -> dict:
    """What the stub run of (variant, seed) reports: a function of them only."""
    rng = random.Random(f"{variant}-{seed}")
    rewards = [round(rng.random(), 6) for _ in range(steps)]
    before, after = round(rng.random(), 6), round(rng.random(), 6)
    return {"rewards": rewards, "dev": dev(before, after, before, after)}


@task(name="train_policy")
def stub_train(params, variant: str = "grpo", parent_run_id: str | None = None, pool=None):
    out = Path(params.run.out_dir)
    inputs = (out / "data" / "train.jsonl").read_text()  # the main job's data, seen through the seed folder
    if variant == os.environ.get("STUB_FAIL_VARIANT") and params.seed == int(os.environ.get("STUB_FAIL_SEED", "-1")):
        raise RuntimeError("stub run crashed")
    time.sleep(float(os.environ.get("STUB_TRAIN_SLEEP", "0")))  # long enough for a parallel evaluation to overtake
    want = expected(variant, params.seed, params.grpo.steps)
    make_run(out / "train" / variant, want["rewards"], final=want["dev"], wall_s=10.0)
    record = {"variant": variant, "seed": params.seed, "out_dir": str(out), "inputs": inputs, "pid": os.getpid()}
    with open(os.environ["STUB_CALLS"], "a") as fh:  # one line per call, appended across threads and processes
        fh.write(json.dumps(record) + "\n")
    return record


@task(name="evaluate")
def stub_evaluate(params, method: str = "react", parent_run_id: str | None = None, pool=None):
    out = Path(params.run.out_dir)
    rng = random.Random(f"{method}-{params.seed}")
    make_evaluation(out / "eval" / method, {"n": 5.0, "em": round(rng.random(), 6), "f1": 0.5})
    with open(os.environ["STUB_CALLS"], "a") as fh:
        fh.write(json.dumps({"method": method, "seed": params.seed, "out_dir": str(out),
                             "trained_first": (out / "train" / method).is_dir()}) + "\n")
    return {}


def calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def prefect_api():
    """A Prefect API on a throwaway database for this module's flow runs (the task runners need one)."""
    with prefect_test_harness(server_startup_timeout=600):
        yield


@pytest.fixture
def base(repo_root, tmp_path, monkeypatch):
    """``base(name)``: params whose run.out_dir holds (fake) outputs of the main job, MLflow off, and the stub
    in place of train_policy."""
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    monkeypatch.setenv("STUB_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setattr(sweep_module, "STAGES", {"train": stub_train, "eval": stub_evaluate})

    def make(name: str = "out", *overrides: str):
        out = tmp_path / name
        for folder in ("data", "index", "sft/adapter", "train_rubric_generator/listwise/adapter"):
            (out / folder).mkdir(parents=True)
        (out / "data" / "train.jsonl").write_text("the questions\n")
        return load_params(repo_root / "params.yaml", overrides=[f"run.out_dir={out}", "grpo.steps=4",
                                                                  "sweep.final_steps=2", *overrides])

    return make


def test_every_variant_and_seed_runs_once_in_its_own_folder_and_is_reported(prefect_api, base, tmp_path):
    params = base()
    metrics = sweep_module.sweep(params, variants=["grpo", "dapo"], seeds=[1, 2], runner="thread")
    made = calls(tmp_path / "calls.jsonl")
    assert sorted((c["variant"], c["seed"]) for c in made) == [("dapo", 1), ("dapo", 2), ("grpo", 1), ("grpo", 2)]
    sweep_dir = tmp_path / "out" / "sweep"
    for c in made:
        assert c["out_dir"] == str(sweep_dir / f"seed_{c['seed']}")
        assert c["inputs"] == "the questions\n"
        seed_dir = sweep_dir / f"seed_{c['seed']}"
        assert (seed_dir / "sft" / "adapter").is_dir()  # the warm start is linked too, and every trained adapter
        assert (seed_dir / "train_rubric_generator").is_symlink() and not (seed_dir / "sft_scaffold").exists()
    assert len({(c["out_dir"], c["variant"]) for c in made}) == 4
    for variant in ("grpo", "dapo"):
        runs = [expected(variant, seed, 4) for seed in (1, 2)]
        assert metrics[variant]["dev_after.em"] == pytest.approx(sum(r["dev"]["dev_after.em"] for r in runs) / 2)
        assert metrics[variant]["reward_final"] == pytest.approx(sum(sum(r["rewards"][-2:]) / 2 for r in runs) / 2)
    table = pd.read_csv(sweep_dir / "comparison.csv", index_col=0)
    assert list(table.index) == ["grpo", "dapo"] and list(table["seeds"]) == [2, 2]
    assert (sweep_dir / "comparison.png").stat().st_size > 10_000


def test_a_failed_run_is_left_out_and_named(prefect_api, base, tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_FAIL_VARIANT", "dapo")
    monkeypatch.setenv("STUB_FAIL_SEED", "2")
    with pytest.raises(RuntimeError, match="1 of 4 sweep runs failed.*dapo@seed_2"):
        sweep_module.sweep(base(), variants=["grpo", "dapo"], seeds=[1, 2], runner="thread")
    table = pd.read_csv(tmp_path / "out" / "sweep" / "comparison.csv", index_col=0)
    assert table.loc["grpo", "seeds"] == 2 and table.loc["dapo", "seeds"] == 1
    assert table.loc["dapo", "dev_after.em"] == pytest.approx(expected("dapo", 1, 4)["dev"]["dev_after.em"])


def test_defaults_come_from_the_sweep_section_and_overrides_reach_the_runs(prefect_api, base, tmp_path):
    params = base("out", "sweep.variants=[dapo]", "sweep.seeds=[7]", "sweep.out_dir=nightly")
    metrics = sweep_module.sweep(params, overrides=["grpo.steps=3"])
    made = calls(tmp_path / "calls.jsonl")
    assert [(c["variant"], c["seed"]) for c in made] == [("dapo", 7)]
    assert made[0]["out_dir"] == str(tmp_path / "out" / "nightly" / "seed_7")
    assert metrics["dapo"]["steps"] == 3


def test_methods_alone_are_evaluated_per_seed_and_compared_without_training(prefect_api, base, tmp_path):
    metrics = sweep_module.sweep(base(), methods=["sft", "coreact"], seeds=[1, 2], runner="thread")
    made = calls(tmp_path / "calls.jsonl")
    assert sorted((c.get("variant"), c.get("method"), c["seed"]) for c in made) == [
        (None, "coreact", 1), (None, "coreact", 2), (None, "sft", 1), (None, "sft", 2)]
    sweep_dir = tmp_path / "out" / "sweep"
    ems = [random.Random(f"coreact-{seed}").random() for seed in (1, 2)]
    assert metrics["coreact"]["em"] == pytest.approx(sum(ems) / 2, abs=1e-6)
    table = pd.read_csv(sweep_dir / "methods.csv", index_col=0)
    assert list(table.index) == ["sft", "coreact"] and list(table["seeds"]) == [2, 2]
    assert not (sweep_dir / "comparison.csv").exists()  # nothing trained


def test_variants_and_methods_together_give_both_comparisons(prefect_api, base, tmp_path):
    metrics = sweep_module.sweep(base(), variants=["grpo"], methods=["sft"], seeds=[3], runner="thread")
    assert {"grpo", "sft"} <= set(metrics)
    sweep_dir = tmp_path / "out" / "sweep"
    assert (sweep_dir / "comparison.csv").exists() and (sweep_dir / "methods.csv").exists()
    assert (sweep_dir / "seed_3" / "eval" / "sft" / "metrics.json").exists()


def test_a_variant_named_among_the_methods_is_evaluated_after_this_sweep_trains_it(prefect_api, base, tmp_path,
                                                                                     monkeypatch):
    """evaluate@<variant> in a sweep: its trained policy, the one this sweep trained for that seed. Training is
    slowed and 8 workers run side by side, so an evaluation not made to wait would overtake its training."""
    monkeypatch.setenv("STUB_TRAIN_SLEEP", "1.0")
    metrics = sweep_module.sweep(base("out", "sweep.workers=8"), variants=["grpo", "dapo"],
                                 methods=["sft", "grpo", "dapo"], seeds=[1, 2], runner="thread")
    evaluated = [c for c in calls(tmp_path / "calls.jsonl") if c.get("method") in ("grpo", "dapo")]
    assert len(evaluated) == 4 and all(c["trained_first"] for c in evaluated)
    assert {"sft", "grpo", "dapo"} <= set(metrics)
    table = pd.read_csv(tmp_path / "out" / "sweep" / "methods.csv", index_col=0)
    assert set(table.index) == {"sft", "grpo", "dapo"}


def test_bad_settings_fail_before_any_run(base, tmp_path):
    params = base()
    with pytest.raises(ParamsError, match="unknown training variant 'nope'"):
        sweep_module.sweep.fn(params, variants=["grpo", "nope"])
    with pytest.raises(ParamsError, match="grpo.steps"):
        sweep_module.sweep.fn(params, overrides=["grpo.steps=0"])
    with pytest.raises(ParamsError, match="seeds must be distinct"):
        sweep_module.sweep.fn(params, seeds=[3, 3])
    with pytest.raises(ParamsError, match="unknown method 'nope'"):
        sweep_module.sweep.fn(params, methods=["sft", "nope"])
    with pytest.raises(ParamsError, match="at least one training variant or evaluated method"):
        sweep_module.sweep.fn(params, overrides=["sweep.variants=[]"])
    assert calls(tmp_path / "calls.jsonl") == []


def test_missing_main_job_outputs_are_named(base, tmp_path):
    params = base()
    (tmp_path / "out" / "index").rmdir()
    with pytest.raises(FileNotFoundError, match="index: missing.*flows.pipeline"):
        sweep_module.sweep.fn(params, seeds=[1])


@pytest.mark.slow  # starts a local Ray instance: ~20 s on 2 busy cores, and a worker per CPU
@pytest.mark.skipif(importlib.util.find_spec("prefect_ray") is None, reason="needs the ray extra")
def test_thread_and_ray_runners_give_the_same_comparison(prefect_api, base, tmp_path, monkeypatch):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this test module
    thread = sweep_module.sweep(base("thread"), variants=["grpo", "dapo"], seeds=[1, 2], runner="thread")
    ray_metrics = sweep_module.sweep(base("ray"), variants=["grpo", "dapo"], seeds=[1, 2], runner="ray")
    assert ray_metrics == thread
    tables = [pd.read_csv(tmp_path / name / "sweep" / "comparison.csv", index_col=0) for name in ("thread", "ray")]
    pd.testing.assert_frame_equal(*tables)
    by_runner = {name: [c for c in calls(tmp_path / "calls.jsonl") if f"/{name}/" in c["out_dir"]]
                 for name in ("thread", "ray")}
    assert len(by_runner["thread"]) == len(by_runner["ray"]) == 4
    assert {c["pid"] for c in by_runner["thread"]} == {os.getpid()}
    assert os.getpid() not in {c["pid"] for c in by_runner["ray"]}  # the runs ran in Ray's worker processes


def test_the_sweep_form_in_the_prefect_ui_offers_every_method_and_variant():
    from prefect.utilities.callables import parameter_schema

    from flows.deploy import run_sweep
    from flows.pipeline import METHODS, VARIANTS

    form = parameter_schema(run_sweep.fn).model_dump()["properties"]
    assert form["methods"]["items"]["enum"] == list(METHODS)
    assert form["variants"]["items"]["enum"] == list(VARIANTS)
