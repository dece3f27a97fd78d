"""The typed part of a run's form in the Prefect UI: the settings users change most, each a field whose type and
bounds are those of the params.yaml model that holds the setting, so the form offers a choice list for the data
source and the profile and number inputs with the models' limits, and refuses what ``load_params`` refuses, with
the same message.

A field left empty keeps what params.yaml (its profile, its overlays) says. ``to_overrides`` turns the filled
fields into ``key=value`` items of ``--set``; the flows put them before the form's free-text overrides, which
stay for every other setting (and win where both set one key)::

    to_overrides(RunForm(source="hotpotqa", n_test=10))  # ['data.source=hotpotqa', 'data.n_test=10']

No Prefect here: flows/deploy.py makes this model a parameter of its flows.
"""

from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema

from components.datasets.params import DataParams
from components.evaluation.params import EvaluationParams
from components.params import RunParams
from components.training.params import GRPOParams

Profile = Literal["embedded", "paper"]
"""The profiles params.yaml defines (``embedded``, its top level, and those under ``profiles``)."""

Overlay = Literal["smoke", "lab", "vllm_cpu"]
"""The overlays params.yaml defines under ``overlays``."""

KEYS: dict[str, str] = {
    "profile": "profile", "overlay": "overlay",
    "source": "data.source", "n_train": "data.n_train", "n_dev": "data.n_dev", "n_test": "data.n_test",
    "n_questions": "evaluation.n_questions", "grpo_steps": "grpo.steps", "out_dir": "run.out_dir",
}
"""Form field -> the dotted params key it sets (the order in which ``to_overrides`` writes them)."""

_SECTIONS: dict[str, tuple[type[BaseModel], str]] = {
    "source": (DataParams, "source"), "n_train": (DataParams, "n_train"), "n_dev": (DataParams, "n_dev"),
    "n_test": (DataParams, "n_test"), "n_questions": (EvaluationParams, "n_questions"),
    "grpo_steps": (GRPOParams, "steps"), "out_dir": (RunParams, "out_dir"),
}


def _same_as(field: str) -> Any:
    """The type of the params field behind a form field, with its constraints (ge, le, ...), or None (unset).
    The form shows the params type alone (a number input, a choice list) rather than a switch between it and
    None: a field the user leaves empty is simply not sent, and stays None."""
    model, name = _SECTIONS[field]
    info = model.model_fields[name]
    typed = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return Annotated[typed | None, WithJsonSchema(TypeAdapter(typed).json_schema())]


def _describe(field: str, model: type[BaseModel], name: str) -> dict[str, Any]:
    what = model.model_fields[name].description or ""
    return {"title": KEYS[field], "description": f"{what} Empty: params.yaml's value."}


def _field(name: str) -> Any:
    return Field(default=None, **_describe(name, *_SECTIONS[name]))


class RunForm(BaseModel):
    """Settings of one run, typed as params.yaml's models type them; empty fields keep params.yaml's values."""

    model_config = ConfigDict(extra="forbid")

    profile: Annotated[Profile | None, WithJsonSchema(TypeAdapter(Profile).json_schema())] = Field(
        default=None, title="profile",
        description="The profile whose values apply over params.yaml's top level. Empty: the one params.yaml names.")
    # a choice list even while there is one overlay (pydantic writes a lone Literal as `const`)
    overlay: Annotated[list[Overlay] | None, WithJsonSchema(
        {"type": "array", "items": {"type": "string", "enum": list(get_args(Overlay))}})] = Field(
        default=None, title="overlay", description="Overlays applied over the profile, in this order (--overlay). "
        "Empty: none.")
    source: _same_as("source") = _field("source")  # type: ignore[valid-type]
    n_train: _same_as("n_train") = _field("n_train")  # type: ignore[valid-type]
    n_dev: _same_as("n_dev") = _field("n_dev")  # type: ignore[valid-type]
    n_test: _same_as("n_test") = _field("n_test")  # type: ignore[valid-type]
    n_questions: _same_as("n_questions") = _field("n_questions")  # type: ignore[valid-type]
    grpo_steps: _same_as("grpo_steps") = _field("grpo_steps")  # type: ignore[valid-type]
    out_dir: _same_as("out_dir") = _field("out_dir")  # type: ignore[valid-type]


def _as_yaml(value: Any) -> str:
    """``value`` written so that ``--set`` (which reads values as YAML) reads it back unchanged."""
    if isinstance(value, list):
        return "[" + ", ".join(_as_yaml(v) for v in value) + "]"
    if isinstance(value, str):
        return value if yaml.safe_load(value) == value else yaml.safe_dump(value, default_style='"').strip()
    return str(value)


def to_overrides(form: RunForm | dict | None) -> list[str]:
    """The filled fields of ``form`` as ``--set`` items (``data.n_test=10``), in ``KEYS`` order; None or an empty
    form gives none. A dict is validated as a ``RunForm`` first (an invalid value raises pydantic's error)."""
    if form is None:
        return []
    if isinstance(form, dict):
        form = RunForm.model_validate(form)
    items = []
    for field, key in KEYS.items():
        value = getattr(form, field)
        if value is not None and value != []:
            items.append(f"{key}={_as_yaml(value)}")
    return items
