#!/usr/bin/env bash
# device_check.sh: the part of modelsvc's GPU path that runs with PyTorch and NVML alone (no TensorRT, no ONNX
# Runtime CUDA provider), checked on a machine with an NVIDIA GPU, offline, in about 2 minutes (98 s on an H200).
#
#   bash loadtests/gpu/device_check.sh            # from anywhere; OUT=DIR keeps the summary, table and logs
#   env: WHEELS=DIR (default ROOT/.whl): wheels installed with pip --target into a temp folder, first on PYTHONPATH
#        PYTHON (default python3, 3.11+, with torch built for CUDA)   BUDGET_S (default 330)
#
# The wheels are what modelsvc's import path and the tests need beyond such a machine's image (tritonclient,
# litestar, msgspec, hpack, opentelemetry, ...): loadtests/gpu/device_wheels.txt lists them and how to download
# them. loadtests/gpu/verify.sh is the full check, with TensorRT and ONNX Runtime's CUDA provider.
# Steps, each PASS, FAIL or SKIP with its reason in the summary, its output in WORK/logs/NN-step.log:
#   1. gpu          nvidia-smi names the GPU (none: exit 2 with the reason, nothing else runs)
#   2. wheels       pip install --no-index --no-deps --target from WHEELS
#   3. imports      torch sees CUDA; modelsvc's server, tritonclient and pynvml import
#   4. ort-cuda     ONNX Runtime's providers, recorded (SKIP where it has no CUDAExecutionProvider)
#   5. tensorrt     TensorRT imports (SKIP where it is not installed)
#   6. pytest-gpu   tests/backends/test_pytorch_backend.py and tests/server/test_system_metrics.py, whose GPU tests must pass
#   7. pytest-rest  pytest -m gpu on the other GPU test files: none may fail (they skip without TensorRT / ORT CUDA)
#   8. served       python -m loadtests.gpu.bench_torch: a TorchScript encoder served on KIND_GPU (fp32, fp16) and
#                   KIND_CPU: placement, the same result as the CPU, nv_gpu_* metrics, then the sequences/s table
#
# Exit status: 0 no step failed; 1 a step failed; 2 this machine has no usable NVIDIA GPU.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-$ROOT/.whl}"
BUDGET_S="${BUDGET_S:-330}"
OUT_DIR="${OUT:-}"

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
(($# == 0)) || { echo "device_check.sh: takes no arguments (see --help), got: $*" >&2; exit 2; }
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] || { echo "device_check.sh: BUDGET_S must be whole seconds, got $BUDGET_S" >&2; exit 2; }

# --- 1. the GPU ------------------------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "device_check.sh: no NVIDIA GPU here: nvidia-smi is not on PATH (no NVIDIA driver); nothing to check" >&2
  exit 2
fi
if ! GPU_INFO="$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader -i 0 2>&1)" \
  || [[ -z "$GPU_INFO" ]]; then
  echo "device_check.sh: no usable NVIDIA GPU: nvidia-smi failed: ${GPU_INFO:-no output}" >&2
  exit 2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")"
LOGS="$WORK/logs"
SITE="$WORK/site"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 1

NAMES=()
RESULTS=()
REASONS=()
FAILED_LOGS=()
N=0
record() {  # record NAME PASS|FAIL|SKIP REASON
  NAMES+=("$1")
  RESULTS+=("$2")
  REASONS+=("$3")
  printf '[%4ds] %-26s %-4s %s\n' "$SECONDS" "$1" "$2" "$3"
  [[ "$2" != FAIL ]] || FAILED_LOGS+=("$LOG")
}
# run NAME LIMIT_S COMMAND...: COMMAND into WORK/logs/NN-NAME.log, bounded by LIMIT_S and what is left of the budget;
# sets LOG and RC (124: ran past its limit)
run() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET_S - SECONDS))
  ((limit <= left)) || limit=$left
  N=$((N + 1))
  LOG="$LOGS/$(printf '%02d' "$N")-$name.log"
  if ((limit < 5)); then
    echo "the ${BUDGET_S}s budget is spent" >"$LOG"
    RC=124
    return
  fi
  RC=0
  timeout --kill-after=10 "$limit" "$@" >"$LOG" 2>&1 || RC=$?
}
last_line() { grep -v '^\s*$' "$1" | tail -n 1 | cut -c1-200; }
why() {  # why: the reason of a failed run, from RC and the log
  if ((RC == 124 || RC == 137)); then echo "ran past its time (log: ${LOG##*/})"; else
    echo "exit $RC: $(last_line "$LOG") (log: ${LOG##*/})"
  fi
}

