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
# copies): tests/CMakeLists.txt lists them under the label gpu. Then the bundled FLUX.1 image on
# cuda:0 in each mode and with offload, compared with Diffusers'. All within 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${GPU_CHECK_BUILD:-build-gpu}"  # another build folder for a dry run

case "${1:-}" in
  build)
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu-check: no CUDA toolkit here" >&2; exit 2; }
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DKILN_SANITIZE=OFF \
          -DKILN_SANITIZE_CLI=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=ON
    cmake --build "$BUILD" --target kiln_tests kiln_cli
    du -sh "$BUILD/tests/kiln_tests" "$BUILD/tools/kiln"
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
    # The bundled FLUX.1 checkpoint on cuda:0 in every mode and with model offload, against the
    # image Diffusers made for it; deferred and compiled must give the same bytes as each other.
    KILN="$BUILD/tools/kiln"
    MODEL=tests/fixtures/flux1_tiny_arch
    ARGS=(--model "$MODEL/pipeline" --prompt "A painting of a squirrel eating a burger" --height 128 --width 128
          --steps 4 --max-sequence-length 32 --seed 0)
    for run in "cpu eager" "cuda:0 eager" "cuda:0 defer" "cuda:0 compile" "cuda:0 eager --offload model"; do
      set -- $run
      name="$(echo "$run" | tr ' :' '__')"
      timeout 120 "$KILN" generate "${ARGS[@]}" --device "$1" --mode "$2" "${@:3}" --out "$OUT/$name.png" \
        --report "$OUT/$name.json" > "$OUT/$name.log" 2>&1 || { echo "generate $run failed" | tee -a "$OUT/summary.txt"; status=1; continue; }
      "$KILN" compare "$OUT/$name.png" "$MODEL/image.png" 2>&1 | tee -a "$OUT/summary.txt" || status=1
    done
    cmp "$OUT/cuda_0_defer.png" "$OUT/cuda_0_compile.png" && echo "deferred and compiled: the same bytes" | tee -a "$OUT/summary.txt" || status=1
    exit "$status"
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
