#!/usr/bin/env bash
# The GPU check of the CUDA backend, in two halves, because the GPU machine reaches no package
# registry and is lent only for minutes:
#
#   scripts/gpu-check.sh build        here, on a CPU machine with the CUDA toolkit: builds
#                                     build-gpu/ (portable CPU flags, no sanitizer builds)
#   scripts/gpu-check.sh run OUT      on the GPU machine, with build-gpu/ carried over: runs the
#                                     GPU tests (ctest -L gpu) and writes every result into OUT
#
# The GPU tests are the CPU suite's own tests again with KILN_TEST_DEVICE=cuda:0 (the op
# conformance harness against the CPU reference in every op, dtype and mode; host <-> device
# copies): tests/CMakeLists.txt lists them under the label gpu. They stay under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu

case "${1:-}" in
  build)
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu-check: no CUDA toolkit here" >&2; exit 2; }
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DKILN_SANITIZE=OFF \
          -DKILN_SANITIZE_CLI=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=ON
    cmake --build "$BUILD" --target kiln_tests kiln_cli
    ;;
  run)
    OUT="${2:?usage: scripts/gpu-check.sh run OUT}"
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
    { nvidia-smi || echo "nvidia-smi failed"; } > "$OUT/nvidia-smi.txt" 2>&1
    status=0
    timeout 480 ctest --test-dir "$BUILD" -L gpu --output-on-failure --output-junit "$OUT/gpu-tests.xml" \
      > "$OUT/gpu-tests.log" 2>&1 || status=$?
    tail -n 40 "$OUT/gpu-tests.log"
    exit "$status"
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