LOG="$LOGS/00-nvidia-smi.log"
nvidia-smi >"$LOG" 2>&1
record gpu PASS "$GPU_INFO"

# --- 2. the wheels -----------------------------------------------------------------------------------------------
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  run wheels 120 "$PYTHON" -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl  # the log names each wheel installed
  if ((RC == 0)); then
    record wheels PASS "$(find "$WHEELS" -maxdepth 1 -name '*.whl' | wc -l) wheels into $SITE"
  else
    record wheels FAIL "$(why)"
  fi
else
  record wheels SKIP "no wheels in $WHEELS: $PYTHON's own packages"
fi

# --- 3. imports --------------------------------------------------------------------------------------------------
run imports 90 "$PYTHON" -c "
import sys
assert sys.version_info >= (3, 11), f'Python {sys.version.split()[0]}: modelsvc needs 3.11+'
import numpy, torch, pynvml, tritonclient.http, tritonclient.grpc
import modelsvc.server._serve, modelsvc.backends.pytorch._pytorch, modelsvc.server.observe._nvml
from modelsvc.backends._devices import visible_gpus
assert torch.cuda.is_available(), f'torch {torch.__version__} sees no CUDA device'
print(f'Python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__} '
      f'on {torch.cuda.get_device_name(0)}, visible_gpus() {visible_gpus()}')
"
IMPORTS_OK=0
if ((RC == 0)); then
  IMPORTS_OK=1
  record imports PASS "$(last_line "$LOG")"
else
  record imports FAIL "$(why)"
fi

# --- 4. ONNX Runtime's providers, 5. TensorRT ------------------------------------------------------------------------
run ort-cuda 60 "$PYTHON" -c "
import onnxruntime as ort
print(f'onnxruntime {ort.__version__}: {ort.get_available_providers()}')
"
if ((RC != 0)); then
  record ort-cuda SKIP "onnxruntime does not import: $(why)"
elif grep -q CUDAExecutionProvider "$LOG"; then
  record ort-cuda PASS "$(last_line "$LOG") (listed; the sessions run in pytest-rest)"
else
  record ort-cuda SKIP "$(last_line "$LOG"): the CPU build, no CUDAExecutionProvider"
fi
run tensorrt 60 "$PYTHON" -c "import tensorrt; print('tensorrt', tensorrt.__version__)"
if ((RC == 0)); then
  record tensorrt PASS "$(last_line "$LOG")"
else
  record tensorrt SKIP "not installed: $(last_line "$LOG")"
fi

