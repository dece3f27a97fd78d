"""JSON schemas for structured output: a pydantic model's schema in the shape every decoder accepts.

Some structured-output decoders (llama.cpp's grammar builder among them) do not follow ``$ref``, and the
schema's ``title`` annotations only cost prompt and grammar space. :func:`json_schema_of` inlines the
references and drops the annotations, but never a *property* that happens to be called ``title``:

    json_schema_of(RubricDraft)["properties"].keys()   # dict_keys(['title', 'description', 'weight'])
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = ["json_schema_of"]


def json_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with ``$ref``s inlined and ``title`` annotations removed."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any, *, names: bool = False) -> Any:
        if isinstance(node, list):
            return [inline(v) for v in node]
        if not isinstance(node, dict):
            return node
        if names:  # the keys of "properties" are field names, never annotations
            return {k: inline(v) for k, v in node.items()}
        if "$ref" in node:
            return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
        return {k: inline(v, names=k == "properties") for k, v in node.items() if k != "title"}

    return inline(schema)
