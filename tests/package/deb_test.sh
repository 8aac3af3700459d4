#!/usr/bin/env bash
# Debian package route: `cpack -G DEB` in a build on Debian's libtorch makes dtrain and
# libdtrain-dev; apt installs both into a clean Debian 12 root (debian_root.sh: nothing but the
# base system), with their dependencies from Debian's registry; there a separate project finds
# them with find_package(dtrain), builds, and runs under the installed `dtrain run`.
#   deb_test.sh BUILD_DIR SOURCE_DIR        (root; the build must be complete)
# apt's downloads are kept between runs ($DTRAIN_CACHE/apt), as on a machine of one's own.
set -euo pipefail
build="$1"; src="$2"
[[ $(id -u) -eq 0 ]] || { echo "FAIL: deb_test needs root (chroot, mount)"; exit 1; }
command -v dpkg-shlibdeps >/dev/null || { echo "FAIL: dpkg-dev is missing: scripts/setup.sh installs it"; exit 1; }
. "$src/tests/package/debian_root.sh"
work="$(mktemp -d /var/tmp/dtrain-deb-test.XXXXXX)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
(cd "$build" && cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; exit 1; }
shopt -s nullglob
debs=("$work"/debs/*.deb)
((${#debs[@]} == 2)) || { echo "FAIL: cpack made ${#debs[@]} packages, not 2:"; cat "$work/cpack.log"; exit 1; }
version="$(sed -n 's/^#define DTRAIN_VERSION "\(.*\)"/\1/p' "$src/include/dtrain/version.h")"
for d in "${debs[@]}"; do echo "$(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version): $(dpkg-deb -f "$d" Depends)"; done
cli="$work/debs/dtrain_${version}_amd64.deb"; dev="$work/debs/libdtrain-dev_${version}_amd64.deb"
[[ -f "$cli" && -f "$dev" ]] || { echo "FAIL: expected dtrain_${version}_amd64.deb and libdtrain-dev_${version}_amd64.deb"; ls "$work/debs"; exit 1; }
if dpkg-deb -f "$cli" Depends | grep -q torch; then
  echo "FAIL: the dtrain package (the launcher) must not depend on libtorch"; exit 1
fi
echo "packed in $((SECONDS - start)) s"
mkdir -p "$work/upper/tmp/debs" "$work/upper/tmp/consumer-src"
chmod 1777 "$work/upper/tmp"  # the overlay's /tmp is this directory: apt's sandbox user writes there
cp "${debs[@]}" "$work/upper/tmp/debs/"
cp "$src/tests/package/CMakeLists.txt" "$src/tests/package/main.cpp" "$work/upper/tmp/consumer-src/"
in_debian_root "$work" --apt-cache -- "
  apt-get update -q >/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
  apt-get install -y -q /tmp/debs/dtrain_${version}_amd64.deb /tmp/debs/libdtrain-dev_${version}_amd64.deb \
    ninja-build >>/tmp/apt.log 2>&1 || { tail -n 40 /tmp/apt.log; exit 1; }
  echo \"apt installed \$(grep -c '^Setting up' /tmp/apt.log) packages into the clean root\"
  test \"\$(command -v dtrain)\" = /usr/bin/dtrain
  dtrain --version | grep -q '^dtrain $version '
  cmake -S /tmp/consumer-src -B /tmp/consumer -G Ninja -DCMAKE_BUILD_TYPE=Release >/tmp/cmake.log 2>&1 ||
    { cat /tmp/cmake.log; exit 1; }
  cmake --build /tmp/consumer >/tmp/build.log 2>&1 || { cat /tmp/build.log; exit 1; }
  out=\"\$(dtrain run --nproc-per-node 2 /tmp/consumer/consumer)\"
  [ \"\$(echo \"\$out\" | grep -c 'consumer: ok')\" -eq 2 ] || { echo \"FAIL: dtrain run: \$out\"; exit 1; }
"
echo "PASS: dtrain and libdtrain-dev $version installed by apt into a clean Debian 12 root;" \
     "find_package(dtrain) project built and ran 2 ranks under dtrain run ($((SECONDS - start)) s)"
