#!/usr/bin/env bash
# FetchContent route: a separate project pulls dtrain from a local clone (this checkout's HEAD
# commit, so commit what you test) with FetchContent_Declare(GIT_REPOSITORY ...), builds it as
# a subproject - tests, examples and benchmarks off - links dtrain::dtrain, and runs under the
# fetched `dtrain run`.
#   fetchcontent_test.sh SOURCE_DIR [LIBTORCH_DIR]     (LIBTORCH_DIR empty: Debian's)
set -euo pipefail
src="$1"; libtorch="${2:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
commit="$(git -C "$src" rev-parse HEAD)"
launcher=()
if command -v ccache >/dev/null; then
  # Keyed relative to the fetched checkout, laid out as a clone and its build/ (see
  # fetchcontent/CMakeLists.txt): the library's objects come from the cache of the last build.
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$tmp/dtrain;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_COMPILERCHECK=content;ccache")
fi
start=$SECONDS
cmake -S "$src/tests/package/fetchcontent" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDTRAIN_GIT_REPOSITORY="$src" -DDTRAIN_GIT_TAG="$commit" -DDTRAIN_SOURCE_DIR="$tmp/dtrain" \
  -DDTRAIN_LIBTORCH="$libtorch" "${launcher[@]}" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; exit 1; }
[[ "$(git -C "$tmp/dtrain" rev-parse HEAD)" == "$commit" ]] || { echo "FAIL: fetched another commit"; exit 1; }
cmake --build "$tmp/consumer" --target consumer dtrain_cli >"$tmp/build.log" 2>&1 ||
  { tail -n 50 "$tmp/build.log"; exit 1; }
echo "configured and built in $((SECONDS - start)) s ($(grep -c '^\[' "$tmp/build.log") build steps)"
out="$("$tmp/dtrain/build/tools/dtrain" run --nproc-per-node 2 "$tmp/consumer/consumer")"
[[ "$(grep -c 'consumer: ok' <<<"$out")" -eq 2 ]] || { echo "FAIL: dtrain run: $out"; exit 1; }
echo "PASS: FetchContent from $src at ${commit:0:10}; dtrain::dtrain linked; 2 ranks ran under dtrain run"
