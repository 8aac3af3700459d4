# Test clusters on one machine: network namespaces as hosts, with the real daemons.
# Sourced by the tests in this directory (bash, as root). Facts behind it: ../shared/CLUSTERS.md.
#
#   cluster_init               temp dir $T, unique names, `trap cluster_down EXIT`
#   hosts_up                   namespaces $NS1 $NS2 = hosts n1 (10.200.0.1), n2 (10.200.0.2),
#                              each with its end of a veth pair named eth0
#   on HOST CMD...             runs CMD "on" host n1/n2: its network, its hostname, its /etc/hosts
#   bg_on HOST LOG CMD...      the same in the background; the PID is recorded for cluster_down
#   munge_up; slurm_up         munged on a private socket; slurmctld on n1, slurmd on n1 and n2
#   sshd_up                    sshd on n1 and n2 (port 2222 of each), client config $SSH_CONFIG,
#                              key $SSH_KEY, and $SSH_WRAPPER (ssh with all of them)
#   cluster_down               stops every process started here (by PID, and whatever is left
#                              in our namespaces), deletes the namespaces and $T
#
# Traffic to 10.200.0.x only ever goes from inside the namespaces. Every wait has a deadline.
set -uo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pass() { echo "ok: $*"; }

require() {
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || fail "missing '$c': run scripts/setup.sh (it installs the cluster packages)"
  done
}

cluster_init() {
  [[ $(id -u) -eq 0 ]] || fail "the cluster tests need root (network namespaces, daemons)"
  require ip nsenter unshare ss
  T="$(mktemp -d /tmp/dtrain-cluster.XXXXXX)"
  chmod 755 "$T"
  ID="$$"
  NS1="dtc${ID}a"
  NS2="dtc${ID}b"
  PIDS=()
  NS_CREATED=()
  trap cluster_down EXIT
  trap 'exit 130' INT TERM
}

hosts_up() {
  ip netns add "$NS1" || fail "ip netns add $NS1"
  NS_CREATED+=("$NS1")
  ip netns add "$NS2" || fail "ip netns add $NS2"
  NS_CREATED+=("$NS2")
  local va="vdt${ID}a" vb="vdt${ID}b"
  ip link add "$va" type veth peer name "$vb" || fail "ip link add veth"
  ip link set "$va" netns "$NS1" && ip link set "$vb" netns "$NS2" || fail "moving veth"
  for ns in "$NS1" "$NS2"; do ip -n "$ns" link set lo up; done
  # Inside its namespace each end is "eth0", as on real hosts, so one --ifname fits both.
  ip -n "$NS1" link set "$va" name eth0
  ip -n "$NS2" link set "$vb" name eth0
  ip -n "$NS1" addr add 10.200.0.1/24 dev eth0
  ip -n "$NS2" addr add 10.200.0.2/24 dev eth0
  ip -n "$NS1" link set eth0 up
  ip -n "$NS2" link set eth0 up
  printf '127.0.0.1 localhost\n10.200.0.1 n1\n10.200.0.2 n2\n' >"$T/hosts"
  chmod 644 "$T/hosts"
}

ns_of() {
  case "$1" in
    n1) echo "$NS1" ;;
    n2) echo "$NS2" ;;
    *) fail "unknown test host '$1'" ;;
  esac
}

