"""Reading JSON out of model replies: the outer span, the scan over fenced and bare objects, and the repair of a
reply cut just before its last brace."""

from __future__ import annotations

import json

import pytest

from components.llm.json_reply import NoJSONObject, first_json_object, json_objects, outer_json


def test_outer_json_reads_the_span_between_the_first_and_last_brace():
    assert outer_json('Verdict follows.\n```json\n{"correct": true, "why": {"a": 1}}\n```') == {
        "correct": True, "why": {"a": 1}}


def test_outer_json_tells_no_json_from_broken_json():
    with pytest.raises(NoJSONObject):
        outer_json("I think the answer is right.")
    with pytest.raises(NoJSONObject):
        outer_json(None)
    with pytest.raises(json.JSONDecodeError):
        outer_json('{"correct": tru}')
    with pytest.raises(json.JSONDecodeError):  # two objects are not one value
        outer_json('{"a": 1} and {"b": 2}')


def test_json_objects_scans_fences_first_then_the_text():
    text = 'draft {"a": 1} then\n```json\n{"b": 2}\n```'
    assert json_objects(text) == [{"b": 2}, {"a": 1}, {"b": 2}]
    assert first_json_object(text) == {"b": 2}
    assert first_json_object("no object { here") is None


def test_a_reply_cut_before_its_last_brace_counts_only_when_asked():
    cut = '{"ranking": "B > A > C", "note": {"x": 1}'
    assert json_objects(cut) == [{"x": 1}]
    assert json_objects(cut, repair_truncated=True)[0] == {"ranking": "B > A > C", "note": {"x": 1}}
