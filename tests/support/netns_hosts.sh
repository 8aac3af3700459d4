# Hosts on one machine for the cluster tests and benchmarks: network namespaces n0, n1, ... on
# a switch (a bridge in a namespace of its own, so that nothing of this network touches the
# machine's own: no interface, no route outside the namespaces), each with its own eth0, its
# own hostname and an /etc/hosts naming every host. Sourced (bash, as root) after `fail` is
# defined; the caller sets ID (names are made unique with it) and T (a temp dir for /etc/hosts).
#
#   netns_hosts_up TAG SUBNET HOST...   namespaces ${TAG}${ID}<host> and ${TAG}${ID}br; host nK
#                                       gets SUBNET.(10+K) (netns_hosts_up dts 10.201.0 n0 n1 n2)
#   host_addr HOST                      its address
#   on HOST CMD...                      runs CMD on HOST (its network, hostname, /etc/hosts)
#   bg_on HOST LOG CMD...               the same in the background; $BG_PID is CMD's own PID
#   host_procs HOST REGEX               "PID:ARGS; " of the processes on HOST whose command line
#                                       matches REGEX
#   netns_hosts_down                    TERM, then KILL, whatever runs in the namespaces; deletes
#                                       them (their veths go with them); non-zero, saying what,
#                                       when a namespace or veth is left
# Namespaces of an earlier run killed before its clean-up (a ctest timeout) are removed by the
# next netns_hosts_up with the same TAG. Every wait has a deadline.

NETNS_CREATED=()
NETNS_TAG=""
NETNS_SUBNET=""

host_addr() {
  [[ "$1" =~ ^n([0-9])$ ]] || fail "unknown test host '$1' (n0, n1, ...)"
  echo "$NETNS_SUBNET.$((10 + BASH_REMATCH[1]))"
}

netns_hosts_up() {
  local tag="$1" subnet="$2" h
  shift 2
  NETNS_TAG="$tag" NETNS_SUBNET="$subnet"
  [[ $(id -u) -eq 0 ]] || fail "the cluster test needs root (network namespaces as hosts)"
  for c in ip nsenter unshare ss; do
    command -v "$c" >/dev/null 2>&1 || fail "missing '$c': run scripts/setup.sh (iproute2, util-linux)"
  done
  local stale
  for stale in $(ip netns list 2>/dev/null | grep -oE "^${tag}[0-9]+(n[0-9]|br)\b"); do
    local owner="${stale#"$tag"}"
    owner="${owner%n[0-9]}"
    owner="${owner%br}"
    kill -0 "$owner" 2>/dev/null && continue
    echo "removing the namespace $stale of an earlier run (process $owner is gone)" >&2
    for pid in $(ip netns pids "$stale" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$stale" 2>/dev/null
  done
  local br="${tag}${ID}br"
  ip netns add "$br" || fail "ip netns add $br"
  NETNS_CREATED+=("$br")
  ip -n "$br" link add br0 type bridge || fail "ip link add bridge"
  ip -n "$br" link set br0 up
  ip -n "$br" link set lo up
  printf '127.0.0.1 localhost\n' >"$T/hosts"
  for h in "$@"; do
    local ns="${tag}${ID}$h" a="${tag}${ID}${h}a" b="${tag}${ID}${h}b" addr
    addr="$(host_addr "$h")"
    ip netns add "$ns" || fail "ip netns add $ns"
    NETNS_CREATED+=("$ns")
    ip link add "$a" type veth peer name "$b" || fail "ip link add veth $a"
    ip link set "$a" netns "$ns" && ip link set "$b" netns "$br" || fail "moving veth $a"
    ip -n "$ns" link set "$a" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$br" link set "$b" master br0
    ip -n "$br" link set "$b" up
    printf '%s %s\n' "$addr" "$h" >>"$T/hosts"
  done
  chmod 644 "$T/hosts"
}

# Not `ip netns exec` (it remounts /sys): nsenter into the host's network, then a UTS and
# mount namespace of the command's own for the hostname and /etc/hosts.
on_prefix() {
  host_addr "$1" >/dev/null
  ON=(nsenter --net="/run/netns/${NETNS_TAG}${ID}$1" unshare --uts --mount
    sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$T/hosts" "$1")
}

on() {
  local host="$1"
  shift
  on_prefix "$host"
  "${ON[@]}" "$@"
}

bg_on() {
  local host="$1" log="$2"
  shift 2
  on_prefix "$host"
  (exec "${ON[@]}" "$@" >"$log" 2>&1 </dev/null) &
  BG_PID=$!
}

host_procs() {
  local pid cmd out=""
  for pid in $(ip netns pids "${NETNS_TAG}${ID}$1" 2>/dev/null); do
    cmd="$( { tr '\0' ' ' </proc/"$pid"/cmdline; } 2>/dev/null)" || continue
    [[ "$cmd" =~ $2 ]] && out+="$pid:$cmd; "
  done
  echo "$out"
}

netns_hosts_down() {
  ((${#NETNS_CREATED[@]})) || return 0
  local ns pid deadline left
  for ns in "${NETNS_CREATED[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
  done
  deadline=$((SECONDS + 10))
  for ns in "${NETNS_CREATED[@]}"; do
    while [[ -n "$(ip netns pids "$ns" 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.2; done
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in "${NETNS_CREATED[@]}"; do
    deadline=$((SECONDS + 5))
    while [[ -n "$(ip netns pids "$ns" 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.1; done
    ip netns del "$ns" 2>/dev/null
  done
  NETNS_CREATED=()
  left="$(ip netns list 2>/dev/null | grep -E "^${NETNS_TAG}${ID}(n[0-9]|br)( |$)" || true)"
  left+="$(ip -o link show 2>/dev/null | grep -E "${NETNS_TAG}${ID}n[0-9][ab]" || true)"
  if [[ -n "$left" ]]; then
    echo "FAIL: namespaces or veths left after the hosts were torn down: $left" >&2
    return 1
  fi
}
