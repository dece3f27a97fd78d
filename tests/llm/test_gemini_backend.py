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


def test_own_clients_are_one_per_event_loop_and_closed_inside_it(monkeypatch):
    from google import genai

    opened = []

    class RecordingClient(FakeClient):
        def __init__(self, api_key):
            super().__init__(response("ok"))
            self.api_key, self.closed = api_key, []
            self.aio.aclose = self._aclose
            opened.append(self)

        async def _aclose(self):
            self.closed.append(("aio", asyncio.get_running_loop().is_running()))

        def close(self):
            self.closed.append(("sync", None))

    monkeypatch.setenv("GEMINI_KEY_FOR_TEST", "k")
    monkeypatch.setattr(genai, "Client", RecordingClient)
    model = GeminiChatModel("g", api_key_env="GEMINI_KEY_FOR_TEST")

    async def twice():
        await model._complete([user("a")], Sampling())
        await model._complete([user("b")], Sampling())

    asyncio.run(twice())
    asyncio.run(twice())
    assert len(opened) == 2 and all(c.api_key == "k" for c in opened)
    # each loop's shutdown closed its own client, async side inside the loop, then the sync side
    assert all(c.closed == [("aio", True), ("sync", None)] for c in opened)

    async def use_then_close():
        await model._complete([user("c")], Sampling())
        await model.aclose()
        return list(opened[-1].closed)

    assert asyncio.run(use_then_close()) == [("aio", True), ("sync", None)] and len(opened) == 3
    assert opened[-1].closed == [("aio", True), ("sync", None)]  # not closed a second time at loop end
