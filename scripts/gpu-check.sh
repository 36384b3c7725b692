#!/usr/bin/env bash
# GPU check of arpo on a machine with an NVIDIA GPU, nvcc, cmake and PyTorch
# 2.x with CUDA, without Node: configure against that PyTorch's libtorch,
# build the C++ tests and benches, then in stages, each with its own timeout
# and its result written as soon as it is known:
#   1. test_cuda_kernels: every CUDA kernel vs the CPU kernel (fresh random inputs)
#   2. device_test: a tiny model on cuda:0 vs the CPU (forward, decode with
#      forks, flat and tree train steps), plus the dispatch checks
#   3. model_test / train_test / tree_train_test: the CPU suite of this build
#   4. gpu_bench --bench: each kernel against a D2D copy and the libtorch composition
#   5. model_bench: decode tokens/s at batch 1 and 64, train tokens/s, for a
#      random Qwen2-0.5B-shaped model in bf16 on cuda:0
# The results table goes to $OUT/gpu-<date>.md and bench/results/gpu-<date>.md;
# logs to $OUT (or build-gpu/out). The last lines printed are the table.
#   scripts/gpu-check.sh              everything
#   SANITIZE=1 scripts/gpu-check.sh   run test_cuda_kernels under compute-sanitizer memcheck
#   NO_TORCH=1 scripts/gpu-check.sh   kernels only (no libtorch: stages 1 and 4)
#   STAGES="1 2" scripts/gpu-check.sh only these stages (the build always runs)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
LOGS="${OUT:-$BUILD/out}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
STAGES="${STAGES:-1 2 3 4 5}"
DATE="$(date +%F)"
mkdir -p "$BUILD" "$LOGS"
cd "$ROOT" || exit 1
TABLE="$LOGS/gpu-$DATE.md"
START=$(date +%s)

