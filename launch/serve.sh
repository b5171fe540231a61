#!/usr/bin/env bash
# Installs missing packages, builds, and serves CONFIG (default configs/default.yaml) under
# mpirun: one coordinator rank and dp·tp worker ranks. Prints the URL and a curl to try once
# /health answers 200, and a line every five seconds while it waits (the workers print their
# weight-loading progress meanwhile). Ctrl-C drains in-flight requests and stops every rank.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CONFIG="${1:-$HYSERVE_ROOT/configs/default.yaml}"
[ -f "$CONFIG" ] || { log "no such config: $CONFIG"; exit 2; }
install_deps
build_project coordinator worker hyserve-generate hyserve-bench hyserve-write-checkpoint

# World size from the config: dp·tp workers (defaults 1).
read_parallel() {
  sed -n '/^parallel:/,/^[a-z]/p' "$CONFIG" | tr '{},' '\n\n\n' | sed -n "s/^ *$1: *\([0-9][0-9]*\).*/\1/p" | head -n1
}
TP=$(read_parallel tp); DP=$(read_parallel dp)
TP=${TP:-1}; DP=${DP:-1}
W=$((DP * TP))
HOST=$(sed -n '/^server:/,/^[a-z]/p' "$CONFIG" | tr '{},' '\n\n\n' | sed -n 's/^ *host: *\([^ ]*\).*/\1/p' | head -n1)
PORT=$(sed -n '/^server:/,/^[a-z]/p' "$CONFIG" | tr '{},' '\n\n\n' | sed -n 's/^ *port: *\([0-9]*\).*/\1/p' | head -n1)
HOST=${HOST:-127.0.0.1}; PORT=${PORT:-8000}
URL="http://$HOST:$PORT"

BIN="$HYSERVE_BUILD_DIR/bin"
# CPU workers share this host's cores: one OpenMP team per rank, no spinning while idle.
: "${OMP_NUM_THREADS:=$(( $(nproc) / W > 0 ? $(nproc) / W : 1 ))}"
: "${OMP_WAIT_POLICY:=passive}"
export OMP_NUM_THREADS OMP_WAIT_POLICY
# shellcheck disable=SC2046
set -- mpirun $(mpirun_root_flags) -np 1 "$BIN/coordinator" "$CONFIG" : -np "$W" "$BIN/worker" "$CONFIG"
log "starting: $*"
"$@" &
JOB=$!
trap 'kill -TERM $JOB 2>/dev/null; wait $JOB' INT TERM

START=$SECONDS
for i in $(seq 1 600); do
  if ! kill -0 "$JOB" 2>/dev/null; then wait "$JOB"; exit $?; fi
  if curl -fsS "$URL/health" >/dev/null 2>&1; then
    cat <<MSG

hyserve is ready at $URL after $((SECONDS - START)) s  (dp=$DP, tp=$TP; Ctrl-C to stop)
Try:
  curl -s $URL/generate -H 'Content-Type: application/json' \\
       -d '{"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 16}}'

MSG
    break
  fi
  if [ $((i % 10)) -eq 0 ]; then log "starting: waiting for $URL/health ($((SECONDS - START)) s)"; fi
  sleep 0.5
done
wait "$JOB"
