# Shared set-up for launch/*.sh: install missing Debian packages, configure and build.
# Sourced, not executed.
set -euo pipefail

HYSERVE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HYSERVE_BUILD_DIR="${HYSERVE_BUILD_DIR:-$HYSERVE_ROOT/build}"

log() { printf '[hyserve] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; return 1; fi
}

# Boost >= 1.81 headers already present (e.g. a newer distribution's default Boost)?
have_boost_181() {
  local v
  v=$(sed -n 's/^#define BOOST_VERSION \([0-9]*\)$/\1/p' /usr/include/boost/version.hpp 2>/dev/null || true)
  [ -n "$v" ] && [ "$v" -ge 108100 ]
}

install_deps() {
  local wanted=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libyaml-cpp-dev
                libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev)
  have_boost_181 || wanted+=(libboost1.81-dev)
  # The OpenAI client test (tests/openai_client) runs on Node.js. Only when absent: a
  # NodeSource nodejs bundles npm and conflicts with Debian's npm package.
  command -v node >/dev/null || wanted+=(nodejs)
  command -v npm >/dev/null || wanted+=(npm)
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "system packages present"
    return 0
  fi
  if ! command -v apt-get >/dev/null; then
    log "missing packages (${missing[*]}) and no apt-get: install them by hand"; return 1
  fi
  log "installing: ${missing[*]}"
  if ! { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
         as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    # Offline, or another distribution's names (a newer Boost, a GPU image with its own
    # stack): go on with what is present; configuring names anything that is really missing.
    log "could not install ${missing[*]}; building with what is present"
  fi
}

# build_project [TARGET...]: configure, then build the given targets (default: everything).
build_project() {
  local jobs targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  jobs=$(nproc 2>/dev/null || echo 2)
  log "configuring in $HYSERVE_BUILD_DIR"
  cmake -S "$HYSERVE_ROOT" -B "$HYSERVE_BUILD_DIR" -DCMAKE_BUILD_TYPE="${HYSERVE_BUILD_TYPE:-RelWithDebInfo}" \
    ${HYSERVE_CMAKE_ARGS:-} >/dev/null
  log "building with $jobs jobs"
  cmake --build "$HYSERVE_BUILD_DIR" -j "$jobs" "${targets[@]}"
}

# mpirun flags: root needs --allow-run-as-root; oversubscribe only then, so real clusters keep
# their slot accounting.
mpirun_root_flags() {
  if [ "$(id -u)" -eq 0 ]; then echo "--allow-run-as-root --oversubscribe"; fi
}
