"""The rollout engine registry: train_policy.engine's names each build their engine through ENGINES (the policy's
rollouts, a role's writer such as ARCO's mu, how evaluate serves the trained policy), and nothing else decides by
the engine's name."""

from __future__ import annotations

import typing

import pytest

from components.params_load import load_params
from components.policy_run import make_engine
from components.registry import RegistryError
from components.run_spec import run_spec
from components.trained_policy import trained_policy_method
from components.training.engines import llamacpp
from components.training.engines.registry import ENGINES, RolloutEngineSpec, role_engine
from components.training.engines.rollout import HFRolloutEngine
from components.training.params import TrainPolicyParams


@pytest.fixture
def params(repo_root):
    return load_params(repo_root / "params.yaml")


def with_engine(params, name):
    """``params`` under ``train_policy.engine: name`` (unvalidated: a name the registry holds but the schema
    does not list yet)."""
    return params.model_copy(update={"train_policy": params.train_policy.model_copy(update={"engine": name})})


def spec_with_engine(params, name):
    """The run spec of ``params`` under ``train_policy.engine: name``."""
    return run_spec(with_engine(params, name))


def test_every_engine_the_params_name_is_registered():
    names = typing.get_args(TrainPolicyParams.model_fields["engine"].annotation)
    assert sorted(names) == ENGINES.names()


def test_the_policy_engine_is_the_registered_one(params, monkeypatch):
    policy = type("Policy", (), {"model": object()})()
    assert isinstance(make_engine(spec_with_engine(params, "hf"), policy, tokenizer=None), HFRolloutEngine)
    built = []
    monkeypatch.setitem(ENGINES._items, "fake", RolloutEngineSpec(
        policy=lambda p, pol, tok, base: built.append((pol, base)) or "fake engine"))
    assert make_engine(spec_with_engine(params, "fake"), policy, None, ("warm",)) == "fake engine"
    assert built == [(policy, ["warm"])]
    with pytest.raises(RegistryError, match="unknown rollout engine 'nope'"):
        make_engine(spec_with_engine(params, "nope"), policy, None)


def test_a_role_writes_on_the_run_s_engine_when_it_has_one_for_roles(params, monkeypatch):
    asked = []
    monkeypatch.setattr(llamacpp, "engine_for_role",
                        lambda p, role, tokenizer, **kw: asked.append((role, kw)) or "server")
    assert role_engine(spec_with_engine(params, "hf"), None, "mu", None) is None  # generate on the role's model
    assert role_engine(spec_with_engine(params, "vllm"), None, "mu", None) is None  # vllm rolls out the policy only
    assert role_engine(spec_with_engine(params, "llamacpp"), None, "mu", None, parallel=2) == "server"
    assert role_engine(spec_with_engine(params, "hf"), "llamacpp", "mu", None) == "server"  # named for the role
    assert role_engine(spec_with_engine(params, "llamacpp"), "hf", "mu", None) is None
    assert asked == [("mu", {"parallel": 2}), ("mu", {})]


def test_evaluate_serves_a_trained_policy_as_its_engine_says(params, monkeypatch):
    served = []
    monkeypatch.setitem(ENGINES._items, "fake", RolloutEngineSpec(
        policy=lambda *a: None, served=lambda p, variant, agent, warm, entry, adapter:
        served.append((variant, agent, warm, adapter.parts[-3:])) or ("fake", None, entry)))
    name, _, entry = trained_policy_method(spec_with_engine(params, "fake"), "rubricem")
    assert name == "fake" and entry is params.methods["sft_scaffold"]
    assert served == [("rubricem", "scaffold", "sft_scaffold", ("train", "rubricem", "adapter"))]
    # hf and llamacpp: the warm start's backend plus the RL adapter
    name, backend, _ = trained_policy_method(spec_with_engine(params, "hf"), "arbor")
    assert name.endswith("-arbor") and backend.lora[-1].endswith("train/arbor/adapter")
