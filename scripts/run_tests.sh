#!/usr/bin/env bash
# Quick start, command 2: set up, build, and run every test (ctest prints what ran).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here/build"
ctest --output-on-failure --timeout 600 "$@"
