"""One concurrency limit per backend, shared by every role bound to it, checked against real loopback HTTP
servers: the server never sees more requests at once than its backend's limit, two backends keep separate
limits, a call's timeout starts only once it holds a slot, and the pool closes every HTTP client it opened."""

import asyncio
import threading

import pytest

from components.llm.base import Sampling, user
from components.llm.factory import LLMPool
from components.llm.middleware import ConcurrencyLimit
from components.llm.params import BackendParams
from components.params_load import load_params
from tests.llm.fake_openai_server import FakeOpenAIServer

# roles params.yaml binds to embedded-1_5b and to embedded-0_5b; the test points those backends at fake servers
SOLO_ROLES = ["answer_judge", "verifier", "teacher", "council_judges"]
QUAD_ROLES = ["policy", "rubric_generator"]


@pytest.fixture
def servers():
    with FakeOpenAIServer() as solo, FakeOpenAIServer() as quad:
        yield solo, quad


def pool_for(repo_root, tmp_path, solo, quad, quad_limit=3, **middleware):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    params.llm.middleware = params.llm.middleware.model_copy(update={
        "cache": False, "max_attempts": 1, "max_concurrency": 1, "timeout_s": 10.0, **middleware})
    params.llm.backends["embedded-1_5b"] = BackendParams(type="openai", model="solo", base_url=solo.base_url)
    params.llm.backends["embedded-0_5b"] = BackendParams(type="openai", model="quad", base_url=quad.base_url,
                                                         max_concurrency=quad_limit)
    return LLMPool(params)


def wrappers(pool, roles):
    out = []
    for role in roles:
        out += pool.roles(role)
    return out


async def flood(models, calls_each, sampling=None):
    outs = await asyncio.gather(*(m.chat([user(f"{m.role} {i}")], sampling or Sampling(temperature=0.5))
                                  for m in models for i in range(calls_each)))
    assert all(o.ok for o in outs), [o for o in outs if not o.ok]
    return outs


def test_limits_are_per_backend_and_shared_by_its_roles(repo_root, tmp_path, servers):
    solo, quad = servers
    solo.default, quad.default = ("sleep", 0.05), ("sleep", 0.15)
    with pool_for(repo_root, tmp_path, solo, quad) as pool:
        assert pool.limit("embedded-1_5b").limit == 1 and pool.limit("embedded-0_5b").limit == 3
        assert pool.slots("council_judges", "answer_judge") == 1 and pool.slots("candidate_policies") == 4
        solo_models, quad_models = wrappers(pool, SOLO_ROLES), wrappers(pool, QUAD_ROLES)
        assert len({m.role for m in solo_models}) == 5 and all(m.limit is pool.limit("embedded-1_5b") for m in solo_models)

        async def both():
            await asyncio.gather(flood(solo_models, 3), flood(quad_models, 6))

        asyncio.run(both())
        assert len(solo.requests) == 15 and len(quad.requests) == 12
        assert solo.max_in_flight == 1  # five roles, one single-slot server: one request at a time
        assert quad.max_in_flight == 3  # its own limit, reached, and not shrunk by the other backend's
        # a second event loop reuses the same limits
        asyncio.run(both())
        assert solo.max_in_flight == 1 and quad.max_in_flight == 3 and len(solo.requests) == 30


def test_limit_holds_across_loops_in_threads_and_for_split_samples(repo_root, tmp_path, servers):
    solo, quad = servers
    solo.default = ("sleep", 0.05)
    with pool_for(repo_root, tmp_path, solo, quad) as pool:
        judges = pool.roles("council_judges")
        # llama.cpp ignores n: four seeded samples become four requests, each needing the backend's one slot
        seeded = Sampling(temperature=0.7, seed=5, n=4)
        threads = [threading.Thread(target=asyncio.run, args=(flood([judge], 2, seeded),)) for judge in judges]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(solo.requests) == 16 and solo.max_in_flight == 1
        assert sorted(r["seed"] for r in solo.requests) == [5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8]


