#!/usr/bin/env bash
# The key lines of a bench/run_gpu_set.sh output folder, short enough to read in one screen:
# the summary, each test binary's verdict and failures, the probes' tables and verdicts, the
# kernel benchmarks' rows of the variants under test, and each model run's step, floor and prefill
# lines. Written to OUT_DIR/digest.txt and printed.
#   bench/gpu_digest.sh OUT_DIR [WIDTH]   (lines cut at WIDTH characters, default 160)
set -uo pipefail
out=${1:?usage: bench/gpu_digest.sh OUT_DIR [WIDTH]}
width=${2:-160}
digest="$out/digest.txt"
{
  echo "== summary"
  cat "$out/summary.txt" 2> /dev/null
  for f in "$out"/*.log; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .log)
    case $name in
      build | *-build) continue ;;
      gpu-ops | gpu-ops-* | gpu-model | gpu-spec | tests | invariance*-tests)
        echo "== $name"
        grep -E "tests from .* ran|PASSED|FAILED|tests passed|tests failed" "$f" | head -12
        grep -E "Failure|error:|Expected|Which is" "$f" | head -10 ;;
      latency-probe)
        echo "== $name"
        grep -vE "^$" "$f" | head -80 ;;
      wgmma-probe | cublaslt-probe)
        echo "== $name"
        grep -E "copy|^[a-z_]+ n [0-9]|best|row invariance|differ|mismatch|unwritten|MISMATCHES|all outputs" "$f" | head -70 ;;
      moe)
        echo "== $name"
        grep -iE "tokens|TFLOP|anchor|wgmma|moe_layer" "$f" | head -40 ;;
      norm-linear | invariance-linear)
        echo "== $name"
        grep -E "copy|%" "$f" | grep -E "copy \(|wgmma|rows4|wide|registers|spread|batch_invariant lt| fast " | head -90 ;;
      ncu-*)
        # Per profiled launch: its kernel line, duration, DRAM and memory throughput, occupancy,
        # registers and the warp-state headline lines.
        echo "== $name"
        grep -E "^  [a-zA-Z_].*\([0-9]+, [0-9]+, [0-9]+\)x\([0-9]+|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per Thread|stall" "$f" | head -90 ;;
      trace-*)
        # The kernel table of the sampled steps (the longest kernels by exclusive time) and the step lines.
        echo "== $name"
        grep -A16 "kernel trace (" "$f" | head -17
        grep -E "decode floor|step / floor|graph step" "$f" | head -6 ;;
      prefill-profile*)
        echo "== $name"
        grep -E "prefill +[0-9]+ tokens|^profile|^  op |^  [a-z_.+0-9]+ +[0-9]+ +[0-9.]+" "$f" | head -40 ;;
      *)
        # The model benchmarks: step, floor and prefill lines; others: their last lines.
        if grep -qE "decode floor|graph step|prefill +[0-9]+ tokens" "$f"; then
          echo "== $name"
          grep -E "decode floor|step / floor|graph step|prefill +[0-9]+ tokens|sampled|tokens/s" "$f" | head -16
        else
          echo "== $name (last lines)"
          tail -6 "$f"
        fi ;;
    esac
  done
} 2>&1 | tr -s " " | cut -c1-"$width" > "$digest"
cat "$digest"
