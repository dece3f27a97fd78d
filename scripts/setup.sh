#!/usr/bin/env bash
# Sets up a fresh machine for rubricflow: a virtual environment in .venv with the CPU build of torch,
# the project with its [embedded] and [dev] extras, and the embedded models assembled and verified.
#   bash scripts/setup.sh
# llama-cpp-python builds from source; on some CPUs its native build segfaults (AMX kernels), so the
# build flags below turn native tuning off and pick portable SIMD levels. llama.cpp's native server
# (parallel slots, LoRA adapters: the CPU engine for the trained policy) is built with the same flags
# from the llama.cpp source vendored in the same pinned sdist, into .venv/bin/llama-server (about 5
# minutes on 2 cores; skipped when that file exists).
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
if [ ! -x .venv/bin/llama-server ]; then
  started=$(date +%s)
  version=$(python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
  src=.cache/llama.cpp-src/llama_cpp_python-$version
  if [ ! -d "$src/vendor/llama.cpp" ]; then
    mkdir -p .cache/llama.cpp-src
    python -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$version" -d .cache/llama.cpp-src
    tar -xzf ".cache/llama.cpp-src/llama_cpp_python-$version.tar.gz" -C .cache/llama.cpp-src
  fi
  # Static, no HTTPS, no web UI (its assets would be downloaded at build time).
  # shellcheck disable=SC2086
  cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF $CMAKE_ARGS \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$src/build" --config Release --target llama-server -j2 >/dev/null
  install -m 755 "$src/build/bin/llama-server" .venv/bin/llama-server
  echo "llama-server built in $(( $(date +%s) - started )) s: .venv/bin/llama-server"
fi
echo "setup done: activate with '. .venv/bin/activate'"
