import asyncio

import pytest

from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import PermanentLLMError, TransientLLMError, user
from components.llm.factory import LLMPool
from components.params import load_params


def test_roles_share_backends_and_account_separately(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    judge = ScriptedChatModel(lambda m, s: "yes", name="judge-model")
    with LLMPool(params, overrides={"embedded-1_5b": judge}) as pool:
        a, b = pool.role("answer_judge"), pool.role("verifier")
        assert a.inner is b.inner is judge
        asyncio.run(a.chat([user("x")]))
        asyncio.run(a.chat([user("y")]))
        asyncio.run(b.chat([user("z")]))
        metrics = pool.accounting.metrics()
        assert metrics["llm.answer_judge.calls"] == 2 and metrics["llm.verifier.calls"] == 1
        council = pool.roles("council_judges")
        assert [c.role for c in council] == ["council_judges[0]", "council_judges[1]"]
        with pytest.raises(KeyError, match="use roles"):
            pool.role("council_judges")


def test_scripted_backend_cannot_come_from_params(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    params.llm.backends["embedded-1_5b"].type = "scripted"
    with LLMPool(params) as pool, pytest.raises(PermanentLLMError, match="unit tests only"):
        pool.backend("embedded-1_5b")


def test_scripted_backend_replays_errors_through_middleware(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(tmp_path)
    params.llm.middleware.backoff_initial_s = 0.0
    params.llm.middleware.backoff_jitter_s = 0.0
    script = ScriptedChatModel([TransientLLMError("flaky"), "ok"])
    with LLMPool(params, overrides={"embedded-1_5b": script}) as pool:
        out = asyncio.run(pool.role("teacher").chat([user("q")]))
    assert out.ok and out.text == "ok" and out.attempts == 2
