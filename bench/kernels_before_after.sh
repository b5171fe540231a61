#!/usr/bin/env bash
# The default kernel paths' benchmarks of an older tree and of this one, in one run on one GPU:
# both trees' bench binaries are built (Release, sm_90a), then each benchmark runs for the old
# tree, this tree, the old tree again and this tree again, so drift of the device shows.
#   bench/kernels_before_after.sh BEFORE_TREE OUT_DIR
# BEFORE_TREE: a source tree of the older commit, e.g. `git archive REV --prefix=bench-before/ | tar -x`
# (an untracked folder travels with the working tree). Benchmarks: the SSD chunk scan (bf16 io,
# f32 state), the SSM state update and paged decode attention (every dtype), the Gated DeltaNet
# ops, the skinny GEMM and the sparse page selection, each with no kernels: section (the
# defaults); then the table of bench/before_after_report.py (OUT_DIR/report.md). Environment: JOBS
# (default nproc/2 per tree), LIMIT_S per benchmark run (120).
set -uo pipefail
before=${1:?usage: bench/kernels_before_after.sh BEFORE_TREE OUT_DIR}
out=${2:?usage}
mkdir -p "$out"
jobs=${JOBS:-$(($(nproc) / 2))}
limit=${LIMIT_S:-120}
targets=(hyserve-bench-cuda hyserve-bench-gdn hyserve-bench-sparse)
build_tree() {  # SRC BUILD LOG
  { cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DHYSERVE_CUDA_ARCHS=90a &&
    cmake --build "$2" -j "$jobs" --target "${targets[@]}"; } > "$3" 2>&1
}
t=$(date +%s)
build_tree "$before" "$before/build-bench" "$out/build-before.log" &
b1=$!
build_tree . build "$out/build-after.log" &
b2=$!
wait $b1 || { tail -20 "$out/build-before.log"; echo "before: build failed"; exit 1; }
wait $b2 || { tail -20 "$out/build-after.log"; echo "after: build failed"; exit 1; }
echo "builds: $(($(date +%s) - t)) s" | tee "$out/summary.txt"
benches=(
  "ssd|hyserve-bench-cuda ssd_scan --ssm-io=bf16 --ssm-state=f32"
  "kernels|hyserve-bench-cuda ssm_update attention_decode"
  "gdn|hyserve-bench-gdn"
  "skinny|hyserve-bench-cuda skinny_gemm"
  "select|hyserve-bench-sparse select"
)
for round in 1 2; do
  for b in "${benches[@]}"; do
    name=${b%%|*}
    cmd=${b#*|}
    for side in before after; do
      dir=build
      [ "$side" = before ] && dir=$before/build-bench
      # shellcheck disable=SC2086
      timeout "$limit" "$dir/bin/"$cmd > "$out/$name-$side-$round.txt" 2>&1
      echo "$name $side round $round: rc $?" | tee -a "$out/summary.txt"
    done
  done
done
python3 "$(dirname "$0")/before_after_report.py" "$out" | tee "$out/report.md"
