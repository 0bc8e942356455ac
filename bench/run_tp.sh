#!/usr/bin/env bash
# Tensor parallelism on this machine, one run: the mid-size FLUX transformer with 1 rank x 2
# threads, then 2 ranks x 1 thread (OpenMPI). Needs the build (scripts/build.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bench=${BENCH_TP:-$here/build/bench/bench_tp}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
echo "== 1 rank x 2 threads"
"${mpirun[@]}" -np 1 -x OMP_NUM_THREADS=2 "$bench"
echo "== 2 ranks x 1 thread"
"${mpirun[@]}" -np 2 -x OMP_NUM_THREADS=1 "$bench"
