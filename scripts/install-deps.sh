#!/usr/bin/env bash
# Installs kiln's dependencies from Debian's packages. Safe to run repeatedly: it only calls
# apt-get when something is missing.
#   install-deps.sh              what building and testing need (scripts/test.sh)
#   install-deps.sh --build      what building the library and the program needs (scripts/run.sh)
#   install-deps.sh --runtime    only what running an installed kiln needs (the shared libraries)
#   install-deps.sh --print-runtime   prints the --runtime packages and exits
#   --no-plugins (with the first two)   skips the PJRT plugins fetched from PyPI (the Dockerfile)
set -euo pipefail

mode=all
plugins=yes
for arg in "$@"; do
  case "$arg" in
    --build) mode=build ;;
    --runtime) mode=runtime ;;
    --print-runtime) mode=print-runtime ;;
    --no-plugins) plugins=no ;;
    *) echo "install-deps: unknown option '$arg' (expected --build, --runtime, --print-runtime or --no-plugins)" >&2
       exit 2 ;;
  esac
done

# The shared libraries the kiln program and library load (tests/install checks this list
# against the program's own).
runtime_packages=(
  libgomp1 libstdc++6
  libdnnl2               # oneDNN: convolution and matmul
  libopenblas0-openmp    # OpenBLAS (OpenMP threading, so it shares threads with our kernels)
  libpng16-16            # PNG output
  libsentencepiece0      # T5 tokenizer (spiece.model)
  libpcre2-8-0           # CLIP pre-tokenisation pattern (Unicode classes)
  libopenmpi3 openmpi-bin  # tensor parallelism: ProcessGroup on MPI, mpirun
)
build_packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev libopenblas-openmp-dev libpng-dev libsentencepiece-dev libpcre2-dev libopenmpi-dev openmpi-bin
  libhwy-dev             # Highway: portable SIMD kernels
  nlohmann-json3-dev     # JSON: safetensors headers, configs, reports
  libboost-dev           # kiln serve: Boost.Asio (event loop) and Boost.Beast (HTTP/1.1), header-only
)
test_packages=(
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libcpp-httplib-dev     # kiln serve's tests: the HTTP client
  chromium               # tests: kiln serve's page in a headless browser
  qemu-user              # tests/portable_cpu.sh: the program on emulated older CPUs
)

case "$mode" in
  print-runtime) echo "${runtime_packages[@]}"; exit 0 ;;
  runtime) packages=("${runtime_packages[@]}") ;;
  build) packages=("${build_packages[@]}") ;;
  all) packages=("${build_packages[@]}" "${test_packages[@]}") ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "$mode" = runtime ] || [ "$plugins" = no ] && exit 0

# XLA's CPU plugin for the PJRT device (src/devices/pjrt): a native runtime published only as a
# PyPI wheel. Pinned by version and sha256, unpacked outside the repository into
# $KILN_DEPS_DIR/xla-cpu-pjrt-<version>/ (the plugin .so and its pjrt_c_api.h); CMake looks there.
pjrt_version=0.0.1
pjrt_sha256=55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc
deps_dir="${KILN_DEPS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln-deps}"
pjrt_dir="$deps_dir/xla-cpu-pjrt-$pjrt_version"
if [ ! -f "$pjrt_dir/.complete" ]; then
  echo "install-deps: fetching the XLA CPU PJRT plugin (xla-cpu-pjrt $pjrt_version) into $pjrt_dir" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "xla-cpu-pjrt==$pjrt_version"
  wheel="$(ls "$tmp"/xla_cpu_pjrt-"$pjrt_version"-*.whl)"
  echo "$pjrt_sha256  $wheel" | sha256sum --check --quiet - || {
    echo "install-deps: $wheel does not have the pinned sha256 $pjrt_sha256" >&2
    exit 1
  }
  rm -rf "$pjrt_dir" && mkdir -p "$pjrt_dir"
  python3 -m zipfile -e "$wheel" "$tmp/unpacked"
  mv "$tmp/unpacked/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so" "$pjrt_dir/"
  mv "$tmp/unpacked/xla_plugins/xla_cpu_pjrt/include" "$pjrt_dir/"
  touch "$pjrt_dir/.complete"
fi

# libtpu, Google's TPU PJRT plugin (also a PyPI-only wheel): --device tpu on a TPU VM, and
# kiln plan --device tpu's ahead-of-time compiles for a TPU topology on any machine (no TPU
# needed). The wheel is ~205 MB, libtpu.so ~575 MB unpacked; the same pinning as above. The
# wheel is tagged per Python version but its libtpu.so is not, so the pinned cp311 wheel is
# fetched whatever python3 this machine has.
libtpu_version=0.0.51
libtpu_sha256=ba67ddbfdbac61c8da1fafc26cd51b93e9fe4d298016e2882eb986b1718cba34
libtpu_dir="$deps_dir/libtpu-$libtpu_version"
if [ ! -f "$libtpu_dir/.complete" ]; then
  echo "install-deps: fetching libtpu $libtpu_version into $libtpu_dir" >&2
  tmp_tpu="$(mktemp -d)"
  trap 'rm -rf "${tmp:-}" "$tmp_tpu"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --abi cp311 --platform manylinux_2_31_x86_64 --dest "$tmp_tpu" "libtpu==$libtpu_version"
  wheel="$(ls "$tmp_tpu"/libtpu-"$libtpu_version"-*.whl)"
  echo "$libtpu_sha256  $wheel" | sha256sum --check --quiet - || {
    echo "install-deps: $wheel does not have the pinned sha256 $libtpu_sha256" >&2
    exit 1
  }
  rm -rf "$libtpu_dir" && mkdir -p "$libtpu_dir"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("libtpu/libtpu.so", sys.argv[2])' \
    "$wheel" "$tmp_tpu/unpacked"
  mv "$tmp_tpu/unpacked/libtpu/libtpu.so" "$libtpu_dir/"
  rm -rf "$tmp_tpu"
  touch "$libtpu_dir/.complete"
fi
