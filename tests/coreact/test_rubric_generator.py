"""The rubric format (strict parse, weights, format score), the generator role's counted failures, and the
evaluator's and verifier's strict per-criterion replies."""

import asyncio
import json

import pytest

from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import TransientLLMError
from components.methods.coreact.params import RubricGeneratorParams
from components.methods.coreact.rubric_eval import parse_satisfied
from components.methods.coreact.rubric_generator import (
    RubricGenerator,
    generator_messages,
    parse_rubric,
    render_rubric,
    rubric_schema,
)
from components.methods.coreact.verifier import parse_verdicts, verify_action
from components.schemas import Criterion, Rubric, Step, ToolCall

LIMIT = RubricGeneratorParams().max_criterion_chars  # 160
OK = '{"criteria": [{"criterion": "Looks up  the film", "weight": 3}, {"criterion": "Avoids repeats", "weight": 1}]}'


def test_strict_parse_normalises_weights_and_scores_the_format():
    p = parse_rubric(OK, max_criteria=4, max_chars=LIMIT)
    assert p.ok and p.exact and p.format_score == 1.0
    assert [c.text for c in p.rubric.criteria] == ["Looks up the film", "Avoids repeats"]
    assert [c.weight for c in p.rubric.criteria] == pytest.approx([0.75, 0.25])
    assert render_rubric(p.rubric) == "1. (weight 0.75) Looks up the film\n2. (weight 0.25) Avoids repeats"
    assert parse_rubric(f"```json\n{OK}\n```", 4, max_chars=LIMIT).format_score == 1.0
    assert parse_rubric(f"Sure! {OK} Hope it helps.", 4, max_chars=LIMIT).format_score == 0.5


@pytest.mark.parametrize("text, error", [
    ("", "empty reply"),
    ('{"rubric": []}', "no JSON object with 'criteria'"),
    ('{"criteria": [], "note": 1}', "unexpected key 'note'"),
    ('{"criteria": []}', "0 criteria (expected 1 to 2)"),
    ('{"criteria": [{"criterion": "a", "weight": 1}, {"criterion": "b", "weight": 1}, {"criterion": "c", "weight": 1}]}',
     "3 criteria (expected 1 to 2)"),
    ('{"criteria": [{"criterion": "a", "weight": true}]}', "criterion 1: 'weight' must be a number"),
    ('{"criteria": [{"criterion": "a", "weight": 11}]}', "criterion 1: 'weight' must be a number"),
    ('{"criteria": [{"criterion": " ", "weight": 1}]}', "criterion 1: 'criterion' must be a non-empty string"),
    ('{"criteria": [{"criterion": "a", "weight": 1, "why": "x"}]}', "criterion 1: expected exactly the keys"),
    ('{"criteria": [{"criterion": "' + "x" * 161 + '", "weight": 1}]}', "criterion 1: 161 characters (at most 160)"),
])
def test_bad_rubrics_fail_with_a_reason(text, error):
    p = parse_rubric(text, max_criteria=2, max_chars=LIMIT)
    assert not p.ok and p.format_score == 0.0 and error in p.error


def test_generator_counts_failed_calls_and_bad_replies_and_sends_the_schema():
    model = ScriptedChatModel([OK, "no idea", TransientLLMError("down")])
    gen = RubricGenerator(model, max_criteria=3, temperature=0.7, top_p=0.95, max_tokens=64, max_chars=LIMIT)
    steps = [Step(index=0, action="search[Nightfall Harbor]",
                  tool_call=ToolCall(name="search", observation="[1] (d1) Nightfall Harbor: a film by Ossian Threll"))]
    outs = [asyncio.run(gen.generate("Where was the director of Nightfall Harbor born?", steps, seed=3)) for _ in range(3)]
    assert outs[0].ok and not outs[1].ok and outs[1].error and outs[2].call_failed
    assert (gen.calls, gen.unparsed, gen.failed_calls) == (3, 1, 1)
    messages, sampling = model.requests[0]
    assert "between 1 and 3" in messages[0].content and "Step 1 action: search[Nightfall Harbor]" in messages[1].content
    assert "a film by Ossian Threll" in messages[1].content
    assert sampling.json_schema == rubric_schema(3, max_chars=LIMIT) and sampling.seed == 3 and sampling.top_p == 0.95
    # the length limit is in the prompt and in the schema, so structured output cannot run a criterion on
    assert "at most 160 characters" in messages[0].content
    assert sampling.json_schema["properties"]["criteria"]["items"]["properties"]["criterion"]["maxLength"] == 160


