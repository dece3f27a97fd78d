"""The base of every ``params.yaml`` section model: unknown keys are errors. Its own module so that the
methods' sections (``components/methods/<method>/params.py``) and the shared ones in ``components.params``
share it without importing each other."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
