#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs a separate
# project that uses find_package(dtrain): the exported CMake package works for users.
set -euo pipefail
build="$1"; src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
test -x "$tmp/prefix/bin/dtrain"
test -f "$tmp/prefix/include/dtrain/launch.h"
# The consumer's project is copied beside the prefix and compiled through ccache keyed relative to
# $tmp (as a user's build may be), so that its objects are reused from the last run: every path
# the compiler sees is then the same in every run (~25 s per build on the 2-core VM otherwise).
mkdir "$tmp/project"
cp "$src/tests/package/CMakeLists.txt" "$src/tests/package/main.cpp" "$tmp/project/"
launcher=()
if command -v ccache > /dev/null; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$tmp;CCACHE_COMPILERCHECK=content;ccache")
fi
cmake -S "$tmp/project" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/consumer/consumer"
# A project whose cmake_minimum_required predates CMake 3.21 (policy CMP0126 unset) gets the
# libtorch this dtrain was built on too, not another one found on the system.
cmake -S "$tmp/project" -B "$tmp/consumer-old" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DDTRAIN_CONSUMER_POLICY_VERSION=3.18 \
  > "$tmp/configure-old.log" || { cat "$tmp/configure-old.log"; exit 1; }
cmake --build "$tmp/consumer-old" > "$tmp/build-old.log" || { cat "$tmp/build-old.log"; exit 1; }
"$tmp/consumer-old/consumer"
"$tmp/prefix/bin/dtrain" --help > /dev/null
# The installed dtrain finds the installed fork server (an explicit forkserver without it is a
# usage error, exit 2) and starts the consumer's workers from it.
out="$("$tmp/prefix/bin/dtrain" run --start-method forkserver --nproc-per-node 2 "$tmp/consumer/consumer")"
[[ "$(grep -c 'consumer: ok' <<<"$out")" -eq 2 ]] || { echo "fork server run: $out"; exit 1; }