step() { printf '\n=== %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
row() {  # stage | result | seconds | detail -> the table, at once
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >>"$TABLE"
  cp "$TABLE" "$ROOT/bench/results/gpu-$DATE.md" 2>/dev/null || true
}
# stage <name> <timeout s> <log> <cmd...>: runs it, records rc and wall seconds.
stage() {
  local name="$1" limit="$2" log="$3"
  shift 3
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  STAGE_RC=$?
  STAGE_S=$(( $(date +%s) - t0 ))
  [ $STAGE_RC -eq 124 ] && echo "($name: timed out after $limit s)" >>"$log"
  tail -15 "$log"
}

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$LOGS/nvidia-smi.txt" \
  || die "nvidia-smi failed: no NVIDIA GPU here"
command -v nvcc >/dev/null || die "nvcc not found (needed to build the CUDA kernels)"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
NVCC="$(nvcc --version | tail -1)"
cmake --version | head -1

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

TORCH_ARGS=()
TORCH_DESC="none"
if [ -z "${NO_TORCH:-}" ]; then
  PY="$(command -v python3 || true)"
  if [ -n "$PY" ] && TP="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)" && [ -n "$TP" ]; then
    TORCH_DESC="$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)"
    echo "libtorch: $TP ($TORCH_DESC)"
    TORCH_ARGS=(-DCMAKE_PREFIX_PATH="$TP" -DTorch_DIR="$TP/Torch")
  else
    echo "libtorch: not found (python3 -c 'import torch' failed); kernels only"
  fi
fi

{
  echo "# GPU check, $DATE"
  echo
  echo "Machine: $GPU; $NVCC; libtorch $TORCH_DESC. Written by scripts/gpu-check.sh as each stage finished."
  echo
  echo "| stage | result | s | detail |"
  echo "|---|---|---|---|"
} >"$TABLE"

TARGETS=(test_cuda_kernels gpu_bench)
[ ${#TORCH_ARGS[@]} -gt 0 ] && TARGETS+=(device_test model_test train_test tree_train_test model_bench)

step "configure + build ($BUILD, targets ${TARGETS[*]})"
BDIR="$BUILD/cmake"
mkdir -p "$BDIR"
t0=$(date +%s)
build() {  # $1 = dir, rest = cmake args
  local dir="$1"
  shift
  timeout 420 cmake -S "$ROOT" -B "$dir" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 || return 1
  grep -E '^-- arpo:' "$dir.configure.log"
  timeout 480 cmake --build "$dir" -j "$JOBS" --target "${TARGETS[@]}" >"$dir.build.log" 2>&1
}
if ! build "$BDIR" "${TORCH_ARGS[@]}" -DARPO_WITH_TORCH="$([ ${#TORCH_ARGS[@]} -gt 0 ] && echo ON || echo OFF)"; then
  echo "build with libtorch failed (last lines below); retrying the kernels without the torch layer"
  grep -E 'error|Error' "$BDIR.build.log" | head -20
  tail -25 "$BDIR.configure.log" "$BDIR.build.log" 2>/dev/null
  cp "$BDIR.configure.log" "$LOGS/configure-torch.log" 2>/dev/null
  cp "$BDIR.build.log" "$LOGS/build-torch.log" 2>/dev/null
  row build "FAILED with libtorch" $(( $(date +%s) - t0 )) "see build-torch.log; retried without the torch layer"
  TARGETS=(test_cuda_kernels gpu_bench)
  TORCH_ARGS=()
  BDIR="$BUILD/cmake-notorch"
  mkdir -p "$BDIR"
  build "$BDIR" -DARPO_WITH_TORCH=OFF || {
    tail -40 "$BDIR.configure.log" "$BDIR.build.log"
    cp "$BDIR.build.log" "$LOGS/build.log" 2>/dev/null
    row build FAILED $(( $(date +%s) - t0 )) "kernels alone failed to build too"
    die "build failed"
  }
fi
cp "$BDIR.configure.log" "$LOGS/configure.log"
cp "$BDIR.build.log" "$LOGS/build.log"
row build ok $(( $(date +%s) - t0 )) "$(grep -E '^-- arpo:' "$BDIR.configure.log" | sed 's/^-- arpo: //' | paste -sd ';' -)"

if command -v cuobjdump >/dev/null; then
  LIB="$(find "$BDIR" -name 'libarpo_cuda.a' | head -1)"
  cuobjdump --dump-resource-usage "$LIB" 2>&1 | grep -E 'Function|REG' | sed 's/^[[:space:]]*//' | paste - - >"$LOGS/resource-usage.txt"
fi

summary_of() {  # "N passed, M failed" line of a test log, or its last line
  grep -E '[0-9]+ passed, [0-9]+ failed' "$1" | tail -1 || tail -1 "$1"
}
ALL_RC=0
ran() {  # <stage label> <log>: table row from STAGE_RC / STAGE_S
  local res=ok
  [ "$STAGE_RC" -ne 0 ] && res="FAILED (rc $STAGE_RC)" && ALL_RC=1
  [ "$STAGE_RC" -eq 124 ] && res="TIMED OUT"
  row "$1" "$res" "$STAGE_S" "$(summary_of "$2" | tr '|' '/')"
}

if want 1; then
  step "1. test_cuda_kernels: CUDA kernels vs CPU kernels"
  if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
    stage kernels 300 "$LOGS/test_cuda_kernels.txt" compute-sanitizer --tool memcheck --error-exitcode 3 "$BDIR/test_cuda_kernels"
  else
    stage kernels 150 "$LOGS/test_cuda_kernels.txt" "$BDIR/test_cuda_kernels"
  fi
  ran "1 CUDA kernels vs CPU" "$LOGS/test_cuda_kernels.txt"
fi

if [ ${#TORCH_ARGS[@]} -gt 0 ] && want 2; then
  step "2. device_test: model on cuda:0 vs CPU"
  stage device 150 "$LOGS/device_test.txt" "$BDIR/device_test"
  ran "2 model cuda vs cpu" "$LOGS/device_test.txt"
fi

if [ ${#TORCH_ARGS[@]} -gt 0 ] && want 3; then
  step "3. CPU model tests of this build (libtorch 2.x)"
  for t in model_test train_test tree_train_test; do
    stage "$t" 120 "$LOGS/$t.txt" "$BDIR/$t"
    ran "3 $t" "$LOGS/$t.txt"
  done
fi

if want 4; then
  step "4. kernel timings (medians of 20 runs; GB/s = fewest bytes moved / time)"
  stage gpu_bench 200 "$LOGS/gpu_bench.txt" "$BDIR/gpu_bench" --bench
  ran "4 kernel timings" "$LOGS/gpu_bench.txt"
  { echo; echo '```'; tail -25 "$LOGS/gpu_bench.txt"; echo '```'; echo; } >"$LOGS/gpu_bench_tail.md"
fi

if [ ${#TORCH_ARGS[@]} -gt 0 ] && want 5; then
  step "5. model throughput: random Qwen2-0.5B shape, bf16, cuda:0"
  stage model_bench 240 "$LOGS/model_bench.jsonl" "$BDIR/model_bench" --model qwen2-0.5b --device cuda:0 --dtype bfloat16 \
    --batches 1,64 --steps 64 --prompt 128 --train-seqs 8 --train-len 1024 --train-steps 5
  res=ok
  [ "$STAGE_RC" -ne 0 ] && res="FAILED (rc $STAGE_RC)" && ALL_RC=1
  detail="$(grep '^{' "$LOGS/model_bench.jsonl" | sed -E 's/.*"what":"([a-z]+)"(,"batch":([0-9]+))?.*"tokens_per_s":([0-9.]+).*/\1\3 \4 tok\/s/' | paste -sd ';' -)"
  row "5 qwen2-0.5b bf16 throughput" "$res" "$STAGE_S" "${detail:-see model_bench.jsonl}"
fi

[ -f "$LOGS/gpu_bench_tail.md" ] && cat "$LOGS/gpu_bench_tail.md" >>"$TABLE"
echo "Total: $(( $(date +%s) - START )) s. Logs: test_cuda_kernels.txt, device_test.txt, gpu_bench.txt, model_bench.jsonl, build.log." >>"$TABLE"
cp "$TABLE" "$ROOT/bench/results/gpu-$DATE.md" 2>/dev/null || true

echo
cat "$TABLE"
exit $ALL_RC
