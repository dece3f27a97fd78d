"""ARCO's step views, mu's prompt and reply parsing, and the teacher's strict warm-up annotation."""

import asyncio
import json

import pytest

from components.methods.arco.criteria import (
    CriteriaParseError,
    annotate,
    format_criteria,
    parse_criteria,
    parse_teacher_reply,
    sft_segments,
    step_messages,
    trajectory_steps,
    warmup_rows,
)
from components.llm.backends.scripted import ScriptedChatModel
from tests.arco.helpers import GOOD, Q, render, teacher, trajectory


def test_trajectory_steps_add_the_forced_answer_as_its_own_step():
    steps = trajectory_steps(trajectory(GOOD[:2], answer="Ammel", forced=True))
    assert [s.action for s in steps] == ["search[Ossian Threll]", "search[Kestrow]", "finish[Ammel]"]
    assert [s.index for s in steps] == [0, 1, 2] and steps[2].forced and steps[2].finish
    assert steps[0].query == "Ossian Threll" and steps[0].doc_ids == ("d-Ossian Threll",)
    assert len(trajectory_steps(trajectory(GOOD))) == 3  # an answered episode has no extra step


def test_step_prompt_shows_the_prefix_and_the_step_but_not_later_steps():
    steps = trajectory_steps(trajectory(GOOD))
    text = step_messages(Q.question, steps, 1, 3)[-1].content
    assert "1. Action: search[Ossian Threll]" in text and "Action: search[Kestrow]" in text
    assert "finish[Ammel]" not in text and "exactly 3 criteria" in text


def test_parse_criteria_reads_numbered_lines_in_order():
    text = "Here:\n1. Looks up X\n2) Uses Y  \nnote\n3. Answers\n4. extra"
    parsed = parse_criteria(text, 3)
    assert [c for c, _ in parsed] == ["Looks up X", "Uses Y", "Answers"]
    assert [text[:end].endswith(c) for c, end in parsed] == [True, True, True]
    assert [c for c, _ in parse_criteria("1. a\n3. c", 3)] == ["a"]  # numbering that skips ends the list
    assert parse_criteria("no list", 3) == []
    assert format_criteria(["a", "b"]) == "1. a\n2. b"


def test_teacher_reply_parse_is_strict():
    ok = json.dumps({"steps": [{"step": 1, "criteria": ["a", "b", "c"]}, {"step": 2, "criteria": ["d", "e", "f\ng"]}]})
    assert parse_teacher_reply("sure: " + ok, 2, 3) == [["a", "b", "c"], ["d", "e", "f g"]]
    bad = {
        "one step missing": {"steps": [{"step": 1, "criteria": ["a", "b", "c"]}]},
        "two criteria": {"steps": [{"step": 1, "criteria": ["a", "b"]}, {"step": 2, "criteria": ["d", "e", "f"]}]},
        "steps out of order": {"steps": [{"step": 2, "criteria": ["a", "b", "c"]}, {"step": 1, "criteria": ["d", "e", "f"]}]},
        "empty criterion": {"steps": [{"step": 1, "criteria": ["a", " ", "c"]}, {"step": 2, "criteria": ["d", "e", "f"]}]},
    }
    for payload in bad.values():
        with pytest.raises(CriteriaParseError):
            parse_teacher_reply(json.dumps(payload), 2, 3)
    with pytest.raises(CriteriaParseError, match="no JSON"):
        parse_teacher_reply("I cannot", 2, 3)


def test_annotate_returns_criteria_or_a_failure_never_a_guess():
    steps = trajectory_steps(trajectory(GOOD))
    criteria, why = asyncio.run(annotate(teacher(), Q, steps, 3))
    assert why is None and criteria[2] == ["step 3 criterion 1", "step 3 criterion 2", "step 3 criterion 3"]
    assert asyncio.run(annotate(teacher(fail_on="Ossian"), Q, steps, 3))[0] is None
    junk = ScriptedChatModel(lambda m, s: '{"steps": []}')
    criteria, why = asyncio.run(annotate(junk, Q, steps, 3))
    assert criteria is None and why.startswith("unparsed")
    model = teacher()
    asyncio.run(annotate(model, Q, steps, 3))
    messages, sampling = model.requests[0]
    assert sampling.json_schema["properties"]["steps"]["items"]["properties"]["criteria"]["minItems"] == 3
    assert "Reference answer: Ammel" in messages[-1].content


def test_warmup_rows_are_sft_rows_with_one_segment_per_criterion():
    steps = trajectory_steps(trajectory(GOOD))
    criteria = [[f"s{t} c{j}" for j in range(3)] for t in range(3)]
    rows = warmup_rows(Q, steps, criteria, 3)
    assert len(rows) == 3 and rows[1].messages == step_messages(Q.question, steps, 1, 3)
    segments = sft_segments(rows[1], render)
    assert segments[0] == (render(rows[1].messages, True), False)
    assert segments[1:] == [("1. s1 c0", True), ("\n", True), ("2. s1 c1", True), ("\n", True), ("3. s1 c2", True),
                            ("</>\n", True)]
    with pytest.raises(ValueError):
        warmup_rows(Q, steps, criteria[:2], 3)
