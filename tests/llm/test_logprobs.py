"""Log-probabilities through the OpenAI-compatible backend and the middleware: the request asks for them only when
told to, the reply's ``logprobs.content`` is read (llama.cpp's server, llama-cpp-python's server and vLLM shapes),
the response cache keeps them, and the cache keys of calls that do not ask for them are the keys they always had."""

import asyncio
import json
import math

import pytest

from components.llm.accounting import Accounting
from components.llm.backends.openai_http import OpenAIChatModel
from components.llm.base import Completion, Sampling, TokenLogprob, system, user
from components.llm.middleware import ReliableChatModel, ResponseCache
from components.llm.params import MiddlewareParams
from tests.llm.fake_openai_server import FakeOpenAIServer

MSG = [system("You grade."), user("Is 2+2=4? Answer yes or no.")]
ASK = Sampling(temperature=0.0, max_tokens=8, logprobs=True, top_logprobs=3)

# what llama.cpp's server (tools/server, pre-sampling probabilities) sends: ids, bytes, and the lowest float for
# a probability of 0 (it cannot send -inf in JSON)
LLAMA_SERVER = [
    {"id": 9454, "token": "Yes", "bytes": [89, 101, 115], "logprob": math.log(0.75),
     "top_logprobs": [{"id": 9454, "token": "Yes", "bytes": [89, 101, 115], "logprob": math.log(0.75)},
                      {"id": 2753, "token": "No", "bytes": [78, 111], "logprob": math.log(0.2)},
                      {"id": 785, "token": "The", "bytes": [84, 104, 101], "logprob": -3.4028234663852886e38}]},
    {"id": 13, "token": ".", "bytes": [46], "logprob": -0.01, "top_logprobs": []},
]
# llama-cpp-python's server: bytes null, no ids
LLAMA_CPP_PYTHON = [{"token": "Yes", "bytes": None, "logprob": -0.1,
                     "top_logprobs": [{"token": "Yes", "bytes": None, "logprob": -0.1},
                                      {"token": "No", "bytes": None, "logprob": -2.5}]}]


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


def wrapped(server, tmp_path, **kwargs):
    settings = MiddlewareParams(max_attempts=1, cache=True, timeout_s=5.0)
    return ReliableChatModel(OpenAIChatModel(model="fake", base_url=server.base_url, **kwargs), role="judge",
                             settings=settings, cache=ResponseCache(tmp_path / "cache.sqlite"), accounting=Accounting())


def test_a_logprob_request_sends_the_options_and_reads_llama_server_tokens(server):
    server.behaviours = [("logprobs", ("Yes.", LLAMA_SERVER))]
    model = OpenAIChatModel(model="fake", base_url=server.base_url)
    out = asyncio.run(model.chat(MSG, ASK))
    assert server.requests[0]["logprobs"] is True and server.requests[0]["top_logprobs"] == 3
    assert out.ok and out.text == "Yes."
    first, second = out.logprobs[0]
    assert first.token == "Yes" and first.logprob == pytest.approx(math.log(0.75))
    assert [t for t, _ in first.top] == ["Yes", "No", "The"]
    assert first.top[1][1] == pytest.approx(math.log(0.2)) and math.exp(first.top[2][1]) == 0.0
    assert second == TokenLogprob(token=".", logprob=-0.01, top=())


def test_llama_cpp_python_shape_and_zero_top_logprobs_are_read(server):
    server.behaviours = [("logprobs", ("Yes", LLAMA_CPP_PYTHON))]
    model = OpenAIChatModel(model="fake", base_url=server.base_url)
    out = asyncio.run(model.chat(MSG, Sampling(logprobs=True)))
    assert server.requests[0]["top_logprobs"] == 0  # always sent: llama-cpp-python reports nothing without it
    assert out.logprobs == [[TokenLogprob(token="Yes", logprob=-0.1, top=(("Yes", -0.1), ("No", -2.5)))]]


def test_a_plain_request_asks_for_nothing_and_gets_none(server):
    server.behaviours = [("logprobs", ("Yes", LLAMA_CPP_PYTHON))]  # even a server that sends them unasked
    model = OpenAIChatModel(model="fake", base_url=server.base_url)
    out = asyncio.run(model.chat(MSG, Sampling(max_tokens=8)))
    assert "logprobs" not in server.requests[0] and "top_logprobs" not in server.requests[0]
    assert out.ok and out.logprobs is None


