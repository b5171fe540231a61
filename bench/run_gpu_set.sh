#!/usr/bin/env bash
# The GPU benchmark set in one call: configure and build once (Release, sm_90a), then, each
# under its own time limit and with its log under OUT_DIR, the whole test suite with the CUDA
# backend and the benchmarks bench/results/ reports (kernels, 9B end to end, speculative
# decoding). Stages that do not fit in the time left are skipped and named.
#   bench/run_gpu_set.sh OUT_DIR [STAGE ...]
# Stages (default: all, in this order): tests select ssd kernels (state update and paged decode
# attention, every dtype) gdn (with bench/gdn_anchor.py: flash-linear-attention, when
# installed) skinny model spec-pred spec-rand spec-draft; also gpu-tests (the
# GPU test binaries directly: every CUDA op against the CPU op, the GPU model tests and the
# speculative CUDA tests; GPU_TEST_FILTER narrows cuda_ops_test: a gtest filter, where
# parameterised suites' names start with their instantiation, e.g. '*PagedAttentionCuda*'),
# gpu-ops (cuda_ops_test alone, GPU_TEST_FILTER), gpu-model (gpu_model_test alone, GPU_MODEL_FILTER), model-mma / spec-pred-mma
# (model and spec-pred with the tensor-core skinny GEMM: a copy of the config with
# kernels: {skinny: mma} added, under OUT_DIR), and serve-cuda
# (launch/serve.sh configs/cuda.yaml, or SERVE_CONFIG, on the same build: /health, a completion,
# /metrics, then stopped), served / served-qwen (bench/served_vs_engine.sh on the 9B synthetic
# Bamba / the tiny Qwen3-Next: the engine bench and the served path side by side; served-qwen80 on
# the Qwen3-Next-80B-A3B-shaped config) and startup
# (seconds to /health 200 for the 9B synthetic config and for a 9B checkpoint written by
# hyserve-write-checkpoint); moe (hyserve-bench-cuda moe beside bench/moe_anchor.py's PyTorch
# anchor), families (hyserve-bench-model on the Nemotron-H, Granite-4.0-H, Falcon-H1 and
# Qwen3-Next-80B-A3B shaped configs: batch 1 / 64 decode and 8K prefill) and prefix
# (bench/prefix_served.sh on the 9B synthetic Bamba: TTFT and multi-turn, cache off and on) and
# model-tp2 (hyserve-bench-model on the 9B synthetic Bamba at TP=2, both ranks on the one GPU);
# decode-slices (Falcon-H1-7B's batch-1 step, or SLICES_CONFIGS', with kernels.attn_decode_max_slices
# default, 1, 2, 4, 8);
# moe-decode (the MoE families' steps at batches 1, 2, 4, 8 with kernels.moe_decode default, split,
# fused and single, or MOE_DECODE_KINDS, at MOE_DECODE_BATCHES (default 1,2,4,8):
# Granite-4.0-H-Tiny, or MOE_DECODE_CONFIGS); gated-norm (batch-1 decode with the
# mixers' gated output norm inside out_proj and apart, kernels.norm_linear_gate: GATED_CONFIGS);
# norm-linear (hyserve-bench-cuda norm_linear: the fused linear kernel at 1-4 rows with its
# weights in registers, with norm_linear_wide and with norm_linear_rows 4, % of copy); wide-linear (batch-1 decode with
# kernels.norm_linear_wide (or the keys of WIDE_KEYS: KEY, or KEY=VALUE) and without: WIDE_CONFIGS; or the
# items of WIDE_RUNS, CONFIG:KEY[=VALUE][,KEY2[=VALUE2]…], each config's default once); ncu
# (Nsight Compute sections of the decode step's MoE and linear kernels: NCU_CONFIG, NCU_KERNELS, or
# NCU_RUNS items CONFIG:REGEX); ncu-moe
# (the same for the experts' GEMMs of an 8K prefill and of hyserve-bench-cuda moe: NCU_MOE_KEYS);
# gpu-check (gpu-tests and gpu-service concurrently, for correctness only); gpu-quick (the op
# tests in 4 shards, the model and the speculative GPU tests, all at once); invariance
# (determinism: batch_invariant: the kernels' row-invariance tests and the Device/BatchInvariance
# cases, a request alone against it among 63 random arrivals on the GPU, and Device/PrefixInvariance:
# the prefix cache on against off), invariance-speed (the
# linear layers per row count and the 9B decode step in both modes, each also on the
# warpgroup-MMA linear kernel), invariance-spec
# (speculative identity at batches 1, 8, 32: n-gram and the draft model chain) and
# invariance-spec-tree (the same with a draft tree); spec-profile (the op profile of a verify step at
# batches 8 and 32, fast and batch_invariant); floors (one batch-1 decode step op by op for
# Falcon-H1, Nemotron-H and Granite-4.0-H, and the MoE op's kernels under nsys); trace (CUPTI's
# kernel records of batch-1 graph decode steps: span, busy time, gaps, the longest kernels, for
# the 9B and the family configs); cublaslt-probe
# (bench/probes/cublaslt_invariance_probe.cu: a pinned cuBLASLt algorithm's rows across m, against
# one mma.sync chain over k); wgmma-probe (bench/probes/wgmma_linear_probe.cu: the warpgroup-MMA
# linear kernel against a reference and beside cuBLAS); latency-probe (bench/probes/decode_latency_probe.cu:
# µs a dependent kernel in a graph, with and without PDL and clusters; µs a grid barrier; bulk-copy
# rings against plain loads streaming 4–40 MB, contiguous and as scattered 4 MB chunks); prefill-profile (an 8K prefill op by op:
# PROFILE_CONFIGS); prefill-variants (8K prefill with an opt-in prefill kernel and without:
# PREFILL_RUNS); compare (this tree against
# BASELINE_DIR: linear layers, MoE, the 9B step and prefill in both modes, Falcon-H1's batch-1
# step and prefill, Granite-4.0-H-Tiny's and Nemotron-H-8B's batch-1 steps).
# Only the targets the stages need are built (everything for tests). Environment: BUILD_DIR
# (default build), BUDGET_S (seconds for the whole call, default 3000), JOBS (default: nproc).
set -uo pipefail

