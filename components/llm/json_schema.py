"""JSON schemas for structured output: a pydantic model's schema in the shape every decoder accepts.

Some structured-output decoders (llama.cpp's grammar builder among them) do not follow ``$ref``, and the
schema's ``title`` annotations only cost prompt and grammar space. :func:`json_schema_of` inlines the
references and drops the annotations, but never a *property* that happens to be called ``title``:

    json_schema_of(RubricDraft)["properties"].keys()   # dict_keys(['title', 'description', 'weight'])

:func:`one_item_per_key` narrows a list field to exactly one item per expected key, in order, so a
grammar-constrained decoder cannot skip or repeat an item a judge was asked to score:

    one_item_per_key(json_schema_of(ScoreSheet), "scores", "index", [0, 1, 2])
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

__all__ = ["json_schema_of", "one_item_per_key"]


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


def one_item_per_key(schema: dict[str, Any], field: str, key: str, values: list[Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose list property ``field`` holds exactly ``len(values)`` items, the i-th with
    ``key`` fixed to ``values[i]`` (``prefixItems`` + ``const``, which llama.cpp's grammar and vLLM's guided
    decoding follow; a decoder that ignores them still has the caller's own check)."""
    out = copy.deepcopy(schema)
    item = out["properties"][field]["items"]
    pinned = []
    for value in values:
        one = copy.deepcopy(item)
        one["properties"][key] = {"const": value}
        pinned.append(one)
    out["properties"][field] = {"type": "array", "prefixItems": pinned, "items": False,
                                "minItems": len(values), "maxItems": len(values)}
    return out
