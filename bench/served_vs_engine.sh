#!/usr/bin/env bash
# The engine and the served path on one config, in one run, on one build: what a user of the
# service gets beside what the engine alone decodes.
#   bench/served_vs_engine.sh CONFIG OUT_DIR NAME
# 1. hyserve-bench-model CONFIG at batches 1, 16, 64 (context PROMPT_LEN): decode step times,
#    through graphs with the logits copied back and with greedy sampling on the device (the
#    step as the service runs it), and the device-to-host bytes per step;
# 2. launch/serve.sh CONFIG (the build already done): seconds until /health answers 200;
# 3. hyserve-bench against it at concurrency 1, 16 and 64 (requests: max(concurrency, 4)),
#    streaming, prompt PROMPT_LEN, output OUTPUT_LEN, greedy: TTFT, inter-token latency,
#    output tokens/s; then /metrics (step times by mode, overlapped steps);
# 4. the table NAME.md: served ITL p50 / engine decode step, served tokens/s / engine tokens/s.
# Environment: HYSERVE_BUILD_DIR (default build), PROMPT_LEN (128), OUTPUT_LEN (512), VOCAB
# (prompt ids are drawn from [3, VOCAB); default 128256), PORT (the config's server.port, 8000),
# SERVE_ARGS (extra environment for the server, e.g. none).
set -uo pipefail
cfg=${1:?usage: bench/served_vs_engine.sh CONFIG OUT_DIR NAME}
out=${2:?usage}
name=${3:?usage}
mkdir -p "$out"
build=${HYSERVE_BUILD_DIR:-build}
bin=$build/bin
prompt=${PROMPT_LEN:-128}
output=${OUTPUT_LEN:-512}
vocab=${VOCAB:-128256}
port=${PORT:-8000}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

echo "[$name] engine: hyserve-bench-model $cfg"
"$bin/hyserve-bench-model" "$cfg" --batches 1,16,64 --prompt-len "$prompt" --decode-steps 32 --prefill-len 2048 \
  --json "$out/$name-engine.json" > "$out/$name-engine.txt" 2>&1
echo "[$name] engine rc $?"

# A server of an earlier run still shutting down must not answer for this one.
for _ in $(seq 1 300); do curl -sf "localhost:$port/health" > /dev/null 2>&1 || break; sleep 0.1; done
echo "[$name] served: launch/serve.sh $cfg"
t0=$(date +%s.%N)
HYSERVE_BUILD_DIR=$build HYSERVE_BUILD_TYPE=Release HYSERVE_CMAKE_ARGS=-DHYSERVE_CUDA_ARCHS=90a \
  setsid launch/serve.sh "$cfg" > "$out/$name-server.log" 2>&1 &
server=$!
ready=""
for _ in $(seq 1 1200); do
  if curl -sf "localhost:$port/health" > /dev/null 2>&1; then
    ready=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    break
  fi
  kill -0 $server 2> /dev/null || break
  sleep 0.1
done
echo "[$name] /health 200 after ${ready:-never} s (launch/serve.sh, build already done)" | tee "$out/$name-startup.txt"
if [ -n "$ready" ]; then
  for c in 1 16 64; do
    n=$((c < 4 ? 4 : c))
    "$bin/hyserve-bench" --url "http://127.0.0.1:$port" --concurrency $c --requests $n --prompt-len "$prompt" \
      --output-len "$output" --vocab "$vocab" --seed $c --json > "$out/$name-served-c$c.json" 2> "$out/$name-served-c$c.err"
    echo "[$name] served concurrency $c rc $?"
  done
  curl -sf "localhost:$port/metrics" > "$out/$name-metrics.txt"
fi
kill -TERM -- -$server 2> /dev/null || kill -TERM $server
# A drain that does not end within 30 s is reported and the job killed, so that a later run on
# the same port is not answered by this server.
for _ in $(seq 1 300); do kill -0 $server 2> /dev/null || break; sleep 0.1; done
if kill -0 $server 2> /dev/null; then
  echo "[$name] the server did not stop within 30 s of SIGTERM; killing it" | tee -a "$out/$name-startup.txt"
  kill -KILL -- -$server 2> /dev/null
  pkill -KILL -f "$bin/coordinator" 2> /dev/null
  pkill -KILL -f "$bin/worker" 2> /dev/null
fi
wait $server 2> /dev/null
for _ in $(seq 1 300); do curl -sf "localhost:$port/health" > /dev/null 2>&1 || break; sleep 0.1; done

python3 - "$out" "$name" "$prompt" "$output" << 'EOF'
import json, sys, os
out, name, prompt, output = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return None
eng = load(f"{out}/{name}-engine.json") or {}
by_batch = {d["batch"]: d for d in eng.get("decode", [])}
rows = ["| concurrency / batch | engine step (graph, logits to host) | engine step (sampled on the device) | "
        "engine tokens/s (sampled) | device→host bytes/step | served ITL p50 | ITL p50 / engine step | "
        "served output tokens/s | served / engine tokens/s | TTFT p50 |",
        "|---|---|---|---|---|---|---|---|---|---|"]
for c in (1, 16, 64):
    e = by_batch.get(c, {})
    s = load(f"{out}/{name}-served-c{c}.json") or {}
    def g(d, *keys):
        for k in keys:
            if isinstance(d, dict) and k in d:
                d = d[k]
            else:
                return None
        return d
    step = e.get("sampled_step_ms")
    itl = g(s, "itl_ms", "p50")
    ttft = g(s, "ttft_ms", "p50")
    tps = s.get("output_token_throughput")
    etps = e.get("sampled_tokens_per_s")
    f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "—"
    rows.append(f"| {c} | {f(e.get('graph_step_ms', e.get('eager_step_ms')), '%.2f ms')} | {f(step, '%.2f ms')} | "
                f"{f(etps, '%.0f')} | {f(e.get('sampled_d2h_bytes_per_step'), '%.0f')} | {f(itl, '%.2f ms')} | "
                f"{f(itl / step if itl and step else None, '%.3f×')} | {f(tps, '%.0f')} | "
                f"{f(tps / etps if tps and etps else None, '%.3f')} | {f(ttft, '%.1f ms')} |")
text = f"# {name}: engine and served path, prompt {prompt}, output {output}\n\n" + "\n".join(rows) + "\n"
open(f"{out}/{name}.md", "w").write(text)
print(text)
EOF
