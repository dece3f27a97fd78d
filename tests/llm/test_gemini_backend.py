"""The gemini backend against a stand-in for google-genai's async client (no network): request mapping,
structured output config, response parsing, and the transient/permanent error split."""

import asyncio

import pytest
from google.genai import errors, types

from components.llm.backends.gemini import GeminiChatModel
from components.llm.base import PermanentLLMError, Sampling, TransientLLMError, assistant, system, user


class FakeModels:
    def __init__(self, outcome):
        self.outcome, self.calls = outcome, []

    async def generate_content(self, model, contents, config):
        self.calls.append((model, contents, config))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class FakeClient:
    def __init__(self, outcome):
        self.aio = type("Aio", (), {})()
        self.aio.models = FakeModels(outcome)


def response(*texts):
    return types.GenerateContentResponse(
        candidates=[types.Candidate(content=types.Content(role="model", parts=[types.Part(text=t)]),
                                    finish_reason="STOP") for t in texts],
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=11, candidates_token_count=4),
    )


def test_request_mapping_and_structured_output():
    client = FakeClient(response('{"ranking": ["X", "Y"]}', '{"ranking": ["Y", "X"]}'))
    model = GeminiChatModel("gemini-2.5-pro", client=client)
    schema = {"type": "object", "properties": {"ranking": {"type": "array", "items": {"type": "string"}}}}
    msgs = [system("Be a judge."), user("Rank."), assistant("Sure."), user("Now.")]
    c = asyncio.run(model._complete(msgs, Sampling(temperature=0.3, max_tokens=50, n=2, seed=5, json_schema=schema)))
    assert c.texts == ['{"ranking": ["X", "Y"]}', '{"ranking": ["Y", "X"]}']
    assert (c.prompt_tokens, c.completion_tokens) == (11, 4)
    _, contents, config = client.aio.models.calls[0]
    assert [x.role for x in contents] == ["user", "model", "user"]
    assert config.system_instruction == "Be a judge."
    assert config.candidate_count == 2 and config.seed == 5 and config.max_output_tokens == 50
    assert config.response_mime_type == "application/json" and config.response_json_schema == schema


@pytest.mark.parametrize("code,kind", [(429, TransientLLMError), (500, TransientLLMError),
                                       (503, TransientLLMError), (400, PermanentLLMError), (403, PermanentLLMError)])
def test_api_errors_are_classified(code, kind):
    err = (errors.ClientError if code < 500 else errors.ServerError)(code, {"error": {"message": "x"}})
    model = GeminiChatModel("g", client=FakeClient(err))
    with pytest.raises(kind) as info:
        asyncio.run(model._complete([user("hi")], Sampling()))
    assert info.value.status_code == code


def test_missing_api_key_is_a_permanent_configuration_error(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with pytest.raises(PermanentLLMError, match="GEMINI_API_KEY"):
        GeminiChatModel("gemini-2.5-pro")
