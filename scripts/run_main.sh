#!/usr/bin/env bash
# Quick start, command 1: installs and builds what the main job needs, nothing more, then runs
# it: data-parallel training of the seed's MLP on Fashion-MNIST with 2 local processes (3
# epochs; extra flags are passed on, e.g. --model cnn). It builds on the libtorch 2.11 of
# PyPI's torch wheel (its CPU libraries; ~550 MB of wheels, no venv of peers): on this
# project's 2-core machine it trains ~2x faster than Debian's libtorch 1.13, and installs
# faster too (README, "Quick start"). scripts/run_tests.sh installs and builds the rest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$SECONDS
echo "run_main [1/2] set-up: Debian packages, the torch wheel, building dtrain and fashion_mnist"
DTRAIN_LIBTORCH=pypi "$here/scripts/setup.sh" --main "$here/build-torch2"
echo "run_main [2/2] training (set-up took $((SECONDS - start)) s):" \
     "dtrain run --nproc-per-node 2 build-torch2/examples/fashion_mnist $*"
exec "$here/build-torch2/tools/dtrain" run --nproc-per-node 2 "$here/build-torch2/examples/fashion_mnist" "$@"
