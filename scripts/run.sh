#!/usr/bin/env bash
# Builds kiln and runs the CLI. With no arguments it inspects the bundled tiny FLUX.1
# checkpoint (every component's config and weights, loaded zero-copy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target kiln_cli
if [ "$#" -eq 0 ]; then set -- inspect; fi
exec build/tools/kiln "$@"
