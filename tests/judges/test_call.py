"""The judgment call: a verdict, or a failure as a value with its kind (a failed call, a raising backend, an
unparseable reply), the schema sent as structured output, and the tally's counts by kind and tokens."""

import asyncio

import pytest
from pydantic import BaseModel, Field

from components.judges.call import (
    Failure,
    JudgeCall,
    Tally,
    Unparsed,
    Verdict,
    ask,
    model_parser,
    read_reply,
    reasons,
)
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import PermanentLLMError, Sampling, TransientLLMError, user

MESSAGES = [user("Is the answer right? Reply yes or no.")]  # 8 words: the scripted backend counts words
SCHEMA = {"type": "object", "properties": {"correct": {"type": "boolean"}}, "required": ["correct"]}


def yes_no(text: str) -> bool:
    word = text.strip().lower()
    if word not in ("yes", "no"):
        raise Unparsed(f"not yes or no: {text!r}")
    return word == "yes"


def call(parse=yes_no, **kw) -> JudgeCall:
    return JudgeCall(MESSAGES, parse, Sampling(temperature=0.0, max_tokens=4), **kw)


def run(model, c=None, tally=None):
    return asyncio.run(ask(model, c or call(), tally))


def test_a_reply_that_parses_is_a_verdict_with_its_cost():
    result = run(ScriptedChatModel(["yes"]))
    assert isinstance(result, Verdict) and result.ok and result.value is True and result.text == "yes"
    assert (result.prompt_tokens, result.completion_tokens) == (8, 1)
    assert run(ScriptedChatModel(["no"])).value is False  # a False verdict is a verdict, not a failure


@pytest.mark.parametrize("error", [TransientLLMError("overloaded", 503), PermanentLLMError("bad request", 400)])
def test_a_failed_call_is_a_call_failed_value_not_an_exception(error):
    result = run(ScriptedChatModel([error]))
    assert isinstance(result, Failure) and not result.ok and result.kind == "call_failed"
    assert result.error_type == type(error).__name__ and result.reason == str(error)
    assert result.describe() == f"{type(error).__name__}: {error}"
    assert result.prompt_tokens == result.completion_tokens == 0


def test_a_backend_that_raises_is_a_failed_call_too():
    result = run(ScriptedChatModel([]))  # the scripted backend raises AssertionError when it runs out
    assert result.kind == "call_failed" and result.error_type == "AssertionError"


def test_an_unparseable_reply_is_unparsed_with_the_parsers_reason_and_the_reply():
    result = run(ScriptedChatModel(["maybe so"]))
    assert result.kind == "unparsed" and result.reason == "not yes or no: 'maybe so'"
    assert result.describe() == result.reason and result.reply == "maybe so"
    assert result.completion_tokens == 2  # the call succeeded: its tokens count


def test_a_parser_returning_none_or_a_reason_string_is_unparsed():
    assert run(ScriptedChatModel(["x"]), call(parse=lambda text: None)).kind == "unparsed"
    legacy = reasons(lambda text: text == "ok" or "reply is not ok")
    assert read_reply("ok", legacy).value is True
    failure = read_reply("nope", legacy)
    assert failure.kind == "unparsed" and failure.reason == "reply is not ok"


def test_unparsed_keeps_what_the_parser_could_read():
    def parse(text):
        raise Unparsed("partial ranking", partial="the rationale")

    assert read_reply("x", parse).partial == "the rationale"


def test_a_parser_bug_is_not_swallowed():
    def broken(text):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run(ScriptedChatModel(["yes"]), call(parse=broken))


def test_the_schema_goes_out_as_structured_output_and_the_sampling_is_kept_otherwise():
    model = ScriptedChatModel(["yes", "yes"])
    run(model, call(schema=SCHEMA))
    run(model, call())
    (_, with_schema), (_, without) = model.requests
    assert with_schema == Sampling(temperature=0.0, max_tokens=4, json_schema=SCHEMA)
    assert without == Sampling(temperature=0.0, max_tokens=4)


def test_the_tally_counts_calls_failures_by_kind_and_tokens():
    tally = Tally()
    model = ScriptedChatModel(["yes", TransientLLMError("down"), "perhaps", "no", PermanentLLMError("bad", 400)])
    results = [run(model, tally=tally) for _ in range(5)]
    assert [r.ok for r in results] == [True, False, False, True, False]
    assert tally.calls == 5 and tally.failures == 2 and tally.unparsed == 1 and tally.failed == 3
    assert tally.by_kind() == {"call_failed": 2, "unparsed": 1}
    # three calls got a reply (8 prompt words each) of 1 word; the failed calls cost nothing
    assert (tally.prompt_tokens, tally.completion_tokens, tally.tokens) == (24, 3, 27)
    other = Tally(calls=1, failures=1, prompt_tokens=5)
    tally.merge(other)
    assert (tally.calls, tally.failures, tally.unparsed, tally.tokens) == (6, 3, 1, 32)


def test_model_parser_reasons():
    class Sheet(BaseModel):
        score: int = Field(ge=0, le=2)

    parse = model_parser(Sheet)
    assert read_reply('Here: {"score": 2}', parse).value == Sheet(score=2)
    assert read_reply("no braces", parse).reason == "no JSON object in the reply"
    assert read_reply('{"score": 5}', parse).reason.startswith("score: ")