out=${1:?usage: bench/run_gpu_set.sh OUT_DIR [STAGE ...]}
shift
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests select ssd kernels gdn skinny model spec-pred spec-rand spec-draft)
mkdir -p "$out"
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
start=$(date +%s)
deadline=$((start + ${BUDGET_S:-3000}))
left() { echo $((deadline - $(date +%s))); }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F)" | tee "$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$out/summary.txt" 2>&1

# Targets of the stages asked for (empty: all).
targets=()
for s in "${stages[@]}"; do
  case $s in
    tests) targets=(); break ;;
    gpu-tests) targets+=(cuda_ops_test gpu_model_test spec_test) ;;
    gpu-ops) targets+=(cuda_ops_test) ;;
    gpu-model) targets+=(gpu_model_test) ;;
    select) targets+=(hyserve-bench-sparse) ;;
    ssd | skinny | kernels | norm-linear) targets+=(hyserve-bench-cuda) ;;
    gdn) targets+=(hyserve-bench-gdn) ;;
    model | model-mma) targets+=(hyserve-bench-model) ;;
    spec-*) targets+=(hyserve-bench-spec) ;;
    serve-cuda) targets+=(coordinator worker hyserve-generate hyserve-bench) ;;
    served | served-qwen | served-qwen80) targets+=(coordinator worker hyserve-generate hyserve-bench hyserve-bench-model) ;;
    startup) targets+=(coordinator worker hyserve-generate hyserve-write-checkpoint) ;;
    gpu-service) targets+=(coordinator worker service_test tp_parity_test host_collective_test) ;;
    gpu-check) targets+=(cuda_ops_test gpu_model_test spec_test coordinator worker service_test tp_parity_test host_collective_test) ;;
    gpu-quick) targets+=(cuda_ops_test gpu_model_test spec_test) ;;
    diag-qwen) targets+=(coordinator worker hyserve-bench) ;;
    moe) targets+=(hyserve-bench-cuda) ;;
    gated-norm | wide-linear | ncu) targets+=(hyserve-bench-model) ;;
    ncu-moe) targets+=(hyserve-bench-model hyserve-bench-cuda) ;;
    compare) targets+=(hyserve-bench-cuda hyserve-bench-model) ;;
    invariance) targets+=(spec_test cuda_ops_test) ;;
    invariance-speed) targets+=(hyserve-bench-cuda hyserve-bench-model) ;;
    invariance-spec | invariance-spec-tree | spec-profile) targets+=(hyserve-bench-spec) ;;
    families | model-tp2 | decode-slices | moe-decode) targets+=(hyserve-bench-model) ;;
    floors) targets+=(hyserve-bench-model hyserve-bench-cuda) ;;
    trace | prefill-profile | prefill-variants) targets+=(hyserve-bench-model) ;;
    cublaslt-probe) targets+=(hyserve-bench-cuda) ;;
    prefix) targets+=(coordinator worker hyserve-bench) ;;
  esac
done
target_args=()
[ ${#targets[@]} -gt 0 ] && target_args=(--target "${targets[@]}")
# Stages that build their own binary (the probes) need no CMake build.
build_all=0
for s in "${stages[@]}"; do
  case $s in wgmma-probe | cublaslt-probe | latency-probe) ;; *) build_all=1 ;; esac
done
[ ${#targets[@]} -gt 0 ] && build_all=0
mkdir -p "$build"

t=$(date +%s)
if [ ${#targets[@]} -eq 0 ] && [ $build_all = 0 ]; then
  echo "build: none needed" | tee -a "$out/summary.txt"
elif ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHYSERVE_CUDA_ARCHS=90a &&
       cmake --build "$build" -j "$jobs" "${target_args[@]}"; } > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "build failed" | tee -a "$out/summary.txt"
  exit 1
fi
echo "build: $(($(date +%s) - t)) s" | tee -a "$out/summary.txt"

bin=$build/bin
# with_kernels CONFIG KEY VALUE: prints the path of a copy of CONFIG (under OUT_DIR) with
# kernels.KEY: VALUE added (the kernel path choices are config keys; README, Configuration).
with_kernels() {
  local conf
  conf="$out/$(basename "$1" .yaml)-$2-$3.yaml"
  python3 - "$1" "$conf" "$2" "$3" << 'EOF'
import sys, yaml
import os
c = yaml.safe_load(open(sys.argv[1]))
v = sys.argv[4]
v = v == "true" if v in ("true", "false") else v
c.setdefault("kernels", {})[sys.argv[3]] = v
# A synthetic model's shapes file is found beside its config: keep it found from the copy.
syn = (c.get("model") or {}).get("synthetic")
if isinstance(syn, dict) and "hf_config" in syn and not os.path.isabs(syn["hf_config"]):
    syn["hf_config"] = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), syn["hf_config"])
yaml.safe_dump(c, open(sys.argv[2], "w"), default_flow_style=None)
EOF
  echo "$conf"
}
# with_kernel_items CONFIG ITEM...: the same for several items, each KEY (true) or KEY=VALUE.
with_kernel_items() {
  local conf=$1 kv
  shift
  for kv in "$@"; do
    case $kv in *=*) conf=$(with_kernels "$conf" "${kv%%=*}" "${kv#*=}") ;; *) conf=$(with_kernels "$conf" "$kv" true) ;; esac
  done
  echo "$conf"
}
# stage NAME LIMIT_S COMMAND...: runs COMMAND with at most LIMIT_S seconds (less when less is
# left), its output in OUT_DIR/NAME.log.
stage() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  if [ "$l" -lt 30 ]; then
    echo "$name: skipped (${l} s left)" | tee -a "$out/summary.txt"
    return
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0
  t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc, $(($(date +%s) - t0)) s (limit $limit s): $*" | tee -a "$out/summary.txt"
}

