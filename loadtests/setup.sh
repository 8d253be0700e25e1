#!/usr/bin/env bash
# Installs the optional pieces of the benchmarks (idempotent). Run from the repository root:
#   bash loadtests/setup.sh            # perf_analyzer's libraries + a real Triton (nvidia-pytriton)
#   SKIP_TRITON=1 bash loadtests/setup.sh
# PYTHON selects the interpreter whose environment receives the pip packages (default .venv/bin/python).
set -euo pipefail
PYTHON="${PYTHON:-.venv/bin/python}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# perf_analyzer (inside the tritonclient 2.51 wheel) links libb64.so.0d: Debian's libb64-0d.
if ! dpkg -s libb64-0d >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libb64-0d
fi

# ... and libcudart.so.12, even on a machine without a GPU: PyPI's nvidia-cuda-runtime-cu12.
# bench_core finds its nvidia/cuda_runtime/lib folder in site-packages and sets LD_LIBRARY_PATH itself.
"$PYTHON" -m pip install -q nvidia-cuda-runtime-cu12

# Optional: a real Triton 2.51 (python backend only) ships inside the nvidia-pytriton wheel.
if [ "${SKIP_TRITON:-0}" != 1 ]; then
  "$PYTHON" -m pip install -q nvidia-pytriton
fi

lib="$("$PYTHON" - <<'PY'
import site, pathlib
for d in site.getsitepackages():
    p = pathlib.Path(d) / "nvidia" / "cuda_runtime" / "lib"
    if p.is_dir():
        print(p)
        break
PY
)"
pa="$(dirname "$PYTHON")/perf_analyzer"
if LD_LIBRARY_PATH="$lib" "$pa" --version >/dev/null 2>&1; then
  echo "perf_analyzer runs: $pa"
else
  echo "perf_analyzer does not run yet:" >&2
  LD_LIBRARY_PATH="$lib" "$pa" --version >&2 || true
  exit 1
fi
