"""prepare cuts a benchmark's splits in the order test, dev, train and says which came out short, instead of
training on fewer questions than asked without a word (the paper profile asks for more than the shared
subsets hold)."""

import json
import logging
from pathlib import Path

from components.params_load import load_params
from tasks.prepare import prepare


def test_a_benchmark_smaller_than_the_sizes_asked_for_is_reported_short(repo_root, tmp_path, monkeypatch,
                                                                         benchmarks_dir, caplog):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    params = load_params(Path(repo_root) / "params.yaml", profile="paper", overrides=[
        f"run.out_dir={tmp_path}", f"data.benchmarks_dir={benchmarks_dir}"])
    assert params.data.source == "hotpotqa"
    with caplog.at_level(logging.WARNING):
        prepare.fn(params)
    summary = json.loads((tmp_path / "data" / "summary.json").read_text())
    assert (summary["questions_test"], summary["questions_dev"]) == (200, 50)  # the paper's 200 test questions
    assert summary["questions_train"] < 11406
    assert summary["short"] == {"train": f"{summary['questions_train']} of 11406"}
    assert "train " in caplog.text and "of 11406" in caplog.text
    ids = [json.loads(line)["id"] for split in ("test", "dev", "train")
           for line in (tmp_path / "data" / f"{split}.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids))  # no question in two splits