# Not `ip netns exec`: it remounts /sys, and slurmd then fails on the missing cgroup mount.
# Sets ON to the command prefix that runs a command on HOST (every step execs the next).
on_prefix() {
  ON=(nsenter --net="/run/netns/$(ns_of "$1")" unshare --uts --mount
    sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$T/hosts" "$1")
}

on() {
  local host="$1"
  shift
  on_prefix "$host"
  "${ON[@]}" "$@"
}

# bg_on HOST LOG CMD...: in the background; $BG_PID is CMD's own PID (the subshell execs
# nsenter, which execs down to CMD), so a signal to it reaches CMD itself.
bg_on() {
  local host="$1" log="$2"
  shift 2
  on_prefix "$host"
  (exec "${ON[@]}" "$@" >"$log" 2>&1 </dev/null) &
  BG_PID=$!
  PIDS+=("$BG_PID")
}

# wait_listen HOST PORT SECONDS: polls `ss -ltn` inside the host's namespace.
wait_listen() {
  local ns deadline
  ns="$(ns_of "$1")"
  deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    ip netns exec "$ns" ss -ltnH "sport = :$2" 2>/dev/null | grep -q LISTEN && return 0
    sleep 0.1
  done
  return 1
}

munge_up() {
  require munged
  [[ -r /etc/munge/munge.key ]] || fail "/etc/munge/munge.key is missing: reinstall the munge package"
  install -d -o munge -g munge -m 755 "$T/munge"
  MUNGE_SOCKET="$T/munge/munge.socket"
  runuser -u munge -- /usr/sbin/munged -F --socket="$MUNGE_SOCKET" --pid-file="$T/munge/munged.pid" \
    --log-file="$T/munge/munged.log" --seed-file="$T/munge/munged.seed" >"$T/munge/out.log" 2>&1 </dev/null &
  PIDS+=("$!")
  local deadline=$((SECONDS + 10))
  until [[ -S "$MUNGE_SOCKET" ]]; do
    ((SECONDS < deadline)) || fail "munged did not start: $(cat "$T/munge/out.log" "$T/munge/munged.log" 2>/dev/null)"
    sleep 0.05
  done
}

slurm_up() {
  require slurmctld slurmd srun sinfo scontrol scancel sbatch
  munge_up
  local s="$T/slurm"
  mkdir -p "$s/state" "$s/spool/n1" "$s/spool/n2"
  export SLURM_CONF="$s/slurm.conf"
  cat >"$SLURM_CONF" <<EOF
ClusterName=dtraintest
SlurmctldHost=n1(10.200.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
KillWait=3
MessageTimeout=10
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool/%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.%n.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd.%n.log
NodeName=n1 NodeAddr=10.200.0.1 CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=10.200.0.2 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  bg_on n1 "$s/slurmctld.out" slurmctld -D -c -f "$SLURM_CONF"
  wait_listen n1 6817 20 || fail "slurmctld did not listen: $(cat "$s/slurmctld.out" "$s/slurmctld.log" 2>/dev/null | tail -20)"
  bg_on n1 "$s/slurmd.n1.out" slurmd -D -N n1 -f "$SLURM_CONF"
  bg_on n2 "$s/slurmd.n2.out" slurmd -D -N n2 -f "$SLURM_CONF"
  local deadline=$((SECONDS + 30)) states=""
  while ((SECONDS < deadline)); do
    states="$(on n1 sinfo -h -N -o '%N=%T' 2>&1 | sort -u | tr '\n' ' ')"
    [[ "$states" == "n1=idle n2=idle " ]] && return 0
    sleep 0.2
  done
  fail "Slurm nodes not idle after 30 s (sinfo: $states); logs: $(tail -5 "$s"/slurm*.log 2>/dev/null)"
}

sshd_up() {
  require sshd ssh ssh-keygen
  local d="$T/ssh"
  mkdir -p "$d" /run/sshd
  chmod 700 "$d"
  ssh-keygen -q -t ed25519 -N '' -f "$d/host_key" || fail "ssh-keygen host key"
  ssh-keygen -q -t ed25519 -N '' -f "$d/id" || fail "ssh-keygen client key"
  cp "$d/id.pub" "$d/authorized_keys"
  # Port and key are not in the config: the tests pass them (--ssh-port, --ssh-identity);
  # $T/ssh/ssh is a wrapper with everything, for the MPI launchers.
  cat >"$d/config" <<EOF
Host *
  User root
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile $d/known_hosts
  LogLevel ERROR
  ConnectTimeout 10
EOF
  for h in n1 n2; do
    local addr=10.200.0.1
    [[ $h == n2 ]] && addr=10.200.0.2
    cat >"$d/sshd_$h.conf" <<EOF
Port 2222
ListenAddress $addr
HostKey $d/host_key
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $d/sshd_$h.pid
EOF
    /usr/sbin/sshd -t -f "$d/sshd_$h.conf" || fail "sshd -t rejected $d/sshd_$h.conf"
    bg_on "$h" "$d/sshd_$h.log" /usr/sbin/sshd -D -e -f "$d/sshd_$h.conf"
  done
  wait_listen n1 2222 10 || fail "sshd on n1 did not listen: $(cat "$d/sshd_n1.log")"
  wait_listen n2 2222 10 || fail "sshd on n2 did not listen: $(cat "$d/sshd_n2.log")"
  SSH_CONFIG="$d/config"
  SSH_KEY="$d/id"
  SSH_PORT=2222
  printf '#!/bin/sh\nexec ssh -F %s -p 2222 -i %s "$@"\n' "$d/config" "$d/id" >"$d/ssh"
  chmod 755 "$d/ssh"
  SSH_WRAPPER="$d/ssh"
}

# Processes (other than the daemons) still running in a host's namespace whose command line
# contains PATTERN.
leftovers() {
  local host="$1" pattern="$2" ns pid out=""
  ns="$(ns_of "$host")"
  for pid in $(ip netns pids "$ns" 2>/dev/null); do
    [[ -r /proc/$pid/cmdline ]] || continue
    local cmd
    cmd="$(tr '\0' ' ' </proc/"$pid"/cmdline)"
    [[ "$cmd" == *"$pattern"* ]] && out+="$pid:$cmd; "
  done
  echo "$out"
}

# wait_gone HOST PATTERN SECONDS: true once no process matching PATTERN runs on HOST.
wait_gone() {
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    [[ -z "$(leftovers "$1" "$2")" ]] && return 0
    sleep 0.1
  done
  return 1
}

# nothing_left WHAT DRIVER: fails, naming WHAT and what is left, unless within 15 s no process
# of the DRIVER binary and no dtrain agent ($DTRAIN) runs on n1 or n2.
nothing_left() {
  local what="$1" driver="$2" h
  for h in n1 n2; do
    wait_gone "$h" "$driver" 15 || fail "$what: processes left on $h: $(leftovers "$h" "$driver")"
    wait_gone "$h" "$DTRAIN" 15 || fail "$what: agents left on $h: $(leftovers "$h" "$DTRAIN")"
  done
}

cluster_down() {
  local rc=$?
  trap - EXIT
  # The daemons we started, by PID; then anything left in our namespaces (job steps,
  # workers, sshd sessions), by PID.
  local mpid=""
  [[ -n "${T:-}" && -r "$T/munge/munged.pid" ]] && mpid="$(cat "$T/munge/munged.pid")"
  for p in "${PIDS[@]}" $mpid; do kill -TERM "$p" 2>/dev/null; done
  local deadline=$((SECONDS + 5))
  for p in "${PIDS[@]}"; do
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  if [[ -n "$mpid" ]]; then
    while kill -0 "$mpid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
    kill -KILL "$mpid" 2>/dev/null
  fi
  for ns in "${NS_CREATED[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for ns in "${NS_CREATED[@]}"; do
    local t=$((SECONDS + 5))
    while [[ -n "$(ip netns pids "$ns" 2>/dev/null)" ]] && ((SECONDS < t)); do sleep 0.05; done
    ip netns del "$ns" 2>/dev/null
  done
  if [[ $rc -ne 0 && -n "${T:-}" ]]; then
    echo "--- daemon logs ($T) ---" >&2
    tail -n 15 "$T"/slurm/*.log "$T"/slurm/*.out "$T"/ssh/*.log 2>/dev/null >&2
  fi
  [[ -n "${T:-}" ]] && rm -rf "$T"
  exit "$rc"
}
