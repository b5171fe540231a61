#!/usr/bin/env bash
# Installs missing packages, builds, and serves CONFIG (default configs/default.yaml) under
# mpirun: one coordinator rank and dp·tp worker ranks. Prints the URL and a curl to try once
# /health answers 200, and a line every five seconds while it waits (the workers print their
# weight-loading progress meanwhile). Ctrl-C (or SIGTERM to this script) drains in-flight requests
# and stops every rank; works from any directory.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CONFIG="${1:-$HYSERVE_ROOT/configs/default.yaml}"
[ -f "$CONFIG" ] || { log "no such config: $CONFIG"; exit 2; }
# HYSERVE_NO_BUILD=1: serve the binaries already in $HYSERVE_BUILD_DIR (no install, no build).
if [ "${HYSERVE_NO_BUILD:-0}" != 1 ]; then
  install_deps
  build_project coordinator worker hyserve-generate hyserve-bench hyserve-write-checkpoint
fi

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
# mpirun runs in a session of its own: Ctrl-C (SIGINT to this script's process group) must not
# reach it, since mpirun ends the job on SIGINT/SIGTERM and kills the ranks about a second later.
# This script forwards the first SIGINT/SIGTERM as SIGUSR1, which mpirun passes on to every rank:
# the coordinator drains (in-flight requests finish within server.drain_timeout_s; /health
# answers 503 from the signal on), the workers ignore it and stop when the coordinator tells them.
# A second signal ends the job at once.
# shellcheck disable=SC2046
set -- setsid mpirun $(mpirun_root_flags) -np 1 "$BIN/coordinator" "$CONFIG" : -np "$W" "$BIN/worker" "$CONFIG"
log "starting: $*"
"$@" </dev/null &
JOB=$!
STOPPING=""
stop() {
  if [ -z "$STOPPING" ]; then
    STOPPING=1
    log "stopping: draining in-flight requests (a second Ctrl-C ends the job at once)"
    kill -USR1 "$JOB" 2>/dev/null || true
    # Also straight to the coordinator (a child of mpirun on this host): a drain must not
    # depend on mpirun forwarding the signal.
    pkill -USR1 -P "$JOB" -x coordinator 2>/dev/null || true
  else
    log "stopping now"
    kill -TERM "$JOB" 2>/dev/null || true
  fi
}
trap stop INT TERM
# This script killed or gone: the job goes too.
trap 'kill -TERM "$JOB" 2>/dev/null || true' EXIT

START=$SECONDS
for i in $(seq 1 600); do
  if ! kill -0 "$JOB" 2>/dev/null; then break; fi
  if [ -n "$STOPPING" ]; then break; fi
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
  sleep 0.5 || true  # a Ctrl-C kills the sleep too (set -e must not end the script)
done
# `wait` returns early when a trapped signal arrives: wait again until mpirun has exited.
RC=0
while true; do
  if wait "$JOB"; then RC=0; else RC=$?; fi
  kill -0 "$JOB" 2>/dev/null || break
done
exit "$RC"
