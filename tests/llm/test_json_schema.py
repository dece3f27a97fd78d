"""json_schema_of: references inlined, annotations dropped, fields kept, even one called ``title``."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from components.judges.stagewise import GeneratedRubrics, ScoreSheet
from components.llm.json_schema import json_schema_of


class Item(BaseModel):
    title: str = Field(min_length=1)
    weight: int


class Sheet(BaseModel):
    items: list[Item]
    title: str


def objects(node):
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield node
        for v in node.values():
            yield from objects(v)
    elif isinstance(node, list):
        for v in node:
            yield from objects(v)


@pytest.mark.parametrize("model", [Sheet, GeneratedRubrics, ScoreSheet])
def test_every_required_field_is_a_property(model):
    schema = json_schema_of(model)
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    found = list(objects(schema))
    assert found
    for node in found:
        assert set(node["required"]) <= set(node["properties"]), node


def test_a_field_named_title_survives_and_annotations_go():
    schema = json_schema_of(Sheet)
    assert set(schema["properties"]) == {"items", "title"}
    item = schema["properties"]["items"]["items"]
    assert set(item["properties"]) == {"title", "weight"}
    assert item["properties"]["title"] == {"minLength": 1, "type": "string"}
    assert "title" not in schema and "title" not in item  # the "Sheet"/"Item" annotations


def test_the_llama_cpp_grammar_lets_the_model_write_a_title():
    """The embedded judge's server turns the schema into a grammar: a rubric without its title could never
    validate (the failure the first real rubricem step hit)."""
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    gbnf = grammar.json_schema_to_gbnf(json.dumps(json_schema_of(GeneratedRubrics)))
    assert '\\"title\\"' in gbnf or '"title"' in gbnf.replace('\\"', '"')
