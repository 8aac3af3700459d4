# Sourced by the install-route tests: a clean Debian 12 root to install into and run in.
#   debian_root_base                 the base root's path; made once with debootstrap (Debian's
#                                    base system, git, ca-certificates), then never changed
#   in_debian_root WORK [--apt-cache] -- COMMAND...
#                                    runs COMMAND (bash -c) as root inside an overlay of the base
#                                    (its changes go to WORK/upper, put files there first), in a
#                                    private mount namespace: nothing it mounts reaches this
#                                    machine's mounts, and all of it is gone when it returns.
#                                    --apt-cache keeps apt's downloads and lists between runs
#                                    (in $DTRAIN_CACHE/apt), as a machine's own apt does.
# The root gets this machine's CA bundle (this workplace reaches PyPI through a TLS proxy whose
# CA is in it; a fresh machine here has it too) and resolv.conf, and nothing else of it.
DTRAIN_CACHE="${DTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain}"

debian_root_base() {
  local base="${DTRAIN_DEBIAN_ROOT:-$DTRAIN_CACHE/debian12-root}"
  if [[ ! -x "$base/usr/bin/git" ]]; then
    command -v debootstrap >/dev/null ||
      { echo "debian_root: debootstrap is missing: scripts/setup.sh installs it" >&2; return 1; }
    echo "debian_root: making $base (debootstrap bookworm, once; ~2 min)" >&2
    rm -rf "$base.tmp"
    debootstrap --include=ca-certificates,git bookworm "$base.tmp" http://deb.debian.org/debian \
      >"$DTRAIN_CACHE/debootstrap.log" 2>&1 ||
      { tail -n 20 "$DTRAIN_CACHE/debootstrap.log" >&2; return 1; }
    mv "$base.tmp" "$base"
  fi
  echo "$base"
}

in_debian_root() {
  local work="$1" apt_cache=0
  shift
  [[ "${1:-}" == --apt-cache ]] && { apt_cache=1; shift; }
  [[ "${1:-}" == -- ]] && shift
  local base
  base="$(debian_root_base)" || return 1
  mkdir -p "$work/upper" "$work/work" "$work/root" "$DTRAIN_CACHE/apt/archives" "$DTRAIN_CACHE/apt/lists"
  unshare --mount --propagation private bash -euc '
    base="$1" work="$2" apt_cache="$3" cache="$4"; shift 4
    root="$work/root"
    mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/work" "$root"
    mount -t proc proc "$root/proc"
    mount -t sysfs sys "$root/sys"
    mount --rbind /dev "$root/dev"
    if ((apt_cache)); then
      mount --bind "$cache/apt/archives" "$root/var/cache/apt/archives"
      mount --bind "$cache/apt/lists" "$root/var/lib/apt/lists"
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/dtrain-machine-ca.crt"
    exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      PIP_CERT=/etc/dtrain-machine-ca.crt SSL_CERT_FILE=/etc/dtrain-machine-ca.crt \
      DEBIAN_FRONTEND=noninteractive bash -euc "$@"
  ' in_debian_root "$base" "$work" "$apt_cache" "$DTRAIN_CACHE" "$@"
}
