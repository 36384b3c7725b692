#!/usr/bin/env bash
# GPU check of the arpo CUDA kernels on a machine with an NVIDIA GPU, nvcc,
# cmake and (optionally) PyTorch, without Node: configure against the local
# PyTorch's libtorch, build the CUDA tests, run them (CUDA vs CPU kernels),
# then time each kernel against a D2D copy and the libtorch composition.
# The last lines printed are the timing table. Logs go to $OUT (or build-gpu/out).
#   scripts/gpu-check.sh              build + tests + timings
#   SANITIZE=1 scripts/gpu-check.sh   also run the tests under compute-sanitizer memcheck
#   NO_TORCH=1 scripts/gpu-check.sh   skip libtorch (copy baseline only)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
LOGS="${OUT:-$BUILD/out}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
mkdir -p "$BUILD" "$LOGS"
cd "$ROOT" || exit 1

step() { printf '\n=== %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$LOGS/nvidia-smi.txt" \
  || die "nvidia-smi failed: no NVIDIA GPU here"
command -v nvcc >/dev/null || die "nvcc not found (needed to build the CUDA kernels)"
nvcc --version | tail -1
cmake --version | head -1

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

SRC="$ROOT"

TORCH_ARGS=()
if [ -z "${NO_TORCH:-}" ]; then
  PY="$(command -v python3 || true)"
  if [ -n "$PY" ] && TP="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)" && [ -n "$TP" ]; then
    echo "libtorch: $TP ($("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null))"
    TORCH_ARGS=(-DCMAKE_PREFIX_PATH="$TP" -DTorch_DIR="$TP/Torch")
  else
    echo "libtorch: not found (python3 -c 'import torch' failed); timing against the copy only"
  fi
fi

configure_and_build() {  # $1 = build dir, rest = extra cmake args
  local dir="$1"
  shift
  cmake -S "$SRC" -B "$dir" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 || return 1
  grep -E '^-- arpo:' "$dir.configure.log"
  cmake --build "$dir" -j "$JOBS" --target test_cuda_kernels gpu_bench >"$dir.build.log" 2>&1
}

step "configure + build ($BUILD)"
mkdir -p "$BUILD/cmake"
BDIR="$BUILD/cmake"
if ! configure_and_build "$BDIR" "${TORCH_ARGS[@]}" -DARPO_WITH_TORCH="$([ ${#TORCH_ARGS[@]} -gt 0 ] && echo ON || echo OFF)"; then
  echo "build with libtorch failed (last lines below); retrying without the torch layer"
  tail -25 "$BDIR.configure.log" "$BDIR.build.log" 2>/dev/null
  cp "$BDIR.configure.log" "$LOGS/configure-torch.log" 2>/dev/null
  cp "$BDIR.build.log" "$LOGS/build-torch.log" 2>/dev/null
  BDIR="$BUILD/cmake-notorch"
  mkdir -p "$BDIR"
  configure_and_build "$BDIR" -DARPO_WITH_TORCH=OFF || {
    tail -40 "$BDIR.configure.log" "$BDIR.build.log"
    cp "$BDIR.build.log" "$LOGS/build.log" 2>/dev/null
    die "build failed"
  }
fi
cp "$BDIR.build.log" "$LOGS/build.log"

step "resource usage (registers / spills per kernel)"
if command -v cuobjdump >/dev/null; then
  LIB="$(find "$BDIR" -name 'libarpo_cuda.a' | head -1)"
  cuobjdump --dump-resource-usage "$LIB" 2>&1 | grep -E 'Function|REG' | sed 's/^[[:space:]]*//' | paste - - \
    | sed -E 's/Function (_Z[^:]*(stats_rows|sample_rows|loss_rows|loss_prepare|loss_reduce|normal_fill|[a-z_]+)[^:]*):/\2:/' \
    | tee "$LOGS/resource-usage.txt" | head -30
fi

step "tests: CUDA kernels vs CPU kernels"
TEST_RC=0
if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BDIR/test_cuda_kernels" 2>&1 | tee "$LOGS/memcheck.txt" | tail -30
  TEST_RC=${PIPESTATUS[0]}
else
  "$BDIR/test_cuda_kernels" 2>&1 | tee "$LOGS/test_cuda_kernels.txt" | tail -40
  TEST_RC=${PIPESTATUS[0]}
fi
echo "test_cuda_kernels exit code: $TEST_RC"
"$BDIR/gpu_bench" 2>&1 | tee "$LOGS/gpu_bench_check.txt" | tail -12
CHECK_RC=${PIPESTATUS[0]}
echo "gpu_bench check exit code: $CHECK_RC"

step "timings (medians of 20 runs; GB/s = fewest bytes moved / time)"
"$BDIR/gpu_bench" --bench 2>&1 | tee "$LOGS/bench.txt" | tail -25
BENCH_RC=${PIPESTATUS[0]}

echo
echo "summary: tests rc=$TEST_RC, check rc=$CHECK_RC, bench rc=$BENCH_RC (logs in $LOGS)"
[ "$TEST_RC" -eq 0 ] && [ "$CHECK_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
