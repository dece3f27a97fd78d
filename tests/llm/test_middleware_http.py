"""Middleware against a real loopback HTTP server that fails on purpose."""

import asyncio

import pytest

from components.llm.accounting import Accounting
from components.llm.backends.openai_http import OpenAIChatModel
from components.llm.base import ChatFailure, Sampling, user
from components.llm.middleware import ReliableChatModel, ResponseCache
from components.llm.params import MiddlewareParams
from tests.llm.fake_openai_server import FakeOpenAIServer

MSG = [user("What is 2+2?")]


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


def make(server, tmp_path, **settings):
    defaults = dict(max_attempts=4, backoff_initial_s=0.1, backoff_max_s=1.0, backoff_jitter_s=0.05,
                    timeout_s=5.0, cache=True, max_concurrency=2)
    defaults.update(settings)
    model = ReliableChatModel(
        OpenAIChatModel(model="fake", base_url=server.base_url), role="judge",
        settings=MiddlewareParams(**defaults), cache=ResponseCache(tmp_path / "cache.sqlite"),
        accounting=Accounting(), price_prompt_per_1k=1.0, price_completion_per_1k=2.0,
    )
    model.delays = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds):
        model.delays.append(seconds)
        await real_sleep(0)  # record the backoff without waiting it out

    model._sleep = recording_sleep
    return model


@pytest.mark.parametrize("failure", [("status", 429), ("status", 500), ("status", 503),
                                     ("malformed", '{"choices": [tru'), ("malformed", "<html>bad gateway</html>")])
def test_transient_errors_are_retried_with_growing_backoff(server, tmp_path, failure):
    server.behaviours = [failure, failure, ("ok", "four")]
    model = make(server, tmp_path)
    out = asyncio.run(model.chat(MSG, Sampling(temperature=0.7)))
    assert out.ok and out.text == "four" and out.attempts == 3
    assert len(server.requests) == 3
    assert len(model.delays) == 2
    # exponential: the second wait is at least the doubled base (0.2 s), the first at most base + jitter
    assert 0.1 <= model.delays[0] <= 0.15 + 1e-9
    assert 0.2 <= model.delays[1] <= 0.25 + 1e-9
    assert model.stats.retries == 2 and model.stats.failures == 0 and model.stats.successes == 1


def test_timeouts_are_retried(server, tmp_path):
    server.behaviours = [("sleep", 1.5), ("ok", "fast")]
    model = make(server, tmp_path, timeout_s=0.5)
    out = asyncio.run(model.chat(MSG, Sampling(temperature=0.7)))
    assert out.ok and out.text == "fast" and out.attempts == 2


@pytest.mark.parametrize("code", [400, 401, 403, 404])
def test_client_errors_are_not_retried_and_come_back_as_failures(server, tmp_path, code):
    server.behaviours = [("status", code), ("ok", "never reached")]
    model = make(server, tmp_path)
    out = asyncio.run(model.chat(MSG))
    assert isinstance(out, ChatFailure)
    assert out.status_code == code and not out.transient and out.attempts == 1
    assert len(server.requests) == 1 and model.delays == []
    assert model.stats.failures == 1 and model.stats.failures_by_type["PermanentLLMError"] == 1


def test_exhausted_retries_return_a_counted_failure_not_a_score(server, tmp_path):
    server.behaviours = [("status", 500)] * 10
    model = make(server, tmp_path, max_attempts=3)
    out = asyncio.run(model.chat(MSG))
    assert isinstance(out, ChatFailure) and out.transient and out.attempts == 3 and out.status_code == 500
    assert len(server.requests) == 3
    assert model.stats.failures == 1 and model.stats.failure_rate == 1.0
    assert model.accounting.metrics()["llm.judge.failures"] == 1.0


