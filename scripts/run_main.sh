#!/usr/bin/env bash
# Quick start, command 1: set up, build, and run the main job: data-parallel training of the
# seed's MLP on Fashion-MNIST with 2 local processes (3 epochs; extra flags are passed on,
# e.g. --model cnn).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
exec "$here/build/tools/dtrain" run --nproc-per-node 2 "$here/build/examples/fashion_mnist" "$@"