@pytest.mark.parametrize("content", [None, "garbled", [{"token": "Yes"}], [{"token": "Yes", "logprob": None}]])
def test_missing_or_unreadable_logprobs_leave_the_text_usable(server, content):
    server.behaviours = [("logprobs", ("Yes", content))]
    model = OpenAIChatModel(model="fake", base_url=server.base_url)
    out = asyncio.run(model.chat(MSG, ASK))
    assert out.ok and out.text == "Yes" and out.logprobs is None


def test_split_samples_keep_their_own_logprobs(server):
    server.behaviours = [("logprobs", ("Yes", LLAMA_CPP_PYTHON)), ("logprobs", ("No", [{**LLAMA_CPP_PYTHON[0],
                                                                                      "token": "No"}]))]
    model = OpenAIChatModel(model="fake", base_url=server.base_url)  # ignores n: two requests, joined
    out = asyncio.run(model.chat(MSG, ASK.model_copy(update={"n": 2, "temperature": 0.5, "seed": 1})))
    assert sorted(out.texts) == ["No", "Yes"]  # the two requests may be answered in either order
    assert [s[0].token for s in out.logprobs] == out.texts  # each sample keeps its own tokens
    assert OpenAIChatModel.join([Completion(texts=["a"], model="m", logprobs=[[]]),
                                 Completion(texts=["b"], model="m")]).logprobs is None


def test_the_cache_keeps_logprobs(server, tmp_path):
    server.behaviours = [("logprobs", ("Yes.", LLAMA_SERVER))]
    model = wrapped(server, tmp_path)
    first = asyncio.run(model.chat(MSG, ASK))
    again = asyncio.run(model.chat(MSG, ASK))
    assert len(server.requests) == 1 and again.cached and not first.cached
    assert again.logprobs == first.logprobs and again.logprobs[0][0].top[1][0] == "No"
    # the plain request is another key: it goes to the server, which now answers without logprobs
    plain = asyncio.run(model.chat(MSG, Sampling(temperature=0.0, max_tokens=8)))
    assert len(server.requests) == 2 and plain.text == "default" and plain.logprobs is None
    metrics = model.accounting.metrics()
    assert metrics["llm.judge.logprob_calls"] == 2 and metrics["llm.judge.logprob_missing"] == 0


def test_plain_call_keys_are_unchanged_and_logprob_calls_key_apart():
    # keys computed before Sampling had logprob options: responses cached then must still be found
    assert ResponseCache.key("fake", MSG, Sampling(temperature=0.0, max_tokens=8)) == \
        "3af49fe4935b01514e0e44d3370c778c668c01526d6dc25f7d8b1ada80236884"
    seeded = Sampling(temperature=0.7, seed=3, max_tokens=8, json_schema={"type": "object"})
    assert ResponseCache.key("fake", MSG, seeded) == "f8e1daa5224742ba4a69f0490efb9b2b02c87feeef25f7a307439fb49831d73c"
    plain = ResponseCache.key("fake", MSG, Sampling(temperature=0.0, max_tokens=8))
    asked = ResponseCache.key("fake", MSG, Sampling(temperature=0.0, max_tokens=8, logprobs=True, top_logprobs=5))
    fewer = ResponseCache.key("fake", MSG, Sampling(temperature=0.0, max_tokens=8, logprobs=True, top_logprobs=3))
    assert len({plain, asked, fewer}) == 3