def test_queue_time_does_not_count_against_the_timeout(repo_root, tmp_path, servers):
    solo, quad = servers
    solo.default = ("sleep", 0.25)
    with pool_for(repo_root, tmp_path, solo, quad, timeout_s=1.5) as pool:
        models = wrappers(pool, ["answer_judge", "verifier", "teacher", "council_judges"])
        outs = asyncio.run(flood(models, 2))
        # ten calls of 0.25 s through one slot take 2.5 s, well past the timeout; none timed out or retried
        assert max(o.latency_s for o in outs) >= 2.25
        assert all(o.attempts == 1 for o in outs) and solo.max_in_flight == 1
        # the timeout itself still bites once a call holds its slot
        solo.behaviours = [("sleep", 2.5)]
        late = asyncio.run(pool.role("verifier").chat([user("slow")]))
        assert not late.ok and late.error_type == "TransientLLMError" and "timed out" in late.message


def clients_of(pool, name):
    """Record every aiohttp session backend ``name`` opens."""
    opened = []
    per_loop = pool.backend(name)._clients
    make = per_loop._make

    def recording():
        opened.append(make())
        return opened[-1]

    per_loop._make = recording
    return opened


def test_clients_close_at_loop_end_and_on_pool_close_inside_a_loop(repo_root, tmp_path, servers):
    solo, quad = servers
    pool = pool_for(repo_root, tmp_path, solo, quad)
    opened = clients_of(pool, "embedded-1_5b")
    judge = pool.role("answer_judge")
    asyncio.run(flood([judge], 2))
    asyncio.run(flood([judge], 2))
    assert len(opened) == 2 and all(c.closed for c in opened)  # each loop closed its own client

    async def use_then_close():
        await flood([judge], 1)
        assert not opened[-1].closed
        pool.close()  # synchronous code inside a running loop
        for _ in range(5):
            await asyncio.sleep(0)
        return opened[-1].closed

    assert asyncio.run(use_then_close())


def test_pool_close_outside_any_loop_closes_a_client_of_a_loop_in_another_thread(repo_root, tmp_path, servers):
    solo, quad = servers
    pool = pool_for(repo_root, tmp_path, solo, quad)
    opened = clients_of(pool, "embedded-0_5b")
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        asyncio.run_coroutine_threadsafe(flood([pool.role("policy")], 2), loop).result(timeout=10)
        assert len(opened) == 1 and not opened[0].closed
        pool.close()
        assert opened[0].closed
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def test_limiter_is_first_come_first_served_and_survives_cancellation():
    async def scenario():
        limit = ConcurrencyLimit(1)
        order = []

        async def holder(name, hold):
            async with limit:
                order.append(name)
                await asyncio.sleep(hold)

        first = asyncio.create_task(holder("a", 0.05))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(holder(n, 0.01)) for n in "bcd"]
        await asyncio.sleep(0)
        queued[1].cancel()  # "c" gives up while queued: its place must not leak
        await asyncio.gather(first, *queued, return_exceptions=True)
        return order, limit.in_use

    order, in_use = asyncio.run(scenario())
    assert order == ["a", "b", "d"] and in_use == 0


def test_a_slot_handed_to_a_waiter_cancelled_at_that_moment_passes_on():
    async def scenario():
        limit = ConcurrencyLimit(1)
        got = []
        await limit.__aenter__()
        waiter = asyncio.create_task(limit.__aenter__())
        other = asyncio.create_task(limit.__aenter__())
        await asyncio.sleep(0)
        await limit.__aexit__(None, None, None)  # the slot goes to `waiter`...
        waiter.cancel()                            # ...which is cancelled before it could run
        await asyncio.gather(waiter, return_exceptions=True)
        await asyncio.wait_for(other, 1.0)
        got.append(limit.in_use)
        await limit.__aexit__(None, None, None)
        got.append(limit.in_use)
        return got

    assert asyncio.run(scenario()) == [1, 0]


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        ConcurrencyLimit(0)
