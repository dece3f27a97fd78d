"""json_schema_of: references inlined, annotations dropped, fields kept, even one called ``title``."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from components.methods.rubricem.stagewise_judge import GeneratedRubrics, ScoreSheet
from components.llm.json_schema import json_schema_of, one_item_per_key


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


def test_one_item_per_key_pins_each_index_once_in_order():
    schema = one_item_per_key(json_schema_of(ScoreSheet), "scores", "index", [0, 1, 2])
    field = schema["properties"]["scores"]
    assert field["minItems"] == field["maxItems"] == 3 and field["items"] is False
    assert [item["properties"]["index"] for item in field["prefixItems"]] == [{"const": 0}, {"const": 1}, {"const": 2}]
    assert set(field["prefixItems"][1]["properties"]) == {"index", "justification", "score"}
    assert json_schema_of(ScoreSheet)["properties"]["scores"]["items"]["properties"]["index"] != {"const": 0}  # a copy
    jsonschema = pytest.importorskip("jsonschema")
    good = {"scores": [{"index": i, "justification": "j", "score": 1} for i in range(3)]}
    jsonschema.validate(good, schema)
    for bad in ({"scores": good["scores"][:2]}, {"scores": [good["scores"][0]] * 3},
                {"scores": good["scores"][::-1]}, {"scores": good["scores"] + [good["scores"][0]]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    gbnf = grammar.json_schema_to_gbnf(json.dumps(schema))
    assert "tuple-2" in gbnf and "tuple-3" not in gbnf  # a fixed three-item array in llama.cpp's grammar