for s in "${stages[@]}"; do
  case $s in
    tests) stage tests 600 ctest --test-dir "$build" -j "$jobs" --timeout 140 --output-on-failure -E OpenAIClient ;;
    gpu-ops) stage gpu-ops 240 "$bin/cuda_ops_test" --gtest_filter="${GPU_TEST_FILTER:-*}" ;;
    gpu-model) stage gpu-model 240 "$bin/gpu_model_test" --gtest_filter="${GPU_MODEL_FILTER:-*}" ;;
    gpu-tests)
      stage gpu-ops 240 "$bin/cuda_ops_test" --gtest_filter="${GPU_TEST_FILTER:-*}"
      stage gpu-model 240 "$bin/gpu_model_test"
      stage gpu-spec 240 "$bin/spec_test" --gtest_filter='*Cuda*' ;;
    select) stage select 120 "$bin/hyserve-bench-sparse" select ;;
    ssd) stage ssd 180 "$bin/hyserve-bench-cuda" ssd_scan --ssm-io=bf16 --ssm-state=f32 ;;
    kernels) stage kernels 180 "$bin/hyserve-bench-cuda" ssm_update attention_decode ;;
    gdn)
      stage gdn 180 "$bin/hyserve-bench-gdn"
      stage gdn-anchor 120 python3 bench/gdn_anchor.py ;;  # flash-linear-attention, when installed
    skinny) stage skinny 180 "$bin/hyserve-bench-cuda" skinny_gemm ;;
    norm-linear) stage norm-linear 180 "$bin/hyserve-bench-cuda" norm_linear ;;
    model) stage model 400 "$bin/hyserve-bench-model" configs/bamba-9b-synthetic-cuda.yaml --batches 1,8,16,64 \
             --decode-steps 8 --profile-step --verify-width 5 --json "$out/model.json" ;;
    model-mma) stage model-mma 300 "$bin/hyserve-bench-model" "$(with_kernels configs/bamba-9b-synthetic-cuda.yaml skinny mma)" \
                 --batches 1,8 --decode-steps 8 --profile-step --verify-width 5 --json "$out/model-mma.json" ;;
    spec-pred-mma) stage spec-pred-mma 400 "$bin/hyserve-bench-spec" \
                     "$(with_kernels configs/bamba-9b-synthetic-cuda-spec.yaml skinny mma)" --batches 1,8,32 --prompt-len 1024 --new-tokens 128 \
                     --json "$out/spec-pred-mma.json" ;;
    spec-pred) stage spec-pred 400 "$bin/hyserve-bench-spec" configs/bamba-9b-synthetic-cuda-spec.yaml \
                 --batches 1,8,32 --prompt-len 1024 --new-tokens 128 --json "$out/spec-pred.json" ;;
    spec-rand) stage spec-rand 400 "$bin/hyserve-bench-spec" configs/bamba-9b-synthetic-cuda.yaml \
                 --batches 1,8,32 --prompt-len 512 --new-tokens 128 --json "$out/spec-rand.json" ;;
    spec-draft) stage spec-draft 300 "$bin/hyserve-bench-spec" configs/bamba-9b-synthetic-cuda-spec.yaml \
                  --batches 1 --prompt-len 1024 --new-tokens 128 --draft-tokens 7 --draft-layers 4 \
                  --json "$out/spec-draft.json" ;;
    serve-cuda) stage serve-cuda 180 bash -c '
        export HYSERVE_BUILD_DIR='"$build"' HYSERVE_BUILD_TYPE=Release HYSERVE_CMAKE_ARGS=-DHYSERVE_CUDA_ARCHS=90a
        launch/serve.sh '"${SERVE_CONFIG:-configs/cuda.yaml}"' > '"$out"'/serve-cuda.server.log 2>&1 &
        pid=$!
        for i in $(seq 1 150); do curl -sf localhost:8000/health > /dev/null && break; sleep 1; done
        curl -sf localhost:8000/health && echo &&
          curl -sf localhost:8000/v1/completions -d "{\"prompt\": [1, 2, 3], \"max_tokens\": 8}" && echo &&
          curl -sf localhost:8000/metrics | grep -E "^hyserve_(requests|generated)" | head -5
        rc=$?
        kill -TERM $pid; wait $pid
        tail -5 '"$out"'/serve-cuda.server.log
        exit $rc' ;;
    served) stage served 420 bench/served_vs_engine.sh configs/bamba-9b-synthetic-cuda.yaml "$out" bamba-9b ;;
    gpu-service)
      # The service and collective tests whose CUDA cases need a device: overlapped decode
      # on the GPU, the host-staged collective with ranks sharing the device, TP=2 on one GPU.
      stage gpu-service-overlap 240 "$bin/service_test" --gtest_filter='ServiceOverlap.Cuda*'
      stage gpu-host-collective 120 ctest --test-dir "$build" --output-on-failure -R 'MpiHostCollective'
      stage gpu-tp-parity 300 mpirun ${OMPI_ALLOW_RUN_AS_ROOT:+--allow-run-as-root --oversubscribe} -np 2 \
        "$bin/tp_parity_test" --gtest_filter='*Cuda*'
      stage gpu-tp4-parity 300 mpirun ${OMPI_ALLOW_RUN_AS_ROOT:+--allow-run-as-root --oversubscribe} -np 4 \
        "$bin/tp_parity_test" --gtest_filter='*Cuda*'
      # TP 2/4, DP 2 and DP 2 × TP 2 served over HTTP on the one GPU against one rank (plain,
      # n-gram drafting, sparse attention; bamba-tiny and qwen3next-tiny f32, bamba-tiny bf16).
      stage gpu-layouts 540 "$bin/service_test" --gtest_filter='ParallelLayoutsOneGpu.*'
      # Answers' checkpoints saved by decode steps queued behind the step in flight.
      stage gpu-prefix-turns 180 "$bin/service_test" --gtest_filter='PrefixTurnsCudaService.*' ;;
    gpu-check)
      # gpu-tests and gpu-service at once: every GPU correctness binary concurrently on the one
      # device (tiny models; each process sizes its caches by its own max_requests), the
      # ParallelLayoutsOneGpu cases as gtest shards. Not for timing: the processes share the GPU.
      mpi=(mpirun ${OMPI_ALLOW_RUN_AS_ROOT:+--allow-run-as-root --oversubscribe})
      stage gpu-ops 420 "$bin/cuda_ops_test" --gtest_filter="${GPU_TEST_FILTER:-*}" &
      stage gpu-model 420 "$bin/gpu_model_test" &
      stage gpu-spec 420 "$bin/spec_test" --gtest_filter='*Cuda*' &
      stage gpu-service-overlap 300 "$bin/service_test" --gtest_filter='ServiceOverlap.Cuda*' &
      stage gpu-host-collective 200 ctest --test-dir "$build" --output-on-failure -R 'MpiHostCollective' &
      stage gpu-tp-parity 420 "${mpi[@]}" -np 2 "$bin/tp_parity_test" --gtest_filter='*Cuda*' &
      stage gpu-tp4-parity 420 "${mpi[@]}" -np 4 "$bin/tp_parity_test" --gtest_filter='*Cuda*' &
      for i in 0 1 2 3; do
        stage "gpu-layouts-$i" 450 env GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i "$bin/service_test" \
          --gtest_filter='ParallelLayoutsOneGpu.*' &
      done
      stage gpu-prefix-turns 300 "$bin/service_test" --gtest_filter='PrefixTurnsCudaService.*' &
      wait ;;
    gpu-quick)
      # The op, model and speculative GPU tests at once (cuda_ops_test as 4 gtest shards), each
      # under QUICK_LIMIT seconds (default 200): the whole kernel suite in about a quarter of
      # gpu-tests' time. Not for timing.
      for i in 0 1 2 3; do
        stage "gpu-ops-$i" "${QUICK_LIMIT:-200}" env GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i "$bin/cuda_ops_test" &
      done
      stage gpu-model "${QUICK_LIMIT:-200}" "$bin/gpu_model_test" &
      stage gpu-spec "${QUICK_LIMIT:-200}" "$bin/spec_test" --gtest_filter='*Cuda*:Device/*' &
      wait ;;
    model-tp2)
      # The 9B synthetic Bamba at TP=2, both ranks on the one GPU (host-staged reductions): a
      # functional check of the sharded CUDA path, not a speed claim. It runs in the background
      # (with a quarter of the device's memory for its caches) beside the stages after it; the
      # script waits for it at the end.
      python3 - configs/bamba-9b-synthetic-cuda.yaml "$out/bamba-9b-tp2.yaml" << 'EOF2'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c["parallel"] = {"tp": 2, "dp": 1, "device_collective": "host"}
