"""The typed run form of the served deployments (components/run_form.py, flows/deploy.py): its fields carry the
choices and bounds of params.yaml's models into the deployments' parameter schema, a filled form becomes the
`--set` items the CLI would take, and a bad value is refused with the params models' own message, whether the
form or load_params catches it."""

from __future__ import annotations

from typing import get_args

import pytest
import yaml
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from pydantic import ValidationError

from components.datasets.params import DataParams
from components.evaluation.params import EvaluationParams
from components.params_load import load_params
from components.params_section import ParamsError
from components.run_form import KEYS, RunForm, to_overrides
from components.training.params import GRPOParams
from flows.deploy import _params, deployments, run_pipeline, run_sweep


def typed(schema: dict, field: str) -> dict:
    """An optional field of the form in a flow's parameter schema: its params type alone, with no None branch
    (the UI then shows a plain input, not a type switch)."""
    ref = schema["properties"]["settings"]["$ref"].rsplit("/", 1)[-1]
    prop = schema["definitions"][ref]["properties"][field]
    assert "anyOf" not in prop, prop
    return {k: v for k, v in prop.items() if k not in ("title", "description", "default")}


def minimum(model, name: str) -> int:
    return next(m.ge for m in model.model_fields[name].metadata if hasattr(m, "ge"))


@pytest.mark.parametrize("flow", [run_pipeline, run_sweep], ids=["pipeline", "sweep"])
def test_the_form_has_typed_fields_with_the_params_models_choices_and_bounds(flow, repo_root):
    schema = parameter_schema(flow.fn).model_dump()
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    assert typed(schema, "source")["enum"] == list(get_args(DataParams.model_fields["source"].annotation))
    assert typed(schema, "profile")["enum"] == ["embedded", *raw["profiles"]]
    assert typed(schema, "overlay")["items"]["enum"] == list(raw["overlays"])
    for field, model, name in [("n_train", DataParams, "n_train"), ("n_dev", DataParams, "n_dev"),
                               ("n_test", DataParams, "n_test"), ("n_questions", EvaluationParams, "n_questions"),
                               ("grpo_steps", GRPOParams, "steps")]:
        assert typed(schema, field) == {"type": "integer", "minimum": minimum(model, name)}, field
    assert typed(schema, "out_dir") == {"type": "string"}
    assert {"overrides", "settings"} <= set(schema["properties"])  # the free text stays beside the typed fields
    if flow is run_sweep:
        assert {"variants", "methods", "seeds"} <= set(schema["properties"])


def test_the_served_deployments_carry_the_form_in_their_openapi_schema(repo_root):
    served = deployments(load_params(repo_root / "params.yaml"), [])
    for deployment in served:
        schema = deployment._parameter_openapi_schema.model_dump()  # what serve() registers with the server
        assert typed(schema, "n_questions")["minimum"] == 1, deployment.name
        assert "world" in typed(schema, "source")["enum"], deployment.name


def test_a_filled_form_becomes_the_set_items_and_the_free_text_comes_after(repo_root):
    form = RunForm(profile="paper", overlay=["smoke"], source="hotpotqa", n_train=3, n_dev=2, n_test=5,
                   n_questions=4, grpo_steps=2, out_dir="outputs/ui: try 1")
    assert to_overrides(form) == [
        "profile=paper", "overlay=[smoke]", "data.source=hotpotqa", "data.n_train=3", "data.n_dev=2",
        "data.n_test=5", "evaluation.n_questions=4", "grpo.steps=2", 'run.out_dir="outputs/ui: try 1"']
    assert to_overrides(RunForm()) == to_overrides(None) == []
    assert to_overrides({"n_test": 7}) == ["data.n_test=7"]
    assert [k.split("=")[0] for k in to_overrides(form)] == list(KEYS.values())

    params = _params(form, ["data.n_dev=9"])  # what a run from the UI reads
    assert (params.profile, params.overlay, params.data.source) == ("paper", ["smoke"], "hotpotqa")
    assert (params.data.n_train, params.data.n_dev, params.data.n_test) == (3, 9, 5)  # the free text wins
    assert (params.evaluation.n_questions, params.grpo.steps, params.run.out_dir) == (4, 2, "outputs/ui: try 1")
    # an empty form leaves params.yaml as the CLI reads it
    assert _params(RunForm(), []) == load_params(repo_root / "params.yaml")


@pytest.mark.parametrize("field, value, model, name", [
    ("source", "nope", DataParams, "source"),
    ("n_test", -1, DataParams, "n_test"),
    ("n_questions", 0, EvaluationParams, "n_questions"),
    ("grpo_steps", 0, GRPOParams, "steps"),
])
def test_an_invalid_value_is_refused_with_the_params_models_message(field, value, model, name, repo_root):
    with pytest.raises(ValidationError) as expected:
        model.model_validate({name: value})
    message = expected.value.errors()[0]["msg"]

    with pytest.raises(ValidationError) as by_form:
        RunForm.model_validate({field: value})
    assert by_form.value.errors()[0]["msg"] == message

    for flow in (run_pipeline, run_sweep):  # what Prefect checks before a run starts
        with pytest.raises(ParameterTypeError, match=f"settings.{field}: {message[:30]}"):
            flow.validate_parameters({"settings": {field: value}})

    # past the form (an unchecked value), load_params refuses the --set item it becomes, with the same words
    item = to_overrides(RunForm.model_construct(**{field: value}))
    with pytest.raises(ParamsError, match=rf"--set {KEYS[field]}=.*: {KEYS[field]}: {message[:30]}"):
        _params(RunForm.model_construct(**{field: value}), [])
    assert item == [f"{KEYS[field]}={value}"]


def test_an_unknown_profile_or_overlay_is_not_offered():
    for bad in ({"profile": "nope"}, {"overlay": ["nope"]}, {"n_tests": 3}):
        with pytest.raises(ValidationError):
            RunForm.model_validate(bad)
