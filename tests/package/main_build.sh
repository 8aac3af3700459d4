#!/usr/bin/env bash
# The quick start's command 1 (scripts/run_main.sh) on this machine: scripts/setup.sh --main -
# its configuration (the unity build of `dtrain` and `fashion_mnist` alone, on the torch wheel's
# libtorch) - into a build directory of its own, then the main job for one epoch. A change that
# breaks the first command a new user runs (a name two runtime sources both define, which only a
# unity build sees) fails here. The packages and the venv are command 2's, already installed.
#   tests/package/main_build.sh SOURCE_DIR
set -euo pipefail
src="$(cd "$1" && pwd -P)"
# The build runs from one fixed path for every clone: a link to this clone. CMake's unity
# sources include their sources by absolute path, so from a clone's own path every new clone
# (CI's) compiled the 4 unity sources cold (~2 min of CI); from the same path ccache reuses
# them. One lock for the link, so that two clones' runs take turns.
base="${TMPDIR:-/tmp}/dtrain-main-build"
mkdir -p "$base"
exec 9>"$base/lock"
flock -w 900 9 || { echo "main_build: another main_build held $base/lock for 15 minutes" >&2; exit 1; }
ln -sfn "$src" "$base/src"
src="$base/src"
# Inside the clone (ignored: /build*/), so that ccache, keyed relative to the clone, reuses the
# last run's objects of the sources compiled one by one.
work="$src/build-main-test/run"
rm -rf "$work"
# The build and then the link go when the test ends (the lock is still held then).
trap 'rm -rf "$work"; rm -f "$base/src"' EXIT
DTRAIN_LIBTORCH=pypi "$src/scripts/setup.sh" --main "$work/build"
ls "$work/build/CMakeFiles/dtrain_runtime.dir/Unity/"unity_*_cxx.cxx >/dev/null ||
  { echo "main_build: setup.sh --main did not make a unity build" >&2; exit 1; }
out="$(timeout 300 "$work/build/tools/dtrain" run --nproc-per-node 2 \
       "$work/build/examples/fashion_mnist" --epochs 1 2>&1)" ||
  { echo "$out" >&2; echo "main_build: the main job failed" >&2; exit 1; }
echo "$out" | tail -n 2
acc="$(echo "$out" | sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' | tail -n 1)"
[[ -n "$acc" ]] || { echo "main_build: the main job printed no test accuracy" >&2; exit 1; }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }' ||
  { echo "main_build: test accuracy $acc after one epoch, expected >= 0.8" >&2; exit 1; }
echo "main_build: command 1's build trains to test accuracy $acc in one epoch"
