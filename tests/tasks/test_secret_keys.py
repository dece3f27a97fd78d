"""An API key comes from the environment only and leaves no trace: a key planted in the environment reaches the
server as its bearer token, and appears in no file a stage run writes (outputs, MLflow's database and artifacts,
the response cache) and in no log line or printed output."""

from __future__ import annotations

import logging

import pytest

from tasks.evaluate import evaluate
from tests.llm.fake_openai_server import FakeOpenAIServer

KEY = "sk-planted-7f3a9c1e5b2d4f60-do-not-log"


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        srv.default = ("ok", "Thought: I know it.\nAction: finish[Nobody In Particular]")
        yield srv


def test_a_planted_key_reaches_the_server_and_nothing_a_run_writes(prepared_params, server, tmp_path, monkeypatch,
                                                                  capfd, caplog):
    monkeypatch.setenv("RUBRICFLOW_TEST_API_KEY", KEY)
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "1")
    params = prepared_params(
        "data.n_test=2", "evaluation.n_questions=2", "evaluation.llm_judge=true",
        f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"run.mlflow_artifact_root={tmp_path / 'mlruns'}",
        "llm.backends.remote.type=openai", "llm.backends.remote.model=remote-model",
        f"llm.backends.remote.base_url={server.base_url}", "llm.backends.remote.api_key_env=RUBRICFLOW_TEST_API_KEY",
        "llm.roles.policy=remote", "llm.roles.answer_judge=remote")
    with caplog.at_level(logging.DEBUG):
        result = evaluate.fn(params)
    assert result.metrics["n"] == 2.0
    assert server.authorizations and set(server.authorizations) == {f"Bearer {KEY}"}

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in written) and any(p.suffix == ".sqlite" for p in written)
    # the scan reads what the run wrote: the cached requests name the model, MLflow holds the stage's run
    by_name = {p.name: p.read_bytes() for p in written}
    assert b"remote-model" in by_name["llm_responses.sqlite"] and b"evaluate@react" in by_name["mlflow.db"]
    leaked = [str(p) for p in written if KEY.encode() in p.read_bytes()]
    assert not leaked, leaked
    out, err = capfd.readouterr()
    assert KEY not in out and KEY not in err and KEY not in caplog.text


def test_a_named_key_that_is_not_set_is_an_error_naming_the_variable(monkeypatch):
    from components.llm.backends.openai_http import OpenAIChatModel
    from components.llm.base import PermanentLLMError

    monkeypatch.delenv("RUBRICFLOW_TEST_API_KEY", raising=False)
    with pytest.raises(PermanentLLMError, match="RUBRICFLOW_TEST_API_KEY is not set"):
        OpenAIChatModel("remote-model", "http://127.0.0.1:9/v1", api_key_env="RUBRICFLOW_TEST_API_KEY")
    monkeypatch.setenv("RUBRICFLOW_TEST_API_KEY", KEY)
    assert OpenAIChatModel("m", "http://127.0.0.1:9/v1", api_key_env="RUBRICFLOW_TEST_API_KEY").headers == {
        "Authorization": f"Bearer {KEY}"}
    assert OpenAIChatModel("m", "http://127.0.0.1:9/v1").headers == {"Authorization": "Bearer EMPTY"}  # an open server
