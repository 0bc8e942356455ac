#!/usr/bin/env bash
# Installs missing dependencies, then configures and builds kiln (Release) into build/.
# KILN_BUILD_MODE=cli (scripts/run.sh): the library and the program only, without the packages
# only the tests need; otherwise everything the tests need too. A build/ configured without the
# tests gains them when a later call wants them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KILN_BUILD_MODE:-all}" = cli ]; then
  bash scripts/install-deps.sh --build
  tests=OFF
else
  bash scripts/install-deps.sh
  tests=ON
fi
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=$tests
elif [ "$tests" = ON ] && grep -q '^KILN_BUILD_TESTS:BOOL=OFF$' build/CMakeCache.txt; then
  cmake -S . -B build -DKILN_BUILD_TESTS=ON
fi
cmake --build build -j "$(nproc)" "$@"
