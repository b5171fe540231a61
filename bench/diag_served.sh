#!/usr/bin/env bash
# Diagnosis of the served path on one config: serve, stream C clients for a while, sample the
# threads' CPU use while they run, then SIGTERM the coordinator (a drained shutdown) so that the
# coordinator and the workers log where their step loops spent the time.
#   bench/diag_served.sh CONFIG OUT [CONCURRENCIES] [OUTPUT_LEN]
# Environment: NOSTREAM (concurrencies to run again without streaming), VOCAB, BUILD_DIR.
set -u
cfg=$1 out=$2 concs=${3:-"16 64"} output=${4:-1024}
build=${BUILD_DIR:-build}
mkdir -p "$out"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
HYSERVE_BUILD_DIR=$build HYSERVE_BUILD_TYPE=Release HYSERVE_CMAKE_ARGS=-DHYSERVE_CUDA_ARCHS=90a \
  setsid launch/serve.sh "$cfg" > "$out/server.log" 2>&1 &
for _ in $(seq 1 600); do curl -sf localhost:8000/health > /dev/null 2>&1 && break; sleep 0.1; done
for c in $concs; do
  "$build/bin/hyserve-bench" --url http://127.0.0.1:8000 --concurrency "$c" --requests "$c" --prompt-len 128 \
    --output-len "$output" --vocab "${VOCAB:-512}" --seed "$c" --json > "$out/c$c.json" 2> "$out/c$c.err" &
  bench=$!
  sleep "${SAMPLE_AFTER:-1}"
  top -b -H -n 1 -d 0.5 -w 200 | head -40 > "$out/top-c$c.txt"
  wait $bench
  python3 -c "import json,sys; d=json.load(open('$out/c$c.json')); print('c$c', 'itl p50', d['itl_ms']['p50'], 'tok/s', d['output_token_throughput'])"
done
# The same load without streaming (NOSTREAM: concurrencies): what the HTTP streams cost.
for c in ${NOSTREAM:-}; do
  "$build/bin/hyserve-bench" --url http://127.0.0.1:8000 --concurrency "$c" --requests "$c" --prompt-len 128 \
    --output-len "$output" --vocab "${VOCAB:-512}" --seed "$c" --no-stream --json > "$out/c$c-nostream.json" 2> "$out/c$c-nostream.err"
  python3 -c "import json,sys; d=json.load(open('$out/c$c-nostream.json')); print('c$c no-stream', 'wall s', d['wall_time_s'], 'tok/s', d['output_token_throughput'])"
done
curl -sf localhost:8000/metrics > "$out/metrics.txt"
pkill -TERM -x coordinator
for _ in $(seq 1 100); do pgrep -x coordinator > /dev/null || break; sleep 0.1; done
sleep 1
grep -E "step loop" "$out/server.log"
