#!/usr/bin/env bash
# Builds kiln and runs the CLI. With no arguments it runs the main job: kiln generate on the
# bundled tiny FLUX.1 checkpoint, writing out.png.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN_BUILD_MODE=cli bash scripts/build.sh --target kiln_cli
if [ "$#" -eq 0 ]; then set -- generate --out out.png; fi
exec build/tools/kiln "$@"
