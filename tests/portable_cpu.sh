#!/bin/bash
# portable_cpu.sh KILN: the program on emulated CPUs older than this one (qemu-user). The test
# build links every portable level's CPU kernels besides the native ones (cmake/cpu_kernels.cmake),
# and everything else is compiled for plain x86-64, so:
#   - on a Westmere (SSE4.2, AES, no AVX) it makes the bundled image with the x86-64-v2 kernels:
#     one AVX instruction anywhere on the way (the rest of kiln, an inline function a wider copy
#     of the kernels compiled) would stop it with SIGILL;
#   - there, KILN_CPU_KERNELS=native is refused in one line naming what the CPU lacks;
#   - on a CPU below kiln's floor (Nehalem: no AES) kiln starts and says why it cannot run.
set -euo pipefail
kiln=$1
command -v qemu-x86_64 >/dev/null || {
  echo "portable_cpu: qemu-x86_64 not found (scripts/install-deps.sh installs qemu-user)" >&2
  exit 1
}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "portable_cpu: $*" >&2; exit 1; }

qemu-x86_64 -cpu Westmere "$kiln" generate -o "$dir/westmere.png" --report "$dir/westmere.json" >"$dir/log" 2>&1 ||
  fail "kiln failed on an emulated Westmere: $(tail -5 "$dir/log")"
grep -q '"cpu_kernels": *"x86-64-v2"' "$dir/westmere.json" ||
  fail "an emulated Westmere did not run the x86-64-v2 kernels: $(grep cpu_kernels "$dir/westmere.json")"
[ -s "$dir/westmere.png" ] || fail "no image from the emulated Westmere"

if KILN_CPU_KERNELS=native qemu-x86_64 -cpu Westmere "$kiln" generate -o "$dir/native.png" >"$dir/log" 2>&1; then
  fail "KILN_CPU_KERNELS=native ran on an emulated Westmere"
fi
grep -q "KILN_CPU_KERNELS=native needs .*avx.*, which this CPU lacks" "$dir/log" || fail "unexpected refusal: $(cat "$dir/log")"
[ ! -e "$dir/native.png" ] || fail "a refused run wrote an image"

if qemu-x86_64 -cpu Nehalem "$kiln" generate -o "$dir/old.png" >"$dir/log" 2>&1; then
  fail "kiln ran on a CPU below its floor"
fi
grep -q "this CPU lacks aes, pclmul, which even kiln's x86-64-v2 kernels need" "$dir/log" ||
  fail "unexpected refusal below the floor: $(cat "$dir/log")"
[ ! -e "$dir/old.png" ] || fail "a refused run wrote an image"
echo "portable_cpu: Westmere ran x86-64-v2; native there and Nehalem refused in one line"
