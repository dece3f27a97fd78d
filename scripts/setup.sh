#!/usr/bin/env bash
# Sets up a fresh machine for rubricflow: a virtual environment in .venv with the CPU build of torch,
# the project with its [embedded] and [dev] extras, and the embedded models assembled and verified.
#   bash scripts/setup.sh
# llama.cpp is compiled once: from the source vendored in the pinned llama-cpp-python sdist, as shared
# libraries plus the native server (parallel slots, LoRA adapters: the CPU engine for the trained policy).
# llama-cpp-python is then installed from the same sdist without its own C++ build (LLAMA_BUILD=OFF) and
# loads those libraries, which are copied into its package; the server finds them through its RPATH.
# On some CPUs a native build segfaults (AMX kernels), so native tuning is off and SIMD levels are chosen.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU wheel first: with it installed, torch>=2.13,<2.14 pulls no CUDA packages.
python -m pip install -q "torch==2.13.0"

LLAMA_VERSION=$(python - <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["embedded"]
print(next(re.search(r"==([\w.]+)", d).group(1) for d in deps if d.startswith("llama-cpp-python")))
EOF
)
SITE=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
LIBDIR="$SITE/llama_cpp/lib"
if ! python -c "import llama_cpp" 2>/dev/null || [ ! -x .venv/bin/llama-server ]; then
  started=$(date +%s)
  src=.cache/llama.cpp-src/llama_cpp_python-$LLAMA_VERSION
  if [ ! -d "$src/vendor/llama.cpp" ]; then
    mkdir -p .cache/llama.cpp-src
    python -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$LLAMA_VERSION" -d .cache/llama.cpp-src
    tar -xzf ".cache/llama.cpp-src/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C .cache/llama.cpp-src
  fi
  SIMD="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  # Shared libraries (what llama-cpp-python loads) and the server linked to them; no HTTPS, no web UI (its
  # assets would be downloaded at build time), no tests or examples.
  RELLIB=$(python -c "import os, sys; print(os.path.relpath(sys.argv[1], '.venv/bin'))" "$LIBDIR")
  # Its output goes to a log, shown only if the build fails (cmake's notes, e.g. on the web UI's assets, would
  # read as steps a user has to take).
  log=.cache/llama.cpp-build.log
  # shellcheck disable=SC2086
  if ! { cmake -S "$src/vendor/llama.cpp" -B "$src/build-shared" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON $SIMD \
           "-DCMAKE_BUILD_RPATH=\$ORIGIN;\$ORIGIN/$RELLIB" -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
           -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF &&
         cmake --build "$src/build-shared" --config Release --target llama-server llama mtmd -j2; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: building llama.cpp failed; the whole log is $log" >&2
    exit 1
  fi
  # The Python package from the same sdist, its C++ build switched off: it gets the libraries built above.
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" python -m pip install -q "./$src[server]"
  mkdir -p "$LIBDIR"
  find "$src/build-shared" -name 'lib*.so*' -not -path '*/CMakeFiles/*' -exec cp -P {} "$LIBDIR/" \;
  install -m 755 "$src/build-shared/bin/llama-server" .venv/bin/llama-server
  echo "llama.cpp built once in $(( $(date +%s) - started )) s: its libraries in $LIBDIR, .venv/bin/llama-server"
fi
python -m pip install -q -e ".[embedded,dev]"
python -c "import llama_cpp; llama_cpp.llama_backend_init()"   # the libraries load
.venv/bin/llama-server --version >/dev/null 2>&1                # the server finds them
python -m components.embedded.assemble
echo "setup done: activate with '. .venv/bin/activate'"
