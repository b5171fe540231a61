#!/usr/bin/env sh
# ctest entry: installs the pinned openai npm package (once) and runs the client test against
# launch/serve.sh. A missing node/npm or an unreachable npm registry fails the test.
set -eu
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "FAIL: node and npm are needed (Debian: apt-get install nodejs npm; launch/common.sh installs them)" >&2
  exit 1
fi
if [ ! -f node_modules/openai/package.json ]; then
  if ! npm ci --prefer-offline --no-audit --no-fund; then
    echo "FAIL: could not install the openai npm package (is the npm registry reachable?)" >&2
    exit 1
  fi
fi
exec node openai_client_test.mjs
