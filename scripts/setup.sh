#!/usr/bin/env bash
# Installs what dtrain needs from Debian's registry and PyPI (the venv of peers), then
# configures and builds. Idempotent: when everything is present it only runs the
# (incremental) build.
#   scripts/setup.sh [BUILD_DIR]     (default: build)
# With DTRAIN_LIBTORCH=pypi the build uses the libtorch 2.x of the venv's PyTorch wheel
# (default BUILD_DIR: build-torch2); without it, Debian's libtorch 1.13; any other value is
# a libtorch directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
libtorch="${DTRAIN_LIBTORCH:-}"
if [[ "$libtorch" == pypi ]]; then
  build="${1:-$here/build-torch2}"
else
  build="${1:-$here/build}"
fi

packages=(
  # toolchain; ccache keeps compiled objects outside the clone, so a fresh clone (CI's) rebuilds
  # from the cache of the last build on this machine
  g++ cmake ninja-build pkg-config ccache clang-format
  # libtorch 1.13 (CPU) with c10d and Gloo; OpenBLAS makes its matmuls ~10x faster
  libtorch-dev libgloo-dev libopenblas0-pthread
  # libraries we build on
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  # the MLflow client (src/tracking); headless Chromium for the MLflow UI screenshot test
  libcurl4-openssl-dev chromium
  # tests and benchmarks; clang's libFuzzer and sanitizer runtimes for scripts/fuzz.sh
  libgtest-dev libgmock-dev libbenchmark-dev procps iproute2 python3 python3-torch
  clang libclang-rt-14-dev
  # the venv of PyPI peers (scripts/python_env.sh): PyTorch 2.x, ...
  python3-venv python3-pip
  # data for the examples
  dataset-fashion-mnist
  # cluster engines for the cluster tests (tests/cluster): Slurm with munge, Open MPI's and
  # MPICH's launchers (we never link MPI), sshd for host files, and what the test scripts use
  slurmctld slurmd slurm-client munge openmpi-bin mpich openssh-server openssh-client util-linux
  # Spark (pip's pyspark in the venv) runs on Java 17
  openjdk-17-jre-headless
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: these packages are missing and installing them needs root: ${missing[*]}" >&2
    echo "setup: run as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# PyPI peers (PyTorch 2.x, ...), pinned in scripts/requirements.txt, into the project's venv.
venv_python="$("$here/scripts/python_env.sh" | tail -n 1)"

if [[ "$libtorch" == pypi ]]; then
  libtorch="$("$venv_python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)"
fi

jobs="$(nproc)"
config=(-DDTRAIN_VENV_PYTHON="$venv_python" -DDTRAIN_LIBTORCH="$libtorch")
# ccache, keyed relative to the clone (CCACHE_BASEDIR) so that another clone of the same
# commit - CI's - hits the objects this machine built before; the precompiled torch header
# needs the pch sloppiness. The cache lives outside the clone (ccache's default, ~/.cache/ccache).
config+=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$here;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_COMPILERCHECK=content;ccache")
ccache --max-size=20G >/dev/null
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${config[@]}"
else
  cmake "$build" "${config[@]}" >/dev/null
fi
cmake --build "$build" -j "$jobs"