def test_cache_hits_on_second_identical_deterministic_call(server, tmp_path):
    server.behaviours = [("ok", "first"), ("ok", "second")]
    model = make(server, tmp_path)
    greedy = Sampling(temperature=0.0, max_tokens=8)
    a = asyncio.run(model.chat(MSG, greedy))
    b = asyncio.run(model.chat(MSG, greedy))
    assert a.text == b.text == "first" and not a.cached and b.cached
    assert len(server.requests) == 1 and model.stats.cache_hits == 1
    # a different prompt, or sampling without a seed, goes to the server
    c = asyncio.run(model.chat([user("other")], greedy))
    d = asyncio.run(model.chat(MSG, Sampling(temperature=0.9)))
    assert not c.cached and not d.cached and len(server.requests) == 3
    # a seeded sampled call is deterministic, hence cached; the cache persists across instances
    seeded = Sampling(temperature=0.9, seed=3)
    asyncio.run(model.chat(MSG, seeded))
    again = make(server, tmp_path)
    assert asyncio.run(again.chat(MSG, seeded)).cached


def test_a_greedy_call_replays_under_another_seed_but_a_sampled_one_does_not(server, tmp_path):
    server.behaviours = [("ok", "greedy"), ("ok", "sampled 1"), ("ok", "sampled 2")]
    model = make(server, tmp_path)
    first = asyncio.run(model.chat(MSG, Sampling(temperature=0.0, max_tokens=8, seed=1)))
    other_seed = asyncio.run(model.chat(MSG, Sampling(temperature=0.0, max_tokens=8, seed=2)))
    assert other_seed.cached and other_seed.text == first.text == "greedy" and len(server.requests) == 1
    a = asyncio.run(model.chat(MSG, Sampling(temperature=0.7, max_tokens=8, seed=1)))
    b = asyncio.run(model.chat(MSG, Sampling(temperature=0.7, max_tokens=8, seed=2)))
    assert not a.cached and not b.cached and (a.text, b.text) == ("sampled 1", "sampled 2")


def test_failures_are_never_cached(server, tmp_path):
    server.behaviours = [("status", 400), ("ok", "fine")]
    model = make(server, tmp_path)
    assert not asyncio.run(model.chat(MSG)).ok
    assert asyncio.run(model.chat(MSG)).text == "fine"


def test_accounting_counts_tokens_and_cost(server, tmp_path):
    model = make(server, tmp_path)
    asyncio.run(model.chat(MSG, Sampling(temperature=0.5)))
    assert model.stats.prompt_tokens == 7 and model.stats.completion_tokens == 3
    assert model.stats.cost == pytest.approx((7 * 1.0 + 3 * 2.0) / 1000)


def test_concurrency_is_bounded(server, tmp_path):
    server.behaviours = [("sleep", 0.3)] * 6
    model = make(server, tmp_path, max_concurrency=2)
    outs = asyncio.run(model.chat_batch([[user(f"q{i}")] for i in range(6)], Sampling(temperature=0.5)))
    assert all(o.ok for o in outs)
    times = sorted(server.request_times)
    # with two slots, the six requests arrive in three waves about 0.3 s apart
    assert times[2] - times[0] >= 0.25 and times[4] - times[2] >= 0.25


def test_n_samples_without_server_support_are_fanned_out_with_derived_seeds(server, tmp_path):
    model = make(server, tmp_path)
    out = asyncio.run(model.chat(MSG, Sampling(temperature=0.8, seed=10, n=3)))
    assert len(out.texts) == 3
    assert sorted(r["seed"] for r in server.requests) == [10, 11, 12]
    assert all(r["n"] == 1 for r in server.requests)


def test_json_schema_is_sent_as_response_format(server, tmp_path):
    model = make(server, tmp_path)
    schema = {"type": "object", "properties": {"ranking": {"type": "array"}}}
    asyncio.run(model.chat(MSG, Sampling(json_schema=schema)))
    assert server.requests[0]["response_format"]["json_schema"]["schema"] == schema


def test_connection_refused_is_transient(tmp_path):
    from tests.llm.fake_openai_server import FakeOpenAIServer as _S

    with _S() as s:
        url = s.base_url
    model = ReliableChatModel(OpenAIChatModel(model="x", base_url=url), role="r",
                              settings=MiddlewareParams(max_attempts=2, backoff_initial_s=0.01, cache=False))
    out = asyncio.run(model.chat(MSG))
    assert isinstance(out, ChatFailure) and out.transient and out.attempts == 2
