#!/usr/bin/env bash
# Fills .device/ (git-ignored) with what scripts/gpu_check.sh needs on the GPU machine and that
# machine lacks (no network, no apt there): the headers of Gloo (c10d's ProcessGroupGloo.hpp
# includes them; PyPI's torch ships none), nlohmann-json, CLI11 and zlib; GoogleTest's sources
# (built there when no GoogleTest is installed); the Fashion-MNIST files. Everything comes from
# this machine's Debian packages (scripts/setup.sh installs them). ~40 MB; the device tool
# carries at most 64 MiB with the working tree.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dst="$here/.device"
rm -rf "$dst"
mkdir -p "$dst/include" "$dst/gloo"
need() { [[ -e "$1" ]] || { echo "gpu_carry: $1 is missing: run scripts/setup.sh first" >&2; exit 1; }; }
for d in /usr/include/gloo /usr/include/nlohmann /usr/include/CLI /usr/src/googletest \
         /usr/include/zlib.h /usr/share/datasets/fashion-mnist; do
  need "$d"
done
# Gloo apart from the rest: its directory goes on every dtrain_runtime user's include path, and
# must not bring a second nlohmann-json where the GPU machine has its own.
cp -r /usr/include/gloo "$dst/gloo/"
cp -r /usr/include/nlohmann /usr/include/CLI "$dst/include/"
cp /usr/include/zlib.h /usr/include/zconf.h "$dst/include/" 2>/dev/null ||
  cp /usr/include/zlib.h /usr/include/x86_64-linux-gnu/zconf.h "$dst/include/"
cp -r /usr/src/googletest "$dst/googletest"
cp -r /usr/share/datasets/fashion-mnist "$dst/fashion-mnist"
echo "gpu_carry: $(du -sh "$dst" | cut -f1) in $dst; working tree: $(git -C "$here" ls-files | xargs du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
