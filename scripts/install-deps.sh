#!/usr/bin/env bash
# Installs every build and test dependency of kiln from Debian's packages.
# Safe to run repeatedly: it only calls apt-get when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev            # oneDNN: convolution and matmul
  libopenblas-openmp-dev # OpenBLAS (OpenMP threading, so it shares threads with our kernels)
  libhwy-dev             # Highway: portable SIMD kernels
  nlohmann-json3-dev     # JSON: safetensors headers, configs, reports
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libpng-dev             # PNG output
  libsentencepiece-dev   # T5 tokenizer (spiece.model)
  libpcre2-dev           # CLIP pre-tokenisation pattern (Unicode classes)
  libopenmpi-dev openmpi-bin  # tensor parallelism: ProcessGroup on MPI, mpirun
  libboost-dev           # kiln serve: Boost.Asio (event loop) and Boost.Beast (HTTP/1.1), header-only
  libcpp-httplib-dev     # kiln serve's tests: the HTTP client
  chromium               # tests: kiln serve's page in a headless browser
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