c["cache"].update({"max_requests": 16, "max_context": 4096, "gpu_memory_fraction": 0.25})
for k in ("tokenizer", "path"):
    v = c.get("model", {}).get(k)
    if isinstance(v, str) and not v.startswith("/"):
        import os; c["model"][k] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), v))
yaml.safe_dump(c, open(sys.argv[2], "w"), default_flow_style=None)
EOF2
      stage model-tp2 400 mpirun ${OMPI_ALLOW_RUN_AS_ROOT:+--allow-run-as-root --oversubscribe} -np 2 \
        "$bin/hyserve-bench-model" "$out/bamba-9b-tp2.yaml" --batches 1,16 --decode-steps 8 --prefill-len 2048 \
        --json "$out/model-tp2.json" &
      ;;
    diag-qwen)
      # bench/diag_served.sh on the tiny Qwen3-Next with 2 and 3 steps in flight.
      for k in ${OVERLAPS:-2 3}; do
        mkdir -p "$out/diag-qwen-overlap$k"
        sed "s|^scheduler: {|scheduler: {overlap_steps: $k, step_trace: $out/diag-qwen-overlap$k/trace, |" \
          configs/qwen3next-tiny-cuda.yaml > configs/.diag-overlap$k.yaml
        stage diag-qwen-overlap$k 200 env BUILD_DIR="$build" NOSTREAM="${DIAG_NOSTREAM:-64}" bench/diag_served.sh configs/.diag-overlap$k.yaml \
          "$out/diag-qwen-overlap$k" "${DIAG_CONCURRENCY:-1 16 64}" "${DIAG_OUTPUT:-512}"
        python3 bench/step_trace_report.py "$out/diag-qwen-overlap$k/trace" > "$out/diag-qwen-overlap$k/trace-report.txt" 2>&1
        rm -f configs/.diag-overlap$k.yaml
      done ;;
    served-qwen80)
      # The Qwen3-Next-80B-A3B-shaped synthetic config (32 of 48 layers, 512 experts): the served
      # path beside the engine at a step time of a real Qwen3-Next deployment.
      stage served-qwen80 540 env VOCAB=151936 bench/served_vs_engine.sh configs/qwen3-next-80b-a3b-synthetic-cuda.yaml \
        "$out" qwen3-next-80b-a3b ;;
    served-qwen) stage served-qwen 240 env VOCAB=512 OUTPUT_LEN=${QWEN_OUTPUT_LEN:-512} bench/served_vs_engine.sh \
                   configs/qwen3next-tiny-cuda.yaml "$out" qwen3next-tiny ;;
    invariance)
      # determinism: batch_invariant on the GPU: the kernels' row invariance (a row alone == the
      # row among others: GEMM, swiglu_linear, attention), then a request alone against the same
      # request among 63 random arrivals (the diverging trials per case), and the prefix cache on
      # against off (tokens and logprob bits).
      stage invariance-kernels 240 "$bin/cuda_ops_test" --gtest_filter='*Invariant*:*TreeAttention*'
      stage invariance 420 "$bin/spec_test" --gtest_filter='Device/BatchInvariance*:Device/PrefixInvariance*' ;;
    invariance-speed)
      # The linear layers per row count and the 9B decode step, determinism fast and batch_invariant.
      { cat configs/bamba-9b-synthetic-cuda.yaml; echo "determinism: batch_invariant"; } > "$out/bamba-9b-invariant.yaml"
      stage invariance-linear 240 "$bin/hyserve-bench-cuda" linear_rows
      stage invariance-model-fast 180 "$bin/hyserve-bench-model" configs/bamba-9b-synthetic-cuda.yaml --batches 1,64
      stage invariance-model 180 "$bin/hyserve-bench-model" "$out/bamba-9b-invariant.yaml" --batches 1,64
      # The warpgroup-MMA linear kernel in each mode (kernels.linear_wgmma, kernels.invariant_gemm: wgmma).
      stage invariance-model-fast-wgmma 180 "$bin/hyserve-bench-model" \
        "$(with_kernels configs/bamba-9b-synthetic-cuda.yaml linear_wgmma true)" --batches 1,64
      stage invariance-model-wgmma 180 "$bin/hyserve-bench-model" \
        "$(with_kernels "$out/bamba-9b-invariant.yaml" invariant_gemm wgmma)" --batches 1,64 ;;
    invariance-spec | invariance-spec-tree)
      # Speculative identity at batches 1, 8, 32 under batch_invariant (hyserve-bench-spec exits 2
      # on a row that differs from plain decoding; each cell's progress line says "identical" or
      # "DIFFERS"): invariance-spec runs n-gram and the draft model chain (about 140 s and 300 s
      # on an H100), invariance-spec-tree the draft model tree. The draft model at batch 32 needs
      # more than 80 GB (target, draft and 32 caches of 1152 tokens).
      { cat configs/bamba-9b-synthetic-cuda-spec.yaml; echo "determinism: batch_invariant"; } > "$out/bamba-9b-spec-invariant.yaml"
      variants=(ngram draft)
      [ "$s" = invariance-spec-tree ] && variants=(tree)
      for v in "${variants[@]}"; do
        extra=()
        [ "$v" != ngram ] && extra+=(--draft-layers 4)
        [ "$v" = tree ] && extra+=(--draft-tree-width 2)
        stage "invariance-spec-$v" 400 "$bin/hyserve-bench-spec" "$out/bamba-9b-spec-invariant.yaml" --batches 1,8,32 \
          --prompt-len 1024 --new-tokens 128 --draft-tokens 4 "${extra[@]}"
      done ;;
    spec-profile)
      # Where a batch-32 verify step goes (run 23: the phase table's 279 ms of forward per verify
      # step, at most about 47 ms of it inside the cell's throughput window; run 10: 67 ms against
      # 10 ms for decode in fast mode): the op profile of the third verify step of the n-gram
      # cells, fast and batch_invariant.
      { cat configs/bamba-9b-synthetic-cuda-spec.yaml; echo "determinism: batch_invariant"; } > "$out/bamba-9b-spec-invariant.yaml"
      for m in fast invariant; do
        conf=configs/bamba-9b-synthetic-cuda-spec.yaml
        [ "$m" = invariant ] && conf="$out/bamba-9b-spec-invariant.yaml"
        stage "spec-profile-$m" 240 "$bin/hyserve-bench-spec" "$conf" --batches 8,32 --prompt-len 1024 --new-tokens 64 \
          --draft-tokens 4 --cost-check 0 --profile-verify 3
      done ;;
    compare)
      # This tree against BASELINE_DIR (an untracked copy of another revision, e.g. made with
      # `git archive main --prefix=baseline/ | tar -x` before the call), each built in its own
      # build/: the linear layers per row count, the MoE layer, the 9B step and 8K prefill in both
      # determinism modes, Falcon-H1's batch-1 step and 8K prefill (attention in every layer),
      # Granite-4.0-H-Tiny's batch-1 step (MoE in every layer) and Nemotron-H-8B's (squared-ReLU
      # MLP), one after the other on the same GPU. Logs OUT/compare-{this,base}-*.log.
      base=${BASELINE_DIR:?compare needs BASELINE_DIR}
      stage compare-base-build 300 bash -c "cd '$base' && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
        -DHYSERVE_CUDA_ARCHS=90a > /dev/null && cmake --build build -j $jobs --target hyserve-bench-cuda hyserve-bench-model"
      { cat configs/bamba-9b-synthetic-cuda.yaml; echo "determinism: batch_invariant"; } > "$out/bamba-9b-invariant.yaml"
      for tree in this base; do
        b=$bin
        [ "$tree" = base ] && b=$base/build/bin
        stage "compare-$tree-linear" 150 "$b/hyserve-bench-cuda" linear_rows
        stage "compare-$tree-moe" 90 "$b/hyserve-bench-cuda" moe
        stage "compare-$tree-model-fast" 150 "$b/hyserve-bench-model" configs/bamba-9b-synthetic-cuda.yaml \
          --batches 1,64 --decode-steps 16 --prefill-len 8192
        stage "compare-$tree-model-inv" 150 "$b/hyserve-bench-model" "$out/bamba-9b-invariant.yaml" \
          --batches 1,64 --decode-steps 16 --prefill-len 8192
        stage "compare-$tree-falcon" 150 "$b/hyserve-bench-model" configs/falcon-h1-7b-synthetic-cuda.yaml \
          --batches 1 --decode-steps 8 --prefill-len 8192
        stage "compare-$tree-granite-tiny" 90 "$b/hyserve-bench-model" configs/granite-4.0-h-tiny-synthetic-cuda.yaml \
          --batches 1 --decode-steps 8
        stage "compare-$tree-nemotron" 90 "$b/hyserve-bench-model" configs/nemotron-h-8b-synthetic-cuda.yaml \
          --batches 1 --decode-steps 8
      done ;;
    moe)
      stage moe 120 "$bin/hyserve-bench-cuda" moe
      stage moe-anchor 120 python3 bench/moe_anchor.py ;;
    trace)
      # Where a graph decode step's time goes: CUPTI's kernel records of 8 sampled steps at the
      # TRACE_BATCHES batch sizes (default 1; e.g. 1,64) (span, kernel-busy time, gaps; the 30
      # longest kernels) for each TRACE_CONFIGS config (bamba-9b is configs/bamba-9b-synthetic-cuda.yaml).
      # TRACE_KEYS (kernels KEY or KEY=VALUE items): each config traced again with all of them.
      for f in ${TRACE_CONFIGS:-bamba-9b falcon-h1-7b nemotron-h-8b granite-4.0-h-tiny granite-4.0-h-small}; do
        stage "trace-$f" 120 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches "${TRACE_BATCHES:-1}" --decode-steps 8 \
          --kernel-trace --json "$out/trace-$f.json"
        if [ -n "${TRACE_KEYS:-}" ]; then
          # shellcheck disable=SC2086
          conf=$(with_kernel_items "configs/$f-synthetic-cuda.yaml" $TRACE_KEYS)
          stage "trace-$f-keys" 120 "$bin/hyserve-bench-model" "$conf" --batches "${TRACE_BATCHES:-1}" --decode-steps 8 \
            --kernel-trace --json "$out/trace-$f-keys.json"
        fi
      done ;;
    decode-slices)
      # kernels.attn_decode_max_slices at batch 1, context 1024 (the combine kernel against fewer,
      # longer slices): Falcon-H1-7B (attention in every layer), or SLICES_CONFIGS, with the
      # default and caps of 1, 2, 4 and 8 slices, one after the other.
      for f in ${SLICES_CONFIGS:-falcon-h1-7b}; do
        stage "decode-slices-$f-default" 90 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" \
          --batches 1 --decode-steps 16
        for n in 1 2 4 8; do
          stage "decode-slices-$f-$n" 90 "$bin/hyserve-bench-model" \
            "$(with_kernels "configs/$f-synthetic-cuda.yaml" attn_decode_max_slices "$n")" --batches 1 --decode-steps 16
        done
      done ;;
    moe-decode)
      # The MoE layers of a decode step with kernels.moe_decode default (fused up to 8 tokens, the
      # bulk-copy rings at one), split, fused (the general up kernel at one token too) and single
      # (one kernel for one token), at batches 1, 2, 4 and 8 (where the fused path's per-token
      # weight reads may start to cost more than the kernels it saves), config after config.
      for f in ${MOE_DECODE_CONFIGS:-granite-4.0-h-tiny}; do
        stage "moe-decode-$f" 150 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" \
          --batches "${MOE_DECODE_BATCHES:-1,2,4,8}" --decode-steps 16 --prefill-len 256
        for kind in ${MOE_DECODE_KINDS:-split fused single}; do
          stage "moe-decode-$f-$kind" 150 "$bin/hyserve-bench-model" \
            "$(with_kernels "configs/$f-synthetic-cuda.yaml" moe_decode "$kind")" \
            --batches "${MOE_DECODE_BATCHES:-1,2,4,8}" --decode-steps 16 --prefill-len 256
        done
      done ;;
    gated-norm)
      # A mixer's gated output norm apart from its out_proj (the default) against inside its fused
      # kernel (kernels.norm_linear_gate: true), batch-1 decode, the two one after the other for
      # each GATED_CONFIGS config.
      for f in ${GATED_CONFIGS:-nemotron-h-8b granite-4.0-h-tiny qwen3-next-80b-a3b-16l bamba-9b}; do
        stage "gated-norm-$f" 90 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 --decode-steps 16
        stage "gated-norm-$f-fused" 90 "$bin/hyserve-bench-model" \
          "$(with_kernels "configs/$f-synthetic-cuda.yaml" norm_linear_gate true)" --batches 1 --decode-steps 16
      done ;;
    ncu)
      # Nsight Compute on the batch-1 decode step's kernels matching NCU_KERNELS (default: the
      # MoE decode kernels and the fused linear kernel) of NCU_CONFIG (default: the 16-layer
      # Qwen3-Next shape): speed of light, memory workload, warp stall reasons, a few launches
      # after the warm-up (ncu profiles graph kernel nodes one by one; clocks as the device runs them,
      # not locked to base), where ncu is installed.
      # NCU_RUNS='CONFIG:REGEX …' profiles several configs, each with its kernels, in turn.
      if command -v ncu > /dev/null; then
        for item in ${NCU_RUNS:-${NCU_CONFIG:-qwen3-next-80b-a3b-16l}:${NCU_KERNELS:-moe_decode_up|moe_decode_down|rmsnorm_linear}}; do
          f=${item%%:*}
          stage "ncu-$f" 300 ncu --clock-control none --kernel-name "regex:${item#*:}" --launch-skip 40 --launch-count 6 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
            "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 --decode-steps 2 --prefill-len 64
        done
      else
        echo "ncu: skipped (no ncu)" | tee -a "$out/summary.txt"
      fi ;;
    ncu-moe)
      # Nsight Compute on the warpgroup-MMA experts' GEMMs at 8192 tokens: the first two launches
      # (gate/up, down) of the Qwen3-Next shape's cold 8K prefill (the model's own routing) and of
      # hyserve-bench-cuda moe (uniform routing), each with NCU_MOE_KEYS (kernels KEY=VALUE items,
      # default: none) applied to the model's config, where ncu is installed.
      if command -v ncu > /dev/null; then
        # shellcheck disable=SC2086
        conf=$(with_kernel_items configs/qwen3-next-80b-a3b-16l-synthetic-cuda.yaml ${NCU_MOE_KEYS:-})
        sections=(--clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy
          --section LaunchStats --section ComputeWorkloadAnalysis)
        stage ncu-moe-model 240 ncu --kernel-name regex:moe_wgmma --launch-count 2 "${sections[@]}" \
          "$bin/hyserve-bench-model" "$conf" --batches 1 --decode-steps 1 --prefill-len 8192
        stage ncu-moe-bench 240 ncu --kernel-name regex:moe_wgmma --launch-count 2 "${sections[@]}" \
          "$bin/hyserve-bench-cuda" moe
      else
        echo "ncu-moe: skipped (no ncu)" | tee -a "$out/summary.txt"
      fi ;;
    wide-linear)
      # kernels.norm_linear_wide (a warp's whole out_proj task loaded before the wait) against the
      # default, batch-1 decode, one after the other for each WIDE_CONFIGS config; or, with
      # WIDE_RUNS (items CONFIG:KEY or CONFIG:KEY=VALUE), each config's default once and then its
      # items' keys.
      # An item's keys may be several, comma separated (CONFIG:KEY=VALUE,KEY2): one run with all.
      if [ -n "${WIDE_RUNS:-}" ]; then
        seen=" "
        for run in $WIDE_RUNS; do
          f=${run%%:*}
          items=$(echo "${run#*:}" | tr ',' ' ')
          # shellcheck disable=SC2086
          conf=$(with_kernel_items "configs/$f-synthetic-cuda.yaml" $items)
          name=$f
          for kv in $items; do
            case $kv in *=*) name="$name-${kv%%=*}-${kv#*=}" ;; *) name="$name-$kv-true" ;; esac
          done
          case $seen in *" $f "*) ;; *)
            seen="$seen$f "
            stage "wide-linear-$f" 90 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 \
              --decode-steps 16 --prefill-len 256 ;;
          esac
          stage "wide-linear-$name" 90 "$bin/hyserve-bench-model" "$conf" --batches 1 --decode-steps 16 --prefill-len 256
        done
        continue
      fi
      for f in ${WIDE_CONFIGS:-qwen3-next-80b-a3b-16l granite-4.0-h-tiny nemotron-h-8b falcon-h1-7b}; do
        stage "wide-linear-$f" 90 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 \
          --decode-steps 16 --prefill-len 256
        for key in ${WIDE_KEYS:-norm_linear_wide}; do  # KEY (true) or KEY=VALUE
          val=true
          case $key in *=*) val=${key#*=}; key=${key%%=*} ;; esac
          stage "wide-linear-$f-$key-$val" 90 "$bin/hyserve-bench-model" \
            "$(with_kernels "configs/$f-synthetic-cuda.yaml" "$key" "$val")" --batches 1 --decode-steps 16 --prefill-len 256
        done
      done ;;
    families)
      for f in ${FAMILY_CONFIGS:-nemotron-h-8b granite-4.0-h-tiny granite-4.0-h-small falcon-h1-7b qwen3-next-80b-a3b}; do
        stage "family-$f" 240 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1,64 \
          --decode-steps 16 --prefill-len 8192 --json "$out/family-$f.json"
      done ;;
    prefill-variants)
      # 8K prefill with an opt-in prefill kernel against the default, in turn: PREFILL_RUNS items
      # CONFIG:KEY or CONFIG:KEY=VALUE (default: the 16-layer Qwen3-Next-80B-A3B shape and
      # Granite-4.0-H-Tiny with the experts' GEMMs' late stage release, the Qwen3-Next shape with
      # their tile handoff, Falcon-H1-7B with ssd_seq_slice 16).
      for run in ${PREFILL_RUNS:-qwen3-next-80b-a3b-16l:moe_wgmma_early_release=false qwen3-next-80b-a3b-16l:moe_wgmma_tile_handoff granite-4.0-h-tiny:moe_wgmma_early_release=false falcon-h1-7b:ssd_seq_slice=16}; do
        f=${run%%:*}
        key=${run#*:}
        val=true
        case $key in *=*) val=${key#*=}; key=${key%%=*} ;; esac
        stage "prefill-$f" 120 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 \
          --decode-steps 2 --prefill-len 8192
        stage "prefill-$f-$key-$val" 120 "$bin/hyserve-bench-model" \
          "$(with_kernels "configs/$f-synthetic-cuda.yaml" "$key" "$val")" --batches 1 --decode-steps 2 --prefill-len 8192
      done ;;
    prefill-profile)
      # Where an 8K prefill's time goes: one Extend step of 8192 tokens op by op (the decode step's
      # profile beside it) for each PROFILE_CONFIGS config (default: the Qwen3-Next-80B-A3B shape).
      for f in ${PROFILE_CONFIGS:-qwen3-next-80b-a3b}; do
        stage "prefill-profile-$f" 180 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 \
          --decode-steps 4 --prefill-len 8192 --profile-step
      done ;;
    wgmma-probe)
      # The warpgroup-MMA linear kernel (kernels/cuda/gemm_wgmma.cuh) against a CUDA-core reference
      # and beside cuBLAS at 1..256 and 2048 rows on the 9B's shapes (bench/probes/wgmma_linear_probe.cu).
      stage wgmma-probe-build 120 /usr/local/cuda/bin/nvcc -O3 \
        "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]" -std=c++17 -Ikernels/cuda -Icommon/include -Ikernels/include \
        bench/probes/wgmma_linear_probe.cu -lcublas -o "$build/wgmma_probe"
      stage wgmma-probe 240 "$build/wgmma_probe" ;;
    latency-probe)
      # What a decode step's kernels pay beyond their bytes, each effect alone
      # (bench/probes/decode_latency_probe.cu).
      stage latency-probe-build 120 /usr/local/cuda/bin/nvcc -O3 \
        "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]" -std=c++17 -Ikernels/cuda -Icommon/include -Ikernels/include \
        bench/probes/decode_latency_probe.cu -o "$build/decode_latency_probe"
      stage latency-probe 180 "$build/decode_latency_probe" ;;
    cublaslt-probe)
      # Is a cuBLASLt GEMM with its algorithm pinned row-invariant, with the bits of one mma.sync
      # chain over k (bench/probes/cublaslt_invariance_probe.cu)?
      stage cublaslt-probe-build 120 /usr/local/cuda/bin/nvcc -O2 \
        "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]" -std=c++17 \
        bench/probes/cublaslt_invariance_probe.cu -lcublasLt -lcublas -o "$build/cublaslt_probe"
      stage cublaslt-probe 180 "$build/cublaslt_probe" ;;
    floors)
      # Where a batch-1 decode step goes beyond its bytes floor: one eager step op by op for each
      # FLOOR_CONFIGS family (default Falcon-H1, Nemotron-H, Granite-4.0-H small), and the MoE op's
      # kernels one by one (nsys, where installed).
      for f in ${FLOOR_CONFIGS:-falcon-h1-7b nemotron-h-8b granite-4.0-h-small}; do
        stage "floor-$f" 150 "$bin/hyserve-bench-model" "configs/$f-synthetic-cuda.yaml" --batches 1 --decode-steps 8 \
          --profile-step --json "$out/floor-$f.json"
      done
      if command -v nsys > /dev/null; then
        stage floor-moe-nsys 150 nsys profile -o "$out/moe" --stats=true --force-overwrite true \
          "$bin/hyserve-bench-cuda" moe
      else
        echo "floor-moe-nsys: skipped (no nsys)" | tee -a "$out/summary.txt"
      fi ;;
    prefix) stage prefix 400 bench/prefix_served.sh configs/bamba-9b-synthetic-cuda.yaml "$out/prefix" ;;
    startup) stage startup 480 bash -c '
        export HYSERVE_BUILD_DIR='"$build"' HYSERVE_BUILD_TYPE=Release HYSERVE_CMAKE_ARGS=-DHYSERVE_CUDA_ARCHS=90a
        serve_until_healthy() {  # CONFIG LOG: seconds from launch/serve.sh to /health 200, then stopped
          local t0=$(date +%s.%N) ready=never
          setsid launch/serve.sh "$1" > "$2" 2>&1 &
          local pid=$!
          for i in $(seq 1 1800); do
            if curl -sf localhost:8000/health > /dev/null 2>&1; then ready=$(python3 -c "import time; print(f\"{time.time() - $t0:.1f}\")"); break; fi
            kill -0 $pid 2> /dev/null || break; sleep 0.1
          done
          echo "$1: /health 200 after $ready s"
          curl -s localhost:8000/generate -d "{\"input_ids\": [1, 2, 3, 4], \"sampling_params\": {\"max_new_tokens\": 16}}"; echo
          kill -TERM -- -$pid 2> /dev/null; wait $pid 2> /dev/null
          grep -E "weights loaded|loaded [0-9]+/|ready|captured" "$2" | head -20
        }
        serve_until_healthy configs/bamba-9b-synthetic-cuda.yaml '"$out"'/startup-synthetic.log
        t0=$(date +%s)
        '"$bin"'/hyserve-write-checkpoint configs/bamba-9b-synthetic-cuda.yaml /tmp/bamba-9b-ckpt 2>&1 | tail -3
        echo "checkpoint written in $(($(date +%s) - t0)) s: $(du -sh /tmp/bamba-9b-ckpt | cut -f1)"
        serve_until_healthy configs/bamba-9b-checkpoint-cuda.yaml '"$out"'/startup-checkpoint.log
        rm -rf /tmp/bamba-9b-ckpt' ;;
    *) echo "unknown stage $s (known: tests gpu-tests gpu-service gpu-check latency-probe gated-norm wide-linear ncu model-tp2 diag-qwen served-qwen80 invariance invariance-speed invariance-spec invariance-spec-tree spec-profile moe families prefix select ssd kernels gdn skinny model model-mma spec-pred spec-pred-mma spec-rand spec-draft serve-cuda served served-qwen startup)" | tee -a "$out/summary.txt" ;;
  esac
done
wait  # stages that run in the background (model-tp2)
echo "total: $(($(date +%s) - start)) s" | tee -a "$out/summary.txt"
