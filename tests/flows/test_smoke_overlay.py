"""The whole DAG under the paper profile's wiring, on a CPU, in minutes: `--profile paper --overlay smoke` swaps every
model for tiny-qwen2 (random weights, the 0.5B's tokenizer, in process) and every count for its minimum, and the flow
runs every stage of STAGES once. What each stage handed to its tracker shows it ran under the paper's wiring: the
profile, its role -> backend names, each method's `shared` block on its training stages, the data source; and every
backend is the tiny in-process one, so nothing is downloaded and no server or API is called.

    RUBRICFLOW_MLFLOW=0 python -m flows.pipeline --profile paper --overlay smoke --targets head_to_head

`pytest -s` prints the stages in the order they ran, each one's wall time, and the total.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from components.method_registry import agent_method, method_section
from components.params import Params, for_method, with_method_settings
from components.params_load import load_params
from components.trained_policy import with_trained_policy
from components.variants import variant_params
from tests.conftest import BENCHMARKS, requires_embedded

pytestmark = requires_embedded  # the tokenizer is read from the embedded 0.5B GGUF

COUNTS = {"group_size", "prompts_per_step", "steps", "max_new_tokens", "epochs", "batch_size", "max_steps",
          "max_turns", "max_search_calls", "max_tokens", "n_worlds", "n_oracle", "n_teacher_questions",
          "samples_per_question"}
"""Keys of grpo, sft and agent that the overlay sets to their minimum; every other key keeps the paper's value."""


class Recorder:
    """What one stage handed its tracker: the params it ran with, the params it logged, its tags."""

    def __init__(self, params: Params, name: str, tags: dict | None):
        self.params, self.name, self.tags, self.logged = params, name, dict(tags or {}), {}
        self.run_id = None

    def log_params(self, params: dict) -> None:
        self.logged.update(params)

    def log_metrics(self, metrics: dict, step: int | None = None) -> None: ...
    def log_artifact(self, path, artifact_path=None) -> None: ...
    def log_table(self, data, artifact_file: str) -> None: ...
    def log_figure(self, figure, artifact_file: str) -> None: ...
    def set_tags(self, tags: dict) -> None: ...


@pytest.fixture
def smoke_run(repo_root, tmp_path, monkeypatch):
    """Run every stage under `--profile paper --overlay smoke`; (stage -> Recorder, [(stage, seconds)], total s, params)."""
    from prefect.testing.utilities import prefect_test_harness

    import flows.pipeline
    import tasks
    from flows.pipeline import STAGES, pipeline

    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    monkeypatch.chdir(tmp_path)  # nothing a run writes beside its out_dir lands in the checkout
    models = Path(repo_root) / ".cache" / "models"  # the assembled GGUF and the tokenizer exported from it, reused
    models.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(models, target_is_directory=True)
    # the paper profile's questions come from a benchmark; where the subsets are absent the wiring runs on the world
    data = [f"data.benchmarks_dir={BENCHMARKS}"] if BENCHMARKS.is_dir() else ["data.source=world"]
    params = load_params(Path(repo_root) / "params.yaml", "paper", overlays=["smoke"], overrides=[
        f"run.out_dir={tmp_path / 'out'}", f"run.cache_dir={tmp_path / 'cache'}", *data])

    runs: dict[str, Recorder] = {}
    finished: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def recording(params, run_name, parent_run_id=None, tags=None):
        tracker = Recorder(params, run_name, tags)
        yield tracker
        if run_name in STAGES:  # not the flow's own run, nor head_to_head's child run per method
            runs[run_name] = tracker
            finished.append((run_name, time.perf_counter()))

    for module in [flows.pipeline, *(m for name, m in vars(tasks).items() if not name.startswith("_"))]:
        if hasattr(module, "tracking"):
            monkeypatch.setattr(module, "tracking", recording)
    threads = torch.get_num_threads()  # run.torch_threads is set for the process by the training stages
    started = time.perf_counter()
    try:
        with prefect_test_harness(server_startup_timeout=600):  # the default 30 s: short on a busy machine
            flow_started = time.perf_counter()
            pipeline(params, targets=list(STAGES))
    finally:
        torch.set_num_threads(threads)
    total = time.perf_counter() - started
    times, last = [], flow_started
    for name, at in finished:  # the stages run one after another: each took from the previous one's end to its own
        times.append((name, at - last))
        last = at
    return runs, times, total, params


def paper_params(repo_root, out_dir: str) -> Params:
    return load_params(Path(repo_root) / "params.yaml", "paper", overrides=[f"run.out_dir={out_dir}"])


