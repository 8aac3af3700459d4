#!/usr/bin/env bash
# Quick start, command 1: set up, build, and run the main job on 2 local processes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
exec "$here/build/tools/dtrain" run --nproc-per-node 2 "$here/build/examples/hello_worker" "$@"
