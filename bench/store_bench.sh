#!/usr/bin/env bash
# Runs bench/store_bench (dtrain's store vs PyTorch's libuv TCPStore server at 256-8,192 ranks)
# in a network namespace of its own, where name lookups go to a stub resolver on loopback
# that answers every query at once with "no such name".
#   bench/store_bench.sh [BUILD_DIR] [store_bench ARGS...]     (root: it makes namespaces)
# Why: c10d's server looks up the name of every client it accepts (a reverse DNS query, on its
# one event-loop thread). On a cluster that is a round trip to the site's DNS per rank; on a
# machine whose resolver does not answer, each lookup waits out the resolver's 5 s timeout.
# The stub is c10d's best case - a resolver on the same host that never makes it wait - so the
# comparison measures the two servers, not this machine's DNS. Without it (plain `store_bench`)
# you measure your own DNS too.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
if [[ $# -gt 0 && -d "$1" ]]; then build="$1"; shift; fi
bench="$build/bench/store_bench"
[[ -x "$bench" ]] || { echo "store_bench.sh: build $bench first (cmake --build $build -t store_bench)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "nameserver 127.0.0.1" >"$work/resolv.conf"
cat >"$work/stub_dns.py" <<'PY'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
while True:
    q, peer = s.recvfrom(512)
    if len(q) >= 12:  # same id and question; QR RD RA set, RCODE 3 (NXDOMAIN), no answers
        s.sendto(q[:2] + b"\x81\x83" + q[4:6] + b"\0" * 6 + q[12:], peer)
PY
exec unshare --net --mount --propagation private bash -c '
  set -e
  ip link set lo up
  mount --bind "$1/resolv.conf" /etc/resolv.conf
  python3 "$1/stub_dns.py" & stub=$!
  trap "kill $stub" EXIT
  shift
  "$@"
' _ "$work" "$bench" "$@"
