#!/usr/bin/env bash
# portable_vs_native.sh NATIVE PORTABLE MODEL PAIRS [generate flags...]: a native build's kiln
# against a portable build's (-DKILN_NATIVE=OFF), run in turn (native, portable, native, …) on
# the same folder, seed and flags; prints each pair's seconds from the runs' own reports (total,
# the steps, decode), the median of the portable/native ratios, and whether the two images are the
# same bytes. PORTABLE may be the native build's program itself when it was built with its tests
# (it links the portable levels too): then KILN_CPU_KERNELS picks the copy a portable build runs
# here (PORTABLE_KERNELS, default: the first of avx512-bf16, x86-64-v4, x86-64-v3, x86-64-v2 that
# this CPU runs). Needs jq.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 NATIVE PORTABLE MODEL PAIRS [generate flags...]" >&2; exit 2; }
native=$1 portable=$2 model=$3 pairs=$4
shift 4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

portable_env=()
if [ "$(realpath "$native")" = "$(realpath "$portable")" ]; then
  kernels=${PORTABLE_KERNELS:-}
  if [ -z "$kernels" ]; then
    for level in avx512-bf16 x86-64-v4 x86-64-v3 x86-64-v2; do
      if KILN_CPU_KERNELS=$level "$native" generate -W 64 -H 64 --steps 1 -o "$dir/probe.png" >/dev/null 2>&1; then
        kernels=$level
        break
      fi
    done
  fi
  portable_env=(env "KILN_CPU_KERNELS=$kernels")
fi

run() {  # run NAME PROGRAM...: one generate, its report in $dir/NAME.json
  local name=$1
  shift
  "$@" generate --model "$model" "${flags[@]}" -o "$dir/$name.png" --report "$dir/$name.json" >/dev/null 2>&1
}
seconds() {  # total, steps, decode of a report
  jq -r '[.timings.total, (.timings.steps | add), .timings.decode] | map(. * 1000 | round / 1000) | @tsv' "$1"
}

flags=("$@")
run warmup "$native"
printf 'pair\tnative total\tsteps\tdecode\tportable total\tsteps\tdecode\tratio\n'
ratios=()
for i in $(seq 1 "$pairs"); do
  run native "$native"
  run portable "${portable_env[@]}" "$portable"
  n=$(seconds "$dir/native.json") p=$(seconds "$dir/portable.json")
  ratio=$(jq -n "$(jq .timings.total "$dir/portable.json") / $(jq .timings.total "$dir/native.json") * 1000 | round / 1000")
  ratios+=("$ratio")
  printf '%s\t%s\t%s\t%s\n' "$i" "$n" "$p" "$ratio"
done
echo "kernels: native $(jq -r .engine.cpu_kernels "$dir/native.json"), portable $(jq -r .engine.cpu_kernels "$dir/portable.json")"
echo "median portable/native total: $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
if cmp -s "$dir/native.png" "$dir/portable.png"; then echo "images: the same bytes"; else echo "images: DIFFER"; fi
