# A real Ray cluster of separate hosts for the ray tests and benchmark: the head on n0
# (10.202.0.10: the GCS and the drivers, 0 CPUs, as a Databricks driver node), and a worker node
# on n1 (10.202.0.11) and n2 (10.202.0.12), network namespaces (tests/support/netns_hosts.sh),
# each node started by `ray start` of the venv's pinned ray with its own temp dir. Kept small for
# a 2-core machine: no dashboard, no usage stats, a 100 MB object store. Sourced (bash, root).
#
#   ray_init                 temp dir $T, `trap ray_down EXIT`; $PY the venv's python; fails when
#                            ray is missing
#   ray_hosts_up [CPUS [HOST...]]
#                            the head on n0 and a worker node of CPUS (default 2) on each HOST
#                            (default n1 n2; the namespaces n0-n2 are made either way); sets
#                            $RAY_GCS (10.202.0.10:6379) once every node is alive
#   ray_node_up HOST CPUS    one more worker node, on a host that has none yet; returns once it
#                            is alive in the cluster
#   RAY_NODE_GPUS=N          set before ray_hosts_up / ray_node_up: the worker nodes declare N
#                            GPUs (`ray start --num-gpus`; unset: Ray counts the host's own)
#   on, bg_on, host_procs    netns_hosts.sh's
#   ray_down                 kills whatever runs in the namespaces (by PID), deletes them,
#                            checks nothing of ours is left, deletes $T
# Every wait has a deadline.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/netns_hosts.sh"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pass() { echo "ok: $*"; }

ray_init() {
  PY="${DTRAIN_VENV_PYTHON:-${DTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/venv}/bin/python}"
  [[ -x "$PY" ]] || fail "no venv python at $PY: run scripts/python_env.sh (DTRAIN_VENV)"
  RAY="$(dirname "$PY")/ray"
  [[ -x "$RAY" ]] && "$PY" -c 'import ray' 2>/dev/null ||
    fail "ray is missing in $PY: pip install -r scripts/requirements.txt (ray[tune])"
  T="$(mktemp -d /tmp/dtrain-ray.XXXXXX)"
  chmod 755 "$T"
  mkdir -p "$T/logs"
  ID="$$"
  trap ray_down EXIT
  trap 'exit 130' INT TERM
}

# The nodes' settings; the drivers the tests start inherit the same ones.
# Token authentication off, explicitly: with RAY_AUTH_MODE unset, Ray 2.60's head turns it on
# whenever ~/.ray/auth_token exists (any local ray.init() on this machine writes one), and the
# worker nodes then fail to join ("InvalidAuthToken"). The test cluster lives in namespaces of
# its own.
ray_env() {
  export RAY_USAGE_STATS_ENABLED=0 RAY_DISABLE_DOCKER_CPU_WARNING=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
  export RAY_AUTH_MODE=disabled
  export PATH="$(dirname "$PY"):$PATH"
}

ray_hosts_up() {
  local cpus="${1:-2}" h
  local hosts=("${@:2}")
  ((${#hosts[@]})) || hosts=(n1 n2)
  netns_hosts_up dtr 10.202.0 n0 n1 n2
  ray_env
  RAY_GCS="$(host_addr n0):6379"
  RAY_NODE_PIDS=() RAY_ALIVE="$(host_addr n0)"
  mkdir -p "$T/ray/n0"
  bg_on n0 "$T/logs/head.out" "$RAY" start --head --node-ip-address="$(host_addr n0)" --port=6379 \
    --num-cpus=0 --include-dashboard=false --temp-dir="$T/ray/n0" "${RAY_COMMON[@]}"
  RAY_NODE_PIDS+=("$BG_PID")
  for h in "${hosts[@]}"; do ray_node_start "$h" "$cpus"; done
  ray_wait_alive
  pass "Ray head on n0 ($RAY_GCS, 0 CPUs), worker nodes on ${hosts[*]} x $cpus CPUs"
}

RAY_COMMON=(--disable-usage-stats --object-store-memory=100000000 --block)

ray_node_start() {
  local h="$1" cpus="$2"
  mkdir -p "$T/ray/$h"
  bg_on "$h" "$T/logs/$h.out" "$RAY" start --address="$RAY_GCS" --node-ip-address="$(host_addr "$h")" \
    --num-cpus="$cpus" ${RAY_NODE_GPUS:+--num-gpus="$RAY_NODE_GPUS"} --temp-dir="$T/ray/$h" \
    "${RAY_COMMON[@]}"
  RAY_NODE_PIDS+=("$BG_PID")
  RAY_ALIVE="$(tr ' ' '\n' <<<"$RAY_ALIVE $(host_addr "$h")" | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//')"
}

ray_node_up() {
  ray_node_start "$1" "$2"
  ray_wait_alive
  pass "Ray worker node on $1 x $2 CPUs joined the cluster"
}

# One driver on n0 waits until the alive nodes are exactly $RAY_ALIVE (ray.nodes(), public
# API), up to 120 s; a node whose `ray start` exits fails it at once.
ray_wait_alive() {
  cat >"$T/probe.py" <<'PY'
import sys, time
import ray
deadline = time.monotonic() + 120
while True:
    try:
        ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
        break
    except Exception as e:  # the GCS is not up yet
        if time.monotonic() > deadline:
            sys.exit("no Ray GCS at %s within 120 s: %s" % (sys.argv[1], e))
        time.sleep(1)
while True:
    alive = " ".join(sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]))
    if alive == sys.argv[2]:
        break
    if time.monotonic() > deadline:
        sys.exit("alive Ray nodes after 120 s: '%s', expected '%s'" % (alive, sys.argv[2]))
    time.sleep(0.5)
PY
  bg_on n0 "$T/logs/probe.out" timeout 150 "$PY" "$T/probe.py" "$RAY_GCS" "$RAY_ALIVE"
  local probe=$BG_PID p
  while kill -0 "$probe" 2>/dev/null; do
    for p in "${RAY_NODE_PIDS[@]}"; do
      kill -0 "$p" 2>/dev/null || { kill -KILL "$probe"; tail -n 20 "$T"/logs/*.out >&2; fail "a Ray node exited while starting"; }
    done
    sleep 0.5
  done
  wait "$probe" || { tail -n 20 "$T"/logs/*.out >&2; fail "the Ray nodes $RAY_ALIVE did not come up"; }
}

ray_down() {
  local rc=$?
  trap - EXIT
  # Every Ray process runs in the namespaces: TERM, then KILL, by PID. Not `ray stop`: it
  # kills every Ray process of the machine by name, other users' too.
  netns_hosts_down || rc=1
  wait 2>/dev/null
  if ((rc != 0)) && [[ -n "${T:-}" && -d "$T/logs" ]]; then
    echo "--- Ray node logs ($T) ---" >&2
    tail -n 15 "$T"/logs/*.out >&2 2>/dev/null
  fi
  if [[ -n "${T:-}" ]] && pgrep -f "$T" >/dev/null 2>&1; then
    echo "FAIL: processes left after the Ray cluster was stopped:" >&2
    pgrep -af "$T" >&2
    for pid in $(pgrep -f "$T"); do kill -KILL "$pid" 2>/dev/null; done
    rc=1
  fi
  [[ -n "${T:-}" ]] && rm -rf "$T"
  exit "$rc"
}
