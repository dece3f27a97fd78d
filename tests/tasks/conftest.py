"""Fixtures shared by the stage tests: a scratch workspace with prepared data and a built index."""

from pathlib import Path

import pytest

from components.params import Params
from components.params_load import load_params
from tasks.index import index
from tasks.prepare import prepare


@pytest.fixture
def prepared_params(repo_root, tmp_path, monkeypatch):
    """``prepared_params(*overrides)``: params.yaml with outputs and caches under ``tmp_path``, MLflow off,
    and the prepare and index stages already run."""
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")

    def make(*overrides: str) -> Params:
        p = load_params(Path(repo_root) / "params.yaml", overrides=[
            f"run.out_dir={tmp_path / 'out'}", f"run.cache_dir={tmp_path / 'cache'}", *overrides,
        ])
        prepare.fn(p)
        index.fn(p)
        return p

    return make
