#!/usr/bin/env bash
# Installs what dtrain needs from Debian's registry and PyPI (the venv of peers), then
# configures and builds. Idempotent: when everything is present it only runs the
# (incremental) build.
#   scripts/setup.sh [--main] [BUILD_DIR]     (default BUILD_DIR: build)
# With DTRAIN_LIBTORCH=pypi the build uses the libtorch 2.x of the venv's PyTorch wheel
# (default BUILD_DIR: build-torch2); without it, Debian's libtorch 1.13; any other value is
# a libtorch directory.
# --main (scripts/run_main.sh): only what the main job needs - the toolchain, the dataset, one
# libtorch (with pypi: the torch wheel alone, whose CPU libraries dtrain links, and the two
# CUDA runtime wheels they load; no venv of peers) - and only the `dtrain` and `fashion_mnist`
# targets, on the CPU. Without it: everything the test suite needs, and the whole tree.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
main_only=0
if [[ "${1:-}" == --main ]]; then
  main_only=1
  shift
fi
libtorch="${DTRAIN_LIBTORCH:-}"
if [[ "$libtorch" == pypi ]]; then
  build="${1:-$here/build-torch2}"
else
  build="${1:-$here/build}"
fi
say() { echo "setup: $*"; }

# What the main job needs (--main).
packages=(
  # toolchain; ccache keeps compiled objects outside the clone, so a fresh clone (CI's) rebuilds
  # from the cache of the last build on this machine
  g++ cmake ninja-build pkg-config ccache
  # Gloo's headers (c10d's ProcessGroupGloo.hpp; no libtorch ships them)
  libgloo-dev
  # libraries we build on; libcurl for the MLflow client (src/tracking)
  libcli11-dev nlohmann-json3-dev zlib1g-dev libcurl4-openssl-dev
  # data for the examples
  dataset-fashion-mnist
)
if [[ "$libtorch" == pypi ]]; then
  # the venv that holds the torch wheel (scripts/python_env.sh)
  packages+=(python3-venv)
elif [[ -z "$libtorch" ]]; then
  # libtorch 1.13 (CPU) with c10d; OpenBLAS makes its matmuls ~10x faster
  packages+=(libtorch-dev libopenblas0-pthread)
fi
if ((!main_only)); then
  packages+=(
    clang-format
    # both libtorch builds: Debian's 1.13 and the venv of PyPI peers with PyTorch 2.x, ...
    libtorch-dev libopenblas0-pthread python3-venv python3-pip
    # headless Chromium for the MLflow UI screenshot test
    chromium
    # dtrain::data's Delta deletion vectors: CRoaring reads their roaring bitmaps
    libroaring-dev
    # tests and benchmarks; clang's libFuzzer and sanitizer runtimes for scripts/fuzz.sh
    libgtest-dev libgmock-dev libbenchmark-dev procps iproute2 python3 python3-torch
    clang libclang-rt-14-dev
    # cluster engines for the cluster tests (tests/cluster): Slurm with munge, Open MPI's and
    # MPICH's launchers (we never link MPI), sshd for host files, and what the test scripts use
    slurmctld slurmd slurm-client munge openmpi-bin mpich openssh-server openssh-client util-linux
    # Spark (pip's pyspark in the venv) runs on Java 17
    openjdk-17-jre-headless
    # the install routes' tests (tests/package): the .deb is built by CPack (dpkg-shlibdeps) and
    # installed into a clean Debian root that debootstrap makes
    dpkg-dev debootstrap
  )
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: these packages are missing and installing them needs root: ${missing[*]}" >&2
    echo "setup: run as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  "$here/scripts/apt_install.sh" "${missing[@]}"
fi

if ((main_only)); then
  # The torch wheel's libraries only (scripts/python_env.sh --main); no peers.
  if [[ "$libtorch" == pypi ]]; then
    venv_python="$("$here/scripts/python_env.sh" --main | tail -n 1)"
  else
    venv_python=""
  fi
else
  # PyPI peers (PyTorch 2.x, ...), pinned in scripts/requirements.txt, into the project's venv.
  venv_python="$("$here/scripts/python_env.sh" | tail -n 1)"
fi

if [[ "$libtorch" == pypi ]]; then
  # Where the wheel put libtorch, without importing torch (--main installs none of its Python
  # dependencies).
  libtorch="$("$venv_python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')" ||
    { echo "setup: the venv's python ($venv_python) has no torch package: run scripts/python_env.sh" >&2; exit 1; }
fi

jobs="$(nproc)"
config=(-DDTRAIN_LIBTORCH="$libtorch")
[[ -n "$venv_python" ]] && config+=(-DDTRAIN_VENV_PYTHON="$venv_python")
if ((main_only)); then
  # The main job's targets only, and the CPU build of a CUDA libtorch even where a CUDA toolkit
  # is found (the main job trains on the CPU; only two of the wheel's CUDA libraries are here).
  # No Parquet/Delta reader either: it needs pyarrow, which the main job's venv does not hold.
  # A unity build: a build from nothing in half the compiler processes (CMakeLists.txt says why).
  config+=(-DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_BENCH=OFF -DDTRAIN_BUILD_EXAMPLES=ON
           -DDTRAIN_CUDA=OFF -DDTRAIN_DATA=OFF -DDTRAIN_UNITY_BUILD=ON)
  targets=(dtrain_cli fashion_mnist)
else
  # What --main turned off comes back; CUDA as the tree decides (cmake/libtorch.cmake).
  config+=(-DDTRAIN_BUILD_TESTS=ON -DDTRAIN_BUILD_BENCH=ON -DDTRAIN_BUILD_EXAMPLES=ON
           -UDTRAIN_CUDA -DDTRAIN_DATA=ON -DDTRAIN_UNITY_BUILD=OFF)
  targets=()
fi
# ccache, keyed relative to the clone (CCACHE_BASEDIR) so that another clone of the same
# commit - CI's - hits the objects this machine built before; the precompiled torch header
# needs the pch sloppiness. The cache lives outside the clone (ccache's default, ~/.cache/ccache).
config+=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$here;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_COMPILERCHECK=content;ccache")
ccache --max-size=20G >/dev/null
say "configuring $build (CMake)"
mkdir -p "$build"
log="$build/dtrain-configure.log"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${config[@]}" >"$log" 2>&1 ||
    { cat "$log" >&2; exit 1; }
else
  cmake "$build" "${config[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
fi
grep -E "^-- dtrain: libtorch" "$log" | sed 's/^-- /setup: /' || true
steps="$(ninja -C "$build" -n "${targets[@]}" 2>/dev/null | grep -c '^\[' || true)"
say "building ${targets[*]:-every target} in $build: $steps build steps on $jobs cores (ninja prints [done/total])"
cmake --build "$build" -j "$jobs" ${targets:+--target "${targets[@]}"}
