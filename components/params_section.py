"""The base of every ``params.yaml`` section model (unknown keys are errors), the block of shared-section overrides
a method's section may carry, the dump helper that keeps a switch out of run keys while it is off, and
``ParamsError``. Its own module so that every section's model (``components/<package>/params.py``,
``components/methods/<method>/params.py``), the root ``components.params`` and the loader ``components.params_load``
share it without importing each other."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SharedOverrides(Section):
    """A method's own values for the shared ``grpo``, ``sft`` and ``agent`` blocks, applied over them when that
    method's stages run (``components.params.with_method_settings``), so one profile can hold three RL papers'
    settings side by side. Keys are those of the shared blocks; they are checked when params load."""

    grpo: dict[str, Any] = Field(default_factory=dict, description="Over the shared grpo block.")
    sft: dict[str, Any] = Field(default_factory=dict, description="Over the shared sft block (the method's warm start).")
    agent: dict[str, Any] = Field(default_factory=dict, description="Over the shared agent block.")

    def empty(self) -> bool:
        return not (self.grpo or self.sft or self.agent)


def shared_overrides_field() -> Any:
    """The ``shared`` field of a method's params section (one definition for every method that has one)."""
    return Field(default_factory=SharedOverrides, description=(
        "This method's values for the shared grpo/sft/agent blocks, applied when its variants (and its warm start) "
        "run; the paper profile holds its paper's training settings here. Not part of a run key by itself: the "
        "effective blocks are."))


def drop_when_off(out: dict, section: Section, name: str) -> dict:
    """A dump without the switch ``name`` while it is off: runs keyed before it existed keep their keys."""
    if not getattr(section, name):
        out.pop(name, None)
    return out


class ParamsError(ValueError):
    """A params problem in one line: where (``file:line`` or ``--set KEY=VALUE``), the dotted key, what."""
