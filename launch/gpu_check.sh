#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with the CUDA backend (HYSERVE_CUDA_ARCHS, default
# 90a), run the whole test suite (CUDA tests included), then the GPU benchmarks. Logs go to
# LOG_DIR (default build/gpu-logs).
#   launch/gpu_check.sh [tests|bench|all] [LOG_DIR]
# tests: build + ctest. bench: build + kernel, sparse, all-reduce and end-to-end model benchmarks.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WHAT="${1:-all}"
LOG_DIR="${2:-$HYSERVE_BUILD_DIR/gpu-logs}"
mkdir -p "$LOG_DIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$LOG_DIR/gpu.txt" 2>&1 || true
export HYSERVE_BUILD_TYPE="${HYSERVE_BUILD_TYPE:-Release}"
export HYSERVE_CMAKE_ARGS="${HYSERVE_CMAKE_ARGS:--DHYSERVE_CUDA_ARCHS=90a}"
install_deps >"$LOG_DIR/deps.log" 2>&1 || log "dependency check failed (see deps.log); building anyway"
build_project >"$LOG_DIR/build.log" 2>&1 || { tail -50 "$LOG_DIR/build.log"; exit 1; }
BIN="$HYSERVE_BUILD_DIR/bin"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
status=0
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  (cd "$HYSERVE_BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 600) >"$LOG_DIR/ctest.log" 2>&1 || status=1
  tail -30 "$LOG_DIR/ctest.log"
  # The CUDA grids and GPU model parity in full (names of every case, skips listed).
  "$BIN/cuda_ops_test" >"$LOG_DIR/cuda_ops_test.log" 2>&1 || status=1
  "$BIN/gpu_model_test" >"$LOG_DIR/gpu_model_test.log" 2>&1 || status=1
  tail -3 "$LOG_DIR/cuda_ops_test.log" "$LOG_DIR/gpu_model_test.log"
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  "$BIN/hyserve-bench-cuda" >"$LOG_DIR/bench_cuda.txt" 2>&1 || status=1
  "$BIN/hyserve-bench-gdn" >"$LOG_DIR/bench_gdn.txt" 2>&1 || status=1
  "$BIN/hyserve-bench-sparse" >"$LOG_DIR/bench_sparse.txt" 2>&1 || status=1
  "$BIN/hyserve-bench-model" "$HYSERVE_ROOT/configs/bamba-9b-synthetic-cuda.yaml" --json "$LOG_DIR/bench_model.json" \
    >"$LOG_DIR/bench_model.txt" 2>&1 || status=1
  cat "$LOG_DIR/bench_cuda.txt" "$LOG_DIR/bench_gdn.txt" "$LOG_DIR/bench_sparse.txt" "$LOG_DIR/bench_model.txt" 2>/dev/null | tail -80
fi
exit $status
