#!/usr/bin/env bash
# Run the opt-in CUDA tests of the training engine (tests/training/test_engine_gpu.py) and of the trainable models'
# placement (tests/training/test_device.py: the loaders put the policy on CUDA in bf16) on a GPU machine that has
# torch, transformers and peft but not the project's other dependencies. Wheels found in .gpu_wheels/ (made
# elsewhere, e.g. `pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
# -d .gpu_wheels pydantic`) are installed into a scratch folder first; the repository goes on PYTHONPATH.
# Extra arguments go to pytest.    PYTHON=python3 scripts/gpu_tests.sh [-s] [-k name]
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
# addopts is cleared: the project's deselects gpu tests and may name plugins this machine lacks.
# DeepSpeed ZeRO-2/3 through accelerate on the GPU, where DeepSpeed is installed (e.g. its wheel in .gpu_wheels/)
if "$PY" -c "import deepspeed, accelerate" 2>/dev/null; then
  RUBRICFLOW_DS_DEVICE=cuda "$PY" -m pytest -m slow tests/training/test_deepspeed_stepper.py -p no:cacheprovider \
    -o addopts="" -q -ra "$@" || status=$?
else
  echo "deepspeed not installed: the ZeRO tests are skipped"
fi
"$PY" -m pytest -m gpu tests/training/test_engine_gpu.py tests/training/test_device.py tests/training/test_vllm_engine_gpu.py -p no:cacheprovider -o addopts="" -q -ra "$@" || status=$?
exit "${status:-0}"
