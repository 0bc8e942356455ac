#!/usr/bin/env bash
# The GPU check of the CUDA backend, in two halves, because the GPU machine reaches no package
# registry and is lent only for minutes:
#
#   scripts/gpu-check.sh build        here, on a CPU machine with the CUDA toolkit: builds
#                                     build-gpu/ (portable CPU flags, no sanitizer builds) and
#                                     stages what the GPU machine needs in build-gpu/stage/
#                                     (the test binary, the CLI, the list of GPU tests)
#   scripts/gpu-check.sh run OUT      on the GPU machine, in a copy of the tree with
#                                     build-gpu/stage/ carried over: runs the GPU tests and the
#                                     images below, and writes every result into OUT
#
# The GPU tests are CTest's label gpu (tests/CMakeLists.txt): the CPU suite's own tests again
# with KILN_TEST_DEVICE=cuda:0 (the op harness against the CPU reference in every op, dtype and
# mode; host <-> device copies; the pipeline goldens). `run` runs them from the staged list, since
# CTest's files name this machine's paths. Then the bundled FLUX.1 image on cuda:0 in each mode
# and with offload, compared with Diffusers'. All within 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${GPU_CHECK_BUILD:-build-gpu}"  # another build folder for a dry run

case "${1:-}" in
  build)
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu-check: no CUDA toolkit here" >&2; exit 2; }
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DKILN_SANITIZE=OFF \
          -DKILN_SANITIZE_CLI=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=ON
    cmake --build "$BUILD" --target kiln_tests kiln_cli
    STAGE="$BUILD/stage"
    rm -rf "$STAGE" && mkdir -p "$STAGE"
    cp "$BUILD/tests/kiln_tests" "$BUILD/tools/kiln" "$STAGE/"
    strip --strip-unneeded "$STAGE/kiln_tests" "$STAGE/kiln"
    ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 > "$STAGE/gpu-tests.json"
    du -sh "$STAGE"
    ;;
  run)
    OUT="${2:?usage: scripts/gpu-check.sh run OUT}"
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
    { nvidia-smi || echo "nvidia-smi failed"; } > "$OUT/nvidia-smi.txt" 2>&1
    STAGE="$BUILD/stage"
    [ -x "$STAGE/kiln_tests" ] || { echo "gpu-check: no $STAGE (run scripts/gpu-check.sh build first)" >&2; exit 2; }
    status=0
    # Each GPU test of the staged list, with its environment, from this tree's fixtures.
    python3 - "$STAGE" "$OUT" <<'PY' || status=1
import json, os, subprocess, sys
stage, out = sys.argv[1], sys.argv[2]
tests = json.load(open(os.path.join(stage, "gpu-tests.json")))["tests"]
failed = 0
with open(os.path.join(out, "gpu-tests.txt"), "w") as summary:
    for t in tests:
        env = dict(os.environ, KILN_TEST_FIXTURES=os.path.abspath("tests/fixtures"))
        for p in t.get("properties", []):
            if p["name"] == "ENVIRONMENT":
                env.update(v.split("=", 1) for v in p["value"])
        cmd = [os.path.join(stage, "kiln_tests")] + t["command"][1:]
        with open(os.path.join(out, t["name"] + ".log"), "w") as log:
            try:
                rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        failed += rc != 0
        line = f"{t['name']}: {'passed' if rc == 0 else 'FAILED (' + str(rc) + ')'}"
        print(line)
        summary.write(line + "\n")
sys.exit(1 if failed else 0)
PY
    # The bundled FLUX.1 checkpoint on cuda:0 in every mode and with model offload, against the
    # image Diffusers made for it; deferred and compiled must give the same bytes as each other.
    KILN="$STAGE/kiln"
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
