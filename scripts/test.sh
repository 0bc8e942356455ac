#!/usr/bin/env bash
# Builds kiln and runs the whole test suite (unit tests, op harness, sanitizer fuzz test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
