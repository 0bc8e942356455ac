#!/usr/bin/env bash
# Builds kiln and runs the whole test suite (unit tests, op harness, sanitizer fuzz test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# GPU tests (label gpu) run only in scripts/gpu-check.sh, on a machine with a GPU.
ctest --test-dir build --output-on-failure -j "$(nproc)" -LE gpu
