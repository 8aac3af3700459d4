#!/usr/bin/env bash
# The README's first-run figure, measured as a new user gets it: a fresh Debian 12 machine (a
# debootstrap root with nothing but Debian's base system, git and ca-certificates), a fresh
# clone of this repository's HEAD, then `bash scripts/run_main.sh` (command 1) timed from start
# to the end of the main job, with the wall clock of each step. Only the CPU, the kernel and the
# network are shared with this machine (no apt cache, no pip cache, no ccache, no venv), and the
# CA bundle through which this workplace reaches PyPI.
#   tests/package/first_run.sh [ARGS for run_main.sh]       (root; needs debootstrap)
# Too slow for CI (it downloads ~800 MB and builds from nothing): run it by hand and put its
# last result in the README. The base root is kept in $DTRAIN_DEBIAN_ROOT (default
# /var/tmp/dtrain-debian12) and never changed: each run works on an overlay of it.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
base="${DTRAIN_DEBIAN_ROOT:-/var/tmp/dtrain-debian12}"
[[ $(id -u) -eq 0 ]] || { echo "first_run: needs root (debootstrap, mount, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "first_run: debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
if [[ ! -x "$base/usr/bin/git" ]]; then
  echo "first_run: making the base root $base (debootstrap bookworm, once)"
  rm -rf "$base.tmp"
  debootstrap --include=ca-certificates,git bookworm "$base.tmp" http://deb.debian.org/debian >/dev/null
  mv "$base.tmp" "$base"
fi
work="$(mktemp -d /var/tmp/dtrain-first-run.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/upper" "$work/work" "$work/root"
git clone -q --no-hardlinks "$src" "$work/upper/root/dtrain"
echo "first_run: fresh root on $(. /etc/os-release; echo "$PRETTY_NAME"), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); clone of $(git -C "$src" rev-parse --short HEAD)"
start=$(date +%s)
# A private mount namespace: the overlay, /proc, /sys and /dev of the chroot vanish with it and
# never propagate to this machine's own mounts.
set +e
unshare --mount --propagation private bash -euc '
  base="$1" work="$2"; shift 2
  root="$work/root"
  mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/work" "$root"
  mount -t proc proc "$root/proc"
  mount -t sysfs sys "$root/sys"
  mount --rbind /dev "$root/dev"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # This workplace reaches PyPI through a TLS proxy whose CA is in the machine'"'"'s bundle: a
  # fresh machine here has it too, so the root gets the same bundle (and nothing else).
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/dtrain-machine-ca.crt"
  exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/dtrain-machine-ca.crt SSL_CERT_FILE=/etc/dtrain-machine-ca.crt \
    bash -c "cd /root/dtrain && bash scripts/run_main.sh \"\$@\"" run_main "$@"
' first_run "$base" "$work" "$@" 2>&1 |
  while IFS= read -r line; do printf '[%4ds] %s\n' $(($(date +%s) - start)) "$line"; done
rc=${PIPESTATUS[0]}
set -e
echo "first_run: run_main.sh exited $rc after $(($(date +%s) - start)) s" \
     "(load average now $(cut -d' ' -f1-3 /proc/loadavg))"
exit "$rc"
