#!/usr/bin/env bash
# The GPU check, one command, at most 10 minutes on one GPU: DeepSpeed ZeRO-2/3 through accelerate
# (tests/training/test_deepspeed_stepper.py, where deepspeed is installed), the CUDA training engine
# (tests/training/test_engine_gpu.py), the trainable models' placement (tests/training/test_device.py: bf16 on CUDA)
# and vLLM on CUDA (tests/training/test_vllm_engine_gpu.py: rollouts and LoRA updates, and training with vLLM on the
# same GPU, vLLM holding 30% of it: VLLM_SHARE there), then a table of every test's outcome and time (the
# data-parallel block at its end runs only with 2+ GPUs, adding up to 11 minutes: the README's ZeRO-3 full
# fine-tuning recipe first, then the other 2-rank tests).
# Runs on a machine with torch, transformers and peft (vllm and deepspeed where installed) but not necessarily the
# project's other dependencies: wheels in .gpu_wheels/ (made elsewhere, e.g. `pip download --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d .gpu_wheels pydantic`) go into a scratch folder first;
# the repository goes on PYTHONPATH. Extra arguments go to pytest.    PYTHON=python3 scripts/gpu_tests.sh [-s] [-k name]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".gpu_wheels/*.whl" > /dev/null; then
  deps=${GPU_DEPS_DIR:-/tmp/rubricflow-gpu-deps}
  "$PY" -m pip install --quiet --upgrade --no-index --no-deps --target "$deps" .gpu_wheels/*.whl
  export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', '| transformers', transformers.__version__,
  '| peft', peft.__version__)"
reports=$(mktemp -d)
# addopts is cleared: the project's deselects gpu tests and may name plugins this machine lacks. Each part has its
# own limit, so the whole stays under 10 minutes.
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "no CUDA device: the ZeRO tests need one (RUBRICFLOW_DS_DEVICE=cuda); the gpu tests below skip"
elif "$PY" -c "import deepspeed, accelerate" 2>/dev/null; then
  RUBRICFLOW_DS_DEVICE=cuda timeout 240 "$PY" -m pytest -m slow tests/training/test_deepspeed_stepper.py \
    -p no:cacheprovider -o addopts="" -q -ra --junitxml="$reports/zero.xml" "$@" || status=$?
else
  echo "deepspeed not installed: the ZeRO tests are skipped"
fi
timeout 330 "$PY" -m pytest -m gpu tests/training/test_engine_gpu.py tests/training/test_device.py \
  tests/training/test_vllm_engine_gpu.py -p no:cacheprovider -o addopts="" -q -ra -s --junitxml="$reports/gpu.xml" \
  "$@" || status=$?

# ---- data-parallel ranks (issue 75; components/training/distributed.py) ------------------------------------------
# One rank a GPU under NCCL: the 2-rank tests of tests/training/test_data_parallel.py (the kill test too) with
# RUBRICFLOW_DP_DEVICE=cuda (the one-process reference on cuda:0; ZeRO cases included when deepspeed imports).
# NCCL takes one GPU a rank, so a single-GPU machine skips this block.
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
recipe=tests/training/test_data_parallel.py::test_two_ranks_fully_fine_tune_grpo_under_zero3_to_the_single_process_weights
if [ "${gpus:-0}" -ge 2 ]; then
  # the full fine-tuning recipe (lora.r=0, ZeRO-3 on 2 ranks, the policy generating on its gathered weights) against
  # one process, then resumed from its 2-rank checkpoint; needs deepspeed (skipped without it)
  RUBRICFLOW_DP_DEVICE=cuda timeout 240 "$PY" -m pytest -m slow "$recipe" \
    -p no:cacheprovider -o addopts="" -q -ra -s --junitxml="$reports/recipe.xml" "$@" || status=$?
  RUBRICFLOW_DP_DEVICE=cuda timeout 420 "$PY" -m pytest -m "slow or not slow" tests/training/test_data_parallel.py \
    --deselect "$recipe" -p no:cacheprovider -o addopts="" -q -ra -s --junitxml="$reports/dp.xml" "$@" || status=$?
else
  echo "data-parallel block: ${gpus:-0} GPU(s), NCCL needs 2 (one a rank): skipped"
fi
"$PY" - "$reports" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

rows = []
for report in sorted(Path(sys.argv[1]).glob("*.xml")):
    for case in ET.parse(report).iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        rows.append((report.stem, f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}",
                     outcome, float(case.get("time", 0))))
width = max((len(r[1]) for r in rows), default=10)
print(f"\n{'part':5s} {'test':{width}s} {'outcome':8s} {'s':>7s}")
for part, test, outcome, seconds in rows:
    print(f"{part:5s} {test:{width}s} {outcome:8s} {seconds:7.1f}")
print(f"{len(rows)} tests: " + ", ".join(f"{sum(r[2] == o for r in rows)} {o}" for o in ("passed", "failure", "error", "skipped")))
EOF
exit "${status:-0}"
