#!/usr/bin/env bash
# Prefix caching as a user sees it: the same served workloads with cache.prefix off and on, one
# build, one run.
#   bench/prefix_served.sh CONFIG OUT_DIR
# For each setting, launch/serve.sh serves CONFIG (with cache.prefix.enabled set) and
# hyserve-bench runs, streaming, greedy:
#   ttft      SHARED (2048) shared prompt tokens + NEW (64) own tokens, output 16, one request at
#             a time, REQUESTS (16) requests: TTFT p50 (the first request fills the cache);
#   turns     TURN_CONV (16) conversations of 8 turns at concurrency TURN_CONV, a 512-token
#             system prompt, 128 new prompt tokens and 128 output tokens a turn: output tokens/s
#             and the share of prompt tokens served from the cache;
# then /metrics' prefix-cache lines. OUT_DIR/prefix.md tables the two settings side by side.
# Environment: HYSERVE_BUILD_DIR (default build), VOCAB (prompt ids in [3, VOCAB); 128256),
# PORT (the config's server.port, 8000).
set -uo pipefail
cfg=${1:?usage: bench/prefix_served.sh CONFIG OUT_DIR}
out=${2:?usage: bench/prefix_served.sh CONFIG OUT_DIR}
mkdir -p "$out"
build=${HYSERVE_BUILD_DIR:-build}
bin=$build/bin
vocab=${VOCAB:-128256}
port=${PORT:-8000}
shared=${SHARED:-2048}
new=${NEW:-64}
requests=${REQUESTS:-16}
conv=${TURN_CONV:-16}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

for setting in off on; do
  enabled=false
  [ "$setting" = on ] && enabled=true
  conf="$out/config-$setting.yaml"
  python3 - "$cfg" "$conf" "$enabled" << 'EOF'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c.setdefault("cache", {}).setdefault("prefix", {})["enabled"] = sys.argv[3] == "true"
yaml.safe_dump(c, open(sys.argv[2], "w"), default_flow_style=None)
EOF
  for _ in $(seq 1 300); do curl -sf "localhost:$port/health" > /dev/null 2>&1 || break; sleep 0.1; done
  HYSERVE_BUILD_DIR=$build HYSERVE_BUILD_TYPE=Release HYSERVE_CMAKE_ARGS=-DHYSERVE_CUDA_ARCHS=90a \
    setsid launch/serve.sh "$conf" > "$out/server-$setting.log" 2>&1 &
  server=$!
  ready=0
  for _ in $(seq 1 1800); do
    if curl -sf "localhost:$port/health" > /dev/null 2>&1; then ready=1; break; fi
    kill -0 $server 2> /dev/null || break
    sleep 0.1
  done
  echo "[prefix $setting] ready=$ready"
  if [ $ready = 1 ]; then
    "$bin/hyserve-bench" --url "http://127.0.0.1:$port" --concurrency 1 --requests "$requests" \
      --shared-prefix "$shared" --prompt-len "$new" --output-len 16 --vocab "$vocab" --seed 1 --json \
      > "$out/ttft-$setting.json" 2> "$out/ttft-$setting.err"
    echo "[prefix $setting] ttft rc $?"
    "$bin/hyserve-bench" --url "http://127.0.0.1:$port" --concurrency "$conv" --requests "$conv" --turns 8 \
      --shared-prefix 512 --prompt-len 128 --output-len 128 --vocab "$vocab" --seed 2 --json \
      > "$out/turns-$setting.json" 2> "$out/turns-$setting.err"
    echo "[prefix $setting] turns rc $?"
    curl -sf "localhost:$port/metrics" | grep -E '^hyserve_(prefix_cache|step_seconds_(sum|count))' > "$out/metrics-$setting.txt"
  fi
  kill -TERM -- -$server 2> /dev/null || kill -TERM $server
  pkill -USR1 -x coordinator 2> /dev/null
  for _ in $(seq 1 300); do kill -0 $server 2> /dev/null || break; sleep 0.1; done
  if kill -0 $server 2> /dev/null; then
    echo "[prefix $setting] the server did not stop within 30 s; killing it"
    kill -KILL -- -$server 2> /dev/null
    pkill -KILL -f "$bin/coordinator" 2> /dev/null
    pkill -KILL -f "$bin/worker" 2> /dev/null
  fi
  wait $server 2> /dev/null
done

python3 - "$out" "$shared" "$new" << 'EOF'
import json, sys
out, shared, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
def get(d, *keys):
    for k in keys:
        if d is None or k not in d:
            return None
        d = d[k]
    return d
rows = []
t = {s: load(f"{out}/ttft-{s}.json") for s in ("off", "on")}
m = {s: load(f"{out}/turns-{s}.json") for s in ("off", "on")}
def fmt(v, f="{:.1f}"):
    return "n/a" if v is None else f.format(v)
lines = ["| | cache off | cache on | on / off |", "|---|---|---|---|"]
def row(name, a, b, lower_better=False, f="{:.1f}"):
    ratio = None
    if a and b:
        ratio = a / b if lower_better else b / a
    lines.append(f"| {name} | {fmt(a, f)} | {fmt(b, f)} | {fmt(ratio, '{:.2f}×')} |")
row(f"TTFT p50 ms ({shared} shared + {new} new, c1)", get(t["off"], "ttft_ms", "p50"), get(t["on"], "ttft_ms", "p50"), True)
row("TTFT p90 ms", get(t["off"], "ttft_ms", "p90"), get(t["on"], "ttft_ms", "p90"), True)
row("8-turn output tok/s (c16)", get(m["off"], "output_token_throughput"), get(m["on"], "output_token_throughput"))
for s in ("off", "on"):
    d = m[s]
    if d:
        p, c = d.get("prompt_tokens"), d.get("cached_prompt_tokens")
        conv, turns = d.get("requests", 0) // max(d.get("turns", 1), 1), d.get("turns", 1)
        # resent: every prompt token but each turn's new ones (the system prompt counts as resent).
        fresh = conv * turns * 128
        if p and c is not None:
            lines.append(f"| cache {s}: cached / prompt tokens | {c} / {p} = {100.0 * c / p:.1f}% | resent {p - fresh}: {100.0 * c / max(p - fresh, 1):.1f}% cached | |")
open(f"{out}/prefix.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