def test_raw_weights_are_kept_beside_the_normalised_ones():
    p = parse_rubric(OK, max_criteria=4, max_chars=LIMIT)
    assert p.raw_weights == (3.0, 1.0) and sum(c.weight for c in p.rubric.criteria) == pytest.approx(1.0)
    assert parse_rubric("none", 4, max_chars=LIMIT).raw_weights == ()


def test_the_prompt_asks_for_what_the_format_term_rewards():
    schema = generator_messages("Q?", [], 4, max_chars=LIMIT)[0].content
    assert "3 = essential, 2 = important, 1 = helpful" in schema and "between 1 and 4 criteria" in schema
    assert '"weight": <1-3>' in schema
    released = generator_messages("Q?", [], 5, max_chars=LIMIT, format_reward="count_weights")[0].content
    assert "the weights add up to 1" in released and "between 3 and 5 criteria" in released
    assert '"weight": <share>' in released and "3 = essential" not in released
    # the range never asks for more than max_criteria, nor more than the released 5
    assert "between 2 and 2 criteria" in generator_messages("Q?", [], 2, max_chars=LIMIT,
                                                           format_reward="count_weights")[0].content
    assert "between 3 and 5 criteria" in generator_messages("Q?", [], 8, max_chars=LIMIT,
                                                           format_reward="count_weights")[0].content
    model = ScriptedChatModel([OK])
    asyncio.run(RubricGenerator(model, max_criteria=5, max_chars=LIMIT, format_reward="count_weights")
                .generate("Q?", []))
    assert model.requests[0][0][0].content == released


def test_a_criterion_at_the_length_limit_parses():
    text = '{"criteria": [{"criterion": "' + "x" * 40 + '", "weight": 1}]}'
    assert parse_rubric(text, 4, max_chars=40).ok and "41 characters" in parse_rubric(text.replace("x", "xx", 1), 4,
                                                                                      max_chars=40).error


def test_evaluator_and_verifier_replies_are_strict():
    assert parse_satisfied('{"satisfied": [true, false]}', 2) == [True, False]
    assert parse_satisfied('{"satisfied": [true]}', 2) == "1 verdicts for 2 criteria"
    assert "true/false" in parse_satisfied('{"satisfied": ["yes", "no"]}', 2)
    assert parse_verdicts('{"verdicts": [{"satisfied": false, "reason": "x  y"}]}', 1) == ([False], ["x y"])
    assert "2 verdicts for 1" in parse_verdicts('{"verdicts": [{"satisfied": true}, {"satisfied": true}]}', 1)
    rubric = Rubric(criteria=[Criterion(text="a", weight=0.6), Criterion(text="b", weight=0.4)])
    reply = json.dumps({"verdicts": [{"satisfied": True, "reason": ""}, {"satisfied": False, "reason": "no b"}]})
    v = asyncio.run(verify_action(ScriptedChatModel([reply]), "Q?", "", "t", "search[x]", rubric, tau=0.5))
    assert v.fraction == pytest.approx(0.6) and v.accepted and v.feedback() == "- criterion 2 (b) not met: no b"
    v = asyncio.run(verify_action(ScriptedChatModel(["fine"]), "Q?", "", "t", "search[x]", rubric, tau=0.5))
    assert v.failed and not v.call_failed and v.accepted is None