def test_a_completion_cached_before_logprobs_existed_still_reads(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    old = {"texts": ["Yes"], "model": "fake", "prompt_tokens": 1, "completion_tokens": 1, "finish_reasons": ["stop"]}
    cache._db.execute("INSERT INTO responses VALUES (?, ?, ?)", ("k", json.dumps(old), 0.0))
    assert cache.get("k") == Completion(texts=["Yes"], model="fake", prompt_tokens=1, completion_tokens=1,
                                        finish_reasons=["stop"])


def test_a_reply_without_logprobs_is_counted_missing_and_plain_roles_report_nothing(server, tmp_path):
    model = wrapped(server, tmp_path)
    asyncio.run(model.chat(MSG, Sampling(max_tokens=8)))
    assert not any("logprob" in k or "scored_from" in k for k in model.accounting.metrics())
    asyncio.run(model.chat(MSG, ASK))  # the server answers "default" with no logprobs
    metrics = model.accounting.metrics()
    assert metrics["llm.judge.logprob_calls"] == 1 and metrics["llm.judge.logprob_missing"] == 1


def test_the_switch_is_per_role_and_absent_from_dumps_until_set(repo_root, tmp_path):
    from components.llm.backends.scripted import ScriptedChatModel
    from components.llm.factory import LLMPool
    from components.params_load import load_params
    from components.params_section import ParamsError

    unset = load_params(repo_root / "params.yaml", overrides=["llm.scoring={}"])
    assert "scoring" not in unset.model_dump()["llm"]  # run keys of runs made before the key stay as they were
    # the embedded default sets the verifier alone (the bench's choice, docs/results/judges.md)
    assert load_params(repo_root / "params.yaml").model_dump()["llm"]["scoring"] == {"verifier": "probability"}
    params = load_params(repo_root / "params.yaml", overrides=[("llm.scoring={verifier: probability, "
                                                                "council_judges: probability}")])
    assert params.model_dump()["llm"]["scoring"] == {"verifier": "probability", "council_judges": "probability"}
    params.run.cache_dir = str(tmp_path)
    with LLMPool(params, overrides={"embedded-1_5b": ScriptedChatModel(["x"])}) as pool:
        assert pool.role("verifier").scoring == "probability" and pool.role("answer_judge").scoring == "text"
        assert [c.scoring for c in pool.roles("council_judges")] == ["probability", "probability"]
    with pytest.raises(ParamsError, match="unknown role 'judge'"):
        load_params(repo_root / "params.yaml", overrides=["llm.scoring.judge=probability"])
    with pytest.raises(ParamsError, match="scoring"):
        load_params(repo_root / "params.yaml", overrides=["llm.scoring.verifier=logits"])


@pytest.mark.slow
@pytest.mark.parametrize("server_kind", ["python", "native"])
def test_real_llama_cpp_servers_return_readable_logprobs(repo_root, server_kind):
    """One yes/no and one JSON judgment against the embedded 0.5B on llama-cpp-python's server (the embedded
    default) and llama.cpp's native server: both answer in the shape read here, with the label's alternatives."""
    from components.embedded.models import ensure_gguf
    from components.embedded.native_server import NativeLlamaServer, NativeServerMissing, llama_server_binary
    from components.embedded.server import LlamaServer
    from components.judges.answer import CORRECT, JUDGE_SCHEMA, parse_verdict
    from components.judges.call import JudgeCall, ask, reasons
    from components.methods.coreact.rubric_eval import YES_NO, parse_yes_no
    from tests.conftest import embedded_available

    if not embedded_available():
        pytest.skip("needs the [embedded] extra")
    if server_kind == "native":
        try:
            llama_server_binary()
        except NativeServerMissing:
            pytest.skip("llama.cpp's native server is not built")
    gguf = ensure_gguf("qwen2.5-coder-0.5b-instruct", str(repo_root / ".cache"))
    server = NativeLlamaServer(gguf, alias="q", n_ctx=1024, threads=1, parallel=1) if server_kind == "native" \
        else LlamaServer(gguf, alias="q", n_ctx=1024, threads=1)
    with server:
        model = OpenAIChatModel(model="q", base_url=server.base_url, json_format="json_object")
        model.scoring = "probability"
        bare = asyncio.run(ask(model, JudgeCall([user("Is Paris in France? Answer with the single word yes or no.")],
                                                reasons(parse_yes_no), Sampling(max_tokens=4), choice=YES_NO)))
        json_reply = asyncio.run(ask(model, JudgeCall(
            [system('Reply only with JSON: {"correct": true} or {"correct": false}.'),
             user("Question: capital of France? Reference answers: Paris\nPredicted answer: Paris, France")],
            parse_verdict, Sampling(max_tokens=16), schema=JUDGE_SCHEMA, choice=CORRECT)))
    for verdict in (bare, json_reply):
        assert verdict.ok and verdict.scored_from == "probability", verdict
        assert 0.0 < verdict.expected < 1.0 and sum(verdict.label_probs.values()) == pytest.approx(1.0)
