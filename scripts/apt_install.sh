#!/usr/bin/env bash
# Installs Debian packages with apt-get, saying how many (with their dependencies) and how much
# it downloads, then a progress line every 10% of the download and of the installation instead
# of apt's page of output (kept in a log, printed when apt fails).
#   scripts/apt_install.sh PACKAGE...      (as root)
set -euo pipefail
(($#)) || { echo "usage: apt_install.sh PACKAGE..." >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp /tmp/dtrain-apt.XXXXXX.log)"
fail() {
  echo "apt: $1 (apt's output follows; the log is $log)" >&2
  tail -n 40 "$log" >&2
  exit 1
}
echo "apt: reading the package lists (apt-get update)"
apt-get update -q >"$log" 2>&1 || fail "apt-get update failed: check the network and /etc/apt/sources.list"
plan="$(apt-get install -s --no-install-recommends "$@" 2>>"$log")" ||
  fail "apt cannot install $*: a name is wrong, or the lists are stale"
count="$(grep -c '^Inst ' <<<"$plan" || true)"
size="$(apt-get install --print-uris -qq --no-install-recommends "$@" 2>>"$log" |
        awk '{s += $3} END {printf "%.0f", s / 1e6}')"
echo "apt: installing $# packages, $count with their dependencies ($size MB to download): $*"
# apt reports its progress on APT::Status-Fd as "dlstatus:N:PERCENT:..." and "pmstatus:...".
set +e
apt-get install -y -q --no-install-recommends -o APT::Status-Fd=3 "$@" 3>&1 >>"$log" 2>&1 |
  awk -F: '
    /^(dl|pm)status:/ {
      phase = ($1 == "dlstatus") ? "downloading" : "installing"
      p = int($3 / 10) * 10
      if (phase != last_phase || p > last) {
        printf "apt: %s %d%%\n", phase, p; fflush(); last = p; last_phase = phase
      }
    }'
rc="${PIPESTATUS[0]}"
set -e
((rc == 0)) || fail "apt-get install failed (exit $rc)"
rm -f "$log"
echo "apt: done"
