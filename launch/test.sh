#!/usr/bin/env bash
# Installs missing packages, builds in build/, runs the whole test suite with ctest.
# Extra arguments go to ctest (e.g. -R Bamba).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_deps
build_project
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cd "$HYSERVE_BUILD_DIR"
ctest --output-on-failure -j "$jobs" --timeout 600 "$@"