def test_every_stage_runs_under_the_paper_wiring(smoke_run, repo_root, capsys):
    from flows.pipeline import STAGES, VARIANTS

    runs, times, total, smoke = smoke_run
    with capsys.disabled():
        print(f"\nsmoke run: RUBRICFLOW_MLFLOW=0 python -m flows.pipeline --profile paper --overlay smoke "
              f"--targets head_to_head ({len(times)} stages, {torch.get_num_threads()} torch threads by default)")
        for name, seconds in times:
            print(f"  {name:40s} {seconds:6.1f} s")
        print(f"  {'total (with the Prefect test server)':40s} {total:6.1f} s")

    assert set(runs) == set(STAGES), f"stages that ran no tracked stage: {sorted(set(STAGES) - set(runs))}"
    paper = paper_params(repo_root, smoke.run.out_dir)
    if BENCHMARKS.is_dir():  # the paper's benchmark replaces the world wherever the subsets are present
        assert smoke.data.source == paper.data.source == "hotpotqa"
    # nothing leaves the machine: every backend is the in-process tiny model; the names are the paper's
    assert {(b.type, b.embedded) for b in smoke.llm.backends.values()} == {("hf", "tiny-qwen2")}, \
        "a backend the smoke overlay does not swap for the tiny model"
    assert set(paper.llm.backends) <= set(smoke.llm.backends)
    for name, run in runs.items():
        used = run.params
        assert (used.profile, used.overlay) == ("paper", ["smoke"]), name
        assert used.data.source == smoke.data.source, name
        expected = paper
        if name.startswith("evaluate@"):  # a method rebinds the policy as the paper's entry says
            method = name.removeprefix("evaluate@")
            if method in paper.methods:
                expected = for_method(paper, method)[0]
            else:  # a trained variant: its warm start's paper backend plus the RL adapter, served by the tiny model
                # here (the paper's vLLM server cannot stack a second adapter: evaluate@<variant> under the real
                # paper profile asks for a methods.<variant> entry, tested below)
                expected = for_method(with_trained_policy(smoke, method), method)[0]
                warm = paper.methods[paper.train_policy.warm_start[expected.methods[method].agent]]
                assert expected.llm.roles["policy"] == f"{warm.roles['policy']}-{method}", name
        assert used.llm.roles == expected.llm.roles, name

    def same_but_counts(stage: str, block: str, logged: dict, want: Params) -> None:
        for key, value in getattr(want, block).model_dump().items():
            if key not in COUNTS:
                assert logged[key] == value, f"{stage}: {block}.{key} is {logged[key]!r}, the paper's is {value!r}"

    for variant in VARIANTS:  # each training stage runs with its paper's shared block over grpo and agent
        stage = f"train_policy@{variant}"
        want = variant_params(paper, variant)  # its method's shared block (a matched baseline's too), dapo's section
        assert runs[stage].logged["train_policy"]["engine"] == "hf"
        for block in ("grpo", "agent"):
            same_but_counts(stage, block, runs[stage].logged[block], want)
    assert runs["train_policy@arbor"].logged["grpo"]["tis_cap"] == paper.arbor.shared.grpo["tis_cap"] == 2.0
    assert runs["train_policy@rubricem"].logged["grpo"]["lr"] == paper.rubricem.shared.grpo["lr"]
    assert runs["train_policy@grpo"].logged["grpo"]["lr"] == paper.grpo.lr
    for stage in ("sft", "sft_scaffold"):  # the warm starts: ReAct's with the paper's sft, the scaffold's RubricEM's
        want = with_method_settings(paper, method_section(agent_method(paper.methods[stage].agent)))
        same_but_counts(stage, "sft", runs[stage].logged["sft"], want)
    assert runs["sft_scaffold"].logged["sft"]["lr"] == paper.rubricem.shared.sft["lr"] != paper.sft.lr

    out = Path(smoke.run.out_dir)
    table = pd.read_csv(out / "head_to_head" / "head_to_head.csv")
    assert set(table["method"]) == {s.removeprefix("evaluate@") for s in STAGES if s.startswith("evaluate@")}
    for reward in ("listwise", "pairwise"):  # garbage votes keep no branching point: the stage says it skipped
        metrics = json.loads((out / "train_rubric_generator" / reward / "metrics.json").read_text())
        assert metrics.get("skipped") == 1.0 or metrics["optimizer_steps"] >= 1
        assert (out / "train_rubric_generator" / reward / "adapter" / "adapter_config.json").is_file()
    assert not (Path.cwd() / "docs").exists()  # a smoke run's table is not a result: no document rewritten
    # the real paper profile serves a trained policy by vLLM over the base its rollouts ran on, which only a vLLM
    # training run exports: it names what is missing rather than stacking a second LoRA on the served warm start
    with pytest.raises(FileNotFoundError, match="holds no warm-started base; train_policy@grpo exports it"):
        with_trained_policy(paper, "grpo")