# --- 6. the GPU tests that need torch and NVML alone ---------------------------------------------------------------
GPU_TESTS=(
  "tests/backends/test_pytorch_backend.py::test_a_gpu_instance_runs_on_cuda"
  "tests/server/test_system_metrics.py::test_a_real_gpu_shows_its_series"
)
PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -rA)
if ((IMPORTS_OK)); then
  run pytest-gpu 150 "${PYTEST[@]}" tests/backends/test_pytorch_backend.py tests/server/test_system_metrics.py
  missing=()
  for test in "${GPU_TESTS[@]}"; do
    grep -q "^PASSED $test\b" "$LOG" || missing+=("${test##*::}")
  done
  if ((RC == 0 && ${#missing[@]} == 0)); then
    record pytest-gpu PASS "$(last_line "$LOG")"
  elif ((RC == 0)); then
    record pytest-gpu FAIL "did not pass (skipped?): ${missing[*]}; $(grep -m1 '^SKIPPED' "$LOG" | cut -c1-160)"
  else
    record pytest-gpu FAIL "$(grep -m1 -E '^(FAILED|ERROR)' "$LOG" | cut -c1-160); $(why)"
  fi
else
  record pytest-gpu SKIP "the imports failed"
fi

# --- 7. the other GPU tests: they need TensorRT or ONNX Runtime's CUDA provider ------------------------------------
mapfile -t OTHER < <(grep -lE 'pytest\.mark\.gpu\b' tests/*.py | grep -vE 'test_(pytorch_backend|system_metrics)\.py$')
if ((IMPORTS_OK && ${#OTHER[@]} > 0)); then
  run pytest-rest 120 "${PYTEST[@]}" -m gpu "${OTHER[@]}"
  counts="$(last_line "$LOG")"
  if ((RC == 0 || RC == 5)); then
    record pytest-rest PASS "$counts; skipped for: $(grep '^SKIPPED' "$LOG" | sed -E 's/.*: //' | sort -u \
      | head -n 3 | cut -c1-80 | paste -sd '|')"
  else
    record pytest-rest FAIL "$(grep -E '^(FAILED|ERROR)' "$LOG" | head -n 3 | cut -c1-120 | paste -sd '|'); $(why)"
  fi
else
  record pytest-rest SKIP "the imports failed or no other file carries pytest.mark.gpu"
fi

# --- 8. a model served on the GPU, and the table ---------------------------------------------------------------------
TABLE="$WORK/table.md"
if ((IMPORTS_OK)); then
  left=$((BUDGET_S - SECONDS - 40))
  run served $((left + 30)) "$PYTHON" -m loadtests.gpu.bench_torch --workdir "$WORK/bench" --output "$TABLE" \
    --budget-s "$((left > 60 ? left : 60))"
  cp "$WORK/bench/server.log" "$LOGS/served-server.log" 2>/dev/null
  while read -r _ name result detail; do
    record "$name" "$result" "$detail"
  done < <(grep '^CHECK ' "$LOG")
  if ((RC == 0)) && [[ -s "$TABLE" ]]; then
    record served PASS "the table below"
  else
    record served FAIL "$(why)"
  fi
else
  record served SKIP "the imports failed"
fi

# --- the summary ---------------------------------------------------------------------------------------------------
SUMMARY="$WORK/summary.txt"
{
  echo "device_check.sh on $GPU_INFO, $(date -u '+%Y-%m-%d %H:%M UTC'), ${SECONDS}s"
  for i in "${!NAMES[@]}"; do
    printf '%-26s %-4s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${REASONS[$i]}"
  done
  echo
  [[ -s "$TABLE" ]] && cat "$TABLE"
} >"$SUMMARY"
echo
echo "=== summary"
cat "$SUMMARY"
FAILED=0
for result in "${RESULTS[@]}"; do [[ "$result" != FAIL ]] || FAILED=$((FAILED + 1)); done
if [[ -n "$OUT_DIR" ]]; then
  mkdir -p "$OUT_DIR"
  cp "$SUMMARY" "$OUT_DIR/summary.txt"
  [[ -s "$TABLE" ]] && cp "$TABLE" "$OUT_DIR/table.md"
  tar -czf "$OUT_DIR/logs.tgz" -C "$WORK" logs
  echo "device_check.sh: summary, table and logs.tgz in $OUT_DIR"
fi
if ((FAILED)); then
  for log in $(printf '%s\n' "${FAILED_LOGS[@]}" | sort -u); do
    echo "--- ${log##*/}: its failures and skips, then its last lines" >&2
    grep -E '^(FAILED|ERROR|SKIPPED|E  )' "$log" | head -n 20 | cut -c1-400 >&2
    tail -n 12 "$log" | cut -c1-400 >&2
  done
  echo "device_check.sh: $FAILED step(s) failed; the logs are in $LOGS" >&2
  exit 1
fi
echo "device_check.sh: no step failed"
