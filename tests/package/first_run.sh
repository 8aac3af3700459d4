#!/usr/bin/env bash
# The README's first-run figure, measured as a new user gets it: a fresh Debian 12 machine (a
# debootstrap root with nothing but Debian's base system, git and ca-certificates), a fresh
# clone of this repository's HEAD, then `bash scripts/run_main.sh` (command 1) timed from start
# to the end of the main job, with the wall clock of each step. Only the CPU, the kernel and the
# network are shared with this machine (no apt cache, no pip cache, no ccache, no venv), and the
# CA bundle through which this workplace reaches PyPI.
#   tests/package/first_run.sh [ARGS for run_main.sh]       (root; needs debootstrap)
# Too slow for CI (it downloads ~800 MB and builds from nothing): run it by hand and put its
# last result in the README. The base root (tests/package/debian_root.sh) is made once and never
# changed: each run works on an overlay of it.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ $(id -u) -eq 0 ]] || { echo "first_run: needs root (debootstrap, mount, chroot)" >&2; exit 1; }
. "$src/tests/package/debian_root.sh"
debian_root_base >/dev/null
work="$(mktemp -d /var/tmp/dtrain-first-run.XXXXXX)"
trap 'rm -rf "$work"' EXIT
git clone -q --no-hardlinks "$src" "$work/upper/root/dtrain"
echo "first_run: fresh root on $(. /etc/os-release; echo "$PRETTY_NAME"), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); clone of $(git -C "$src" rev-parse --short HEAD)"
start=$(date +%s)
set +e
in_debian_root "$work" -- 'cd /root/dtrain && bash scripts/run_main.sh "$@"' run_main "$@" 2>&1 |
  while IFS= read -r line; do printf '[%4ds] %s\n' $(($(date +%s) - start)) "$line"; done
rc=${PIPESTATUS[0]}
set -e
echo "first_run: run_main.sh exited $rc after $(($(date +%s) - start)) s" \
     "(load average now $(cut -d' ' -f1-3 /proc/loadavg))"
exit "$rc"
