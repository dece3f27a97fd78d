"""`dvc.lock` records a run of every stage the main job runs (``flows.pipeline.DEFAULT_TARGETS`` and upstream), and
that record still fits `dvc.yaml` and `params.yaml`: the same command, deps and outs as the stage defines now, no
dep that no longer exists, and the params values of today. A lock that fails here is stale: rerun the main job
with `dvc repro` (the sampled stages replay their response records, outputs/responses/) and commit `dvc.lock`.

Code deps' content hashes are not compared: every change to a stage's code changes them, and `dvc status` reports
which stages that leaves to rerun. `head_to_head` is not required: its deps are every training variant's outputs,
which the main job does not train (`dvc repro -s head_to_head` reports what exists, without locking)."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from flows.pipeline import select

MAIN_JOB = select()


@pytest.fixture(scope="module")
def defined(repo_root):
    """Stage name -> (cmd, dep paths, params keys, out paths) as DVC reads them from dvc.yaml today."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        stages = {}
        for stage in repo.index.stages:
            params = {key for dep in stage.deps if isinstance(dep, ParamsDependency) for key in dep.params}
            deps = sorted(dep.def_path for dep in stage.deps if not isinstance(dep, ParamsDependency))
            stages[stage.addressing] = (stage.cmd, deps, params, sorted(out.def_path for out in stage.outs))
        return stages


@pytest.fixture(scope="module")
def locked(repo_root):
    return read_yaml(repo_root / "dvc.lock")["stages"]


def read_yaml(path):
    """As DVC reads and writes it (YAML 1.2: ``2e-06`` is a number, which PyYAML would read as a string)."""
    return YAML(typ="safe", pure=True).load(path.read_text())


def lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_every_stage_of_the_main_job_is_locked(locked):
    assert {"prepare", "sft", "evaluate@sft"} <= set(MAIN_JOB)
    assert [name for name in MAIN_JOB if name not in locked] == []


@pytest.mark.parametrize("name", MAIN_JOB)
def test_a_locked_stage_matches_its_definition(name, locked, defined, repo_root):
    cmd, deps, params, outs = defined[name]
    entry = locked[name]
    assert entry["cmd"] == cmd
    assert sorted(d["path"] for d in entry.get("deps", [])) == deps
    assert sorted(o["path"] for o in entry.get("outs", [])) == outs
    gone = [d["path"] for d in entry.get("deps", []) if not d["path"].startswith("outputs/")
            and not (repo_root / d["path"]).exists()]
    assert gone == [], f"{name}: dvc.lock names deps that no longer exist"
    values = read_yaml(repo_root / "params.yaml")
    recorded = entry.get("params", {}).get("params.yaml", {})
    assert set(recorded) == params
    changed = [key for key in params if recorded[key] != lookup(values, key)]
    assert changed == [], f"{name}: params changed since the locked run: {changed}"


def test_the_check_sees_a_stale_entry(locked, defined, repo_root):
    """The old lock's faults are caught: a dep that was deleted (components/council.py), a changed command."""
    name = MAIN_JOB[0]
    deleted = {**locked[name], "deps": [*locked[name]["deps"], {"path": "components/council.py"}]}
    with pytest.raises(AssertionError):
        test_a_locked_stage_matches_its_definition(name, {name: deleted}, defined, repo_root)
    with pytest.raises(AssertionError):
        test_a_locked_stage_matches_its_definition(name, {name: {**locked[name], "cmd": "python -m tasks.old"}},
                                                   defined, repo_root)
