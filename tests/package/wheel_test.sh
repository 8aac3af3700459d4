#!/usr/bin/env bash
# pip wheel route: builds dtrain's wheel (pyproject.toml, scikit-build-core) in the project's
# venv against its torch, installs it with the pinned torch into a fresh venv, and there runs
# `dtrain --version`, an unchanged PyTorch 2.x DDP script under `python -m dtrain.run` (the
# torchrun-compatible launcher), a script under `python -m dtrain.launch` (--local-rank=N),
# imports dtrain.spark, and builds a C++ program against the wheel's library with
# find_package(dtrain) (CMAKE_PREFIX_PATH = dtrain.cmake_prefix_path) and runs it under the
# wheel's `dtrain run`.
#   wheel_test.sh SOURCE_DIR [VENV_PYTHON]     (VENV_PYTHON: the project's venv, python_env.sh)
# The wheel's build tree is SOURCE_DIR/build-wheel (incremental; ccache like scripts/setup.sh),
# or $DTRAIN_WHEEL_BUILD_DIR.
# The fresh venv takes torch and its dependencies from PyPI (pip's cache after the first run).
set -euo pipefail
src="$(cd "$1" && pwd)"; py="${2:-$("$src/scripts/python_env.sh" | tail -n 1)}"
tmp="$(mktemp -d /var/tmp/dtrain-wheel-test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
version="$(sed -n 's/^#define DTRAIN_VERSION "\(.*\)"/\1/p' "$src/include/dtrain/version.h")"
torch_pin="$(grep -o 'torch==[0-9.]*' "$src/pyproject.toml" | head -n 1)"
numpy_pin="$(grep -E '^numpy==' "$src/scripts/requirements.txt")"
settings=()
if [[ -n "${DTRAIN_WHEEL_BUILD_DIR:-}" ]]; then
  # Another build tree of this checkout, reused as it was configured (what it compiled with the
  # same commands is not compiled again).
  settings=("--config-settings=build-dir=$DTRAIN_WHEEL_BUILD_DIR")
elif command -v ccache >/dev/null; then
  settings=("--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$src;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_COMPILERCHECK=content;ccache")
fi
"$py" -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/dist" "${settings[@]}" "$src" \
  >"$tmp/wheel.log" 2>&1 || { tail -n 60 "$tmp/wheel.log"; exit 1; }
wheel=("$tmp"/dist/dtrain-"$version"-*.whl)
[[ -f "${wheel[0]}" ]] || { echo "FAIL: no dtrain-$version wheel in $tmp/dist:"; ls "$tmp/dist"; exit 1; }
echo "built $(basename "${wheel[0]}") ($(du -h "${wheel[0]}" | cut -f1)) in $((SECONDS - start)) s"
unzip -p "${wheel[0]}" "dtrain-$version.dist-info/METADATA" | grep -qx "Requires-Dist: $torch_pin" ||
  { echo "FAIL: the wheel's metadata does not pin $torch_pin"; exit 1; }

t=$SECONDS
/usr/bin/python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel[0]}" "$numpy_pin" \
  >"$tmp/install.log" 2>&1 || { tail -n 40 "$tmp/install.log"; exit 1; }
echo "installed with $("$tmp/venv/bin/python" -c 'import torch; print("torch", torch.__version__)')" \
     "into a fresh venv in $((SECONDS - t)) s"
export PATH="$tmp/venv/bin:$PATH"
[[ "$(command -v dtrain)" == "$tmp/venv/bin/dtrain" ]] || { echo "FAIL: no dtrain command in the venv"; exit 1; }
dtrain --version | grep -q "^dtrain $version " || { echo "FAIL: dtrain --version: $(dtrain --version)"; exit 1; }
prefix="$(python -c 'import dtrain; assert dtrain.__version__ == "'"$version"'", dtrain.__version__; import dtrain.spark; print(dtrain.cmake_prefix_path)')"
# Whatever links libtorch in the wheel finds the fresh venv's torch, not the one it was built with.
ldd "$prefix/bin/dtrain-zero" | grep -q "$tmp/venv/.*/torch/lib/libtorch_cpu.so" ||
  { echo "FAIL: the wheel's dtrain-zero does not load the venv's libtorch:"; ldd "$prefix/bin/dtrain-zero"; exit 1; }

# An unchanged PyTorch DDP script under the launcher, as torchrun would run it.
out="$(cd "$tmp" && python -m dtrain.run --nproc-per-node 2 "$src/tests/interop/ddp_train.py")"
digests="$(grep -o '"digest": "[0-9a-f]*"' <<<"$out" | sort -u | wc -l)"
[[ "$(grep -c '"world_size": 2' <<<"$out")" -eq 2 && "$digests" -eq 1 ]] ||
  { echo "FAIL: python -m dtrain.run ddp_train.py: $out"; exit 1; }

# PyTorch's legacy launcher's form: each worker gets --local-rank=N before its arguments.
out="$(cd "$tmp" && python -m dtrain.launch --nproc-per-node 2 "$src/tests/interop/worker_args.py" x 2>/dev/null)"
[[ "$(grep -c -- 'arg=--local-rank=[01]$' <<<"$out")" -eq 2 && "$(grep -c 'arg=x$' <<<"$out")" -eq 2 ]] ||
  { echo "FAIL: python -m dtrain.launch worker_args.py: $out"; exit 1; }

# A C++ user's project against the wheel's library.
cmake -S "$src/tests/package" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log"; exit 1; }
out="$(dtrain run --nproc-per-node 2 "$tmp/consumer/consumer")"
[[ "$(grep -c 'consumer: ok' <<<"$out")" -eq 2 ]] || { echo "FAIL: dtrain run consumer: $out"; exit 1; }
echo "PASS: wheel dtrain $version ($torch_pin) in a fresh venv: dtrain --version, python -m dtrain.run" \
     "(PyTorch DDP, 2 ranks), python -m dtrain.launch, dtrain.spark, a find_package(dtrain) C++ program under dtrain run" \
     "($((SECONDS - start)) s)"
