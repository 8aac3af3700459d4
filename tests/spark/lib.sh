# A real Spark standalone cluster on loopback for the spark tests: a master and two workers
# (java from Debian's openjdk-17, Spark's jars from the venv's pyspark), each a separate JVM
# with its own work and local dirs under $T. Sourced (bash).
#
#   spark_init            temp dir $T, `trap spark_down EXIT`; fails when java or pyspark is missing
#   spark_up [CORES]      master + 2 workers (CORES each, default 2); sets $SPARK_MASTER_URL
#   spark_down            stops every JVM started here and every dtrain process left under
#                         them, checks nothing is left, deletes $T
#
# The same cluster as separate hosts (root; network namespaces, tests/support/netns_hosts.sh):
# the hosts n0 (10.201.0.10: the master and the driver, as a Databricks driver node), n1
# (10.201.0.11) and n2 (10.201.0.12: the two workers).
#   spark_hosts_up [CORES] [WORKERS]   namespaces + master on n0 + a worker on each of
#                            WORKERS (default "n1 n2"; CORES each); sets $SPARK_MASTER_URL
#                            (spark://10.201.0.10:7077)
#   spark_worker_up HOST CORES   one more worker (on n1 or n2), registered
#   on, bg_on, host_procs    netns_hosts.sh's
#   spark_down               also kills whatever runs in the namespaces, deletes them (their
#                            veths go with them) and checks none is left
# Every wait has a deadline.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/netns_hosts.sh"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pass() { echo "ok: $*"; }

spark_init() {
  # The venv of this build (ctest passes the build's DTRAIN_VENV_PYTHON), else python_env.sh's.
  PY="${DTRAIN_VENV_PYTHON:-${DTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/venv}/bin/python}"
  command -v java >/dev/null 2>&1 || fail "java is missing: scripts/setup.sh installs openjdk-17-jre-headless"
  [[ -x "$PY" ]] || fail "no venv python at $PY: run scripts/python_env.sh (DTRAIN_VENV)"
  SPARK_HOME="$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" ||
    fail "pyspark is missing in $PY: pip install -r scripts/requirements.txt"
  export SPARK_HOME PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY"
  export PATH="$(dirname "$PY"):$PATH"
  T="$(mktemp -d /tmp/dtrain-spark.XXXXXX)"
  export SPARK_LOG_DIR="$T/logs" SPARK_LOCAL_DIRS="$T/local" SPARK_WORKER_DIR="$T/work"
  export SPARK_CONF_DIR="$T/conf" SPARK_PID_DIR="$T/pids" SPARK_LOCAL_IP=127.0.0.1
  mkdir -p "$SPARK_LOG_DIR" "$SPARK_LOCAL_DIRS" "$SPARK_WORKER_DIR" "$SPARK_CONF_DIR" "$SPARK_PID_DIR"
  printf 'rootLogger.level = warn\nrootLogger.appenderRef.stdout.ref = console\nappender.console.type = Console\nappender.console.name = console\nappender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\nappender.console.layout.pattern = %%d{HH:mm:ss} %%p %%c{1}: %%m%%n\nlogger.master.name = org.apache.spark.deploy.master.Master\nlogger.master.level = info\n' >"$SPARK_CONF_DIR/log4j2.properties"
  # Applications here: no web UI (a second or two of JVM start-up each), driver on loopback.
  printf 'spark.ui.enabled false\nspark.driver.host 127.0.0.1\n' >"$SPARK_CONF_DIR/spark-defaults.conf"
  SPARK_PIDS=()
  ID="$$"
  trap spark_down EXIT
  trap 'exit 130' INT TERM
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

spark_up() {
  local cores="${1:-2}" port web i
  port="$(free_port)"
  web="$(free_port)"
  "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master --host 127.0.0.1 \
    --port "$port" --webui-port "$web" >"$T/logs/master.out" 2>&1 &
  SPARK_PIDS+=($!)
  SPARK_MASTER_URL="spark://127.0.0.1:$port"
  for i in 1 2; do
    mkdir -p "$T/work/$i"
    SPARK_LOCAL_DIRS="$T/local/$i" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --webui-port "$(free_port)" --cores "$cores" --memory 2g \
      --work-dir "$T/work/$i" "$SPARK_MASTER_URL" >"$T/logs/worker$i.out" 2>&1 &
    SPARK_PIDS+=($!)
  done
  # Both workers registered (the master logs each), within 90 s.
  local deadline=$((SECONDS + 90))
  while (($(grep -c "Registering worker" "$T/logs/master.out" 2>/dev/null || true) < 2)); do
    ((SECONDS < deadline)) || { tail -n 20 "$T"/logs/*.out >&2; fail "the Spark workers did not register with the master within 90 s"; }
    sleep 0.5
  done
  pass "Spark standalone master $SPARK_MASTER_URL + 2 workers x $cores cores"
}

# Every process whose parent chain leads to one of ours.
descendants() {
  local p
  for p in "$@"; do
    local kids
    kids="$(pgrep -P "$p" 2>/dev/null || true)"
    [[ -n "$kids" ]] && { echo "$kids"; descendants $kids; }
  done
}

spark_down() {
  local rc=$? left pid ns
  trap - EXIT
  # The hosts: every process in their namespaces (the daemons, their executors, drivers,
  # agents), TERM then KILL; then the namespaces themselves.
  # Reap what ran in the namespaces; not with daemons on loopback (spark_up): a bare `wait`
  # would wait for them, still running, forever.
  local had_hosts=${#NETNS_CREATED[@]}
  netns_hosts_down || rc=1
  ((had_hosts && !${#SPARK_PIDS[@]})) && wait 2>/dev/null
  if ((rc != 0)) && [[ -n "${T:-}" && -d "$T/logs" ]]; then
    echo "--- Spark daemon logs ($T/logs) ---" >&2
    tail -n 15 "$T"/logs/*.out >&2 2>/dev/null
  fi
  if ((${#SPARK_PIDS[@]})); then
    left="$(descendants "${SPARK_PIDS[@]}")"
    kill -TERM "${SPARK_PIDS[@]}" $left 2>/dev/null
    local deadline=$((SECONDS + 20))
    for pid in "${SPARK_PIDS[@]}" $left; do
      while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
      kill -KILL "$pid" 2>/dev/null
    done
    wait 2>/dev/null
  fi
  # Nothing of ours is left: no JVM with our temp dir, no process started from it.
  if [[ -n "${T:-}" ]] && pgrep -f "$T" >/dev/null 2>&1; then
    echo "FAIL: processes left after the Spark cluster was stopped:" >&2
    pgrep -af "$T" >&2
    for pid in $(pgrep -f "$T"); do kill -KILL "$pid" 2>/dev/null; done
    rm -rf "$T"
    exit 1
  fi
  [[ -n "${T:-}" ]] && rm -rf "$T"
  exit "$rc"
}

# --- the cluster as separate hosts (network namespaces) ------------------------------------

spark_hosts_up() {
  local cores="${1:-2}" workers="${2-n1 n2}" h
  netns_hosts_up dts 10.201.0 n0 n1 n2
  # Daemons' settings as each host's spark-env.sh would give them; no loopback driver host.
  # JVMs on 2 shared cores: the client compiler only and the serial collector start them
  # faster (no C2 or parallel GC threads competing with the training processes).
  local jvm="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
  export SPARK_DAEMON_JAVA_OPTS="$jvm" SPARK_LAUNCHER_OPTS="$jvm"
  printf 'spark.ui.enabled false\nspark.driver.extraJavaOptions %s\nspark.executor.extraJavaOptions %s\n' "$jvm" "$jvm" \
    >"$SPARK_CONF_DIR/spark-defaults.conf"
  unset SPARK_LOCAL_IP
  local port=7077 m
  m="$(host_addr n0)"
  SPARK_MASTER_URL="spark://$m:$port"
  bg_on n0 "$T/logs/master.out" env SPARK_LOCAL_IP="$m" \
    "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master --host "$m" --port "$port" --webui-port 8080
  SPARK_PIDS+=("$BG_PID")
  for h in $workers; do spark_worker_start "$h" "$cores"; done
  for h in $workers; do spark_worker_registered "$h"; done
  pass "Spark standalone master on n0 ($SPARK_MASTER_URL), workers on $(for h in $workers; do printf '%s (%s) ' "$h" "$(host_addr "$h")"; done)x $cores cores"
}

# A worker on HOST (n1, n2) of CORES cores, with the master of spark_hosts_up, registered
# (spark_worker_start, then spark_worker_registered: a worker joins a running cluster).
spark_worker_up() {
  spark_worker_start "$1" "$2"
  spark_worker_registered "$1"
  pass "Spark worker on $1 ($(host_addr "$1")) x $2 cores registered"
}

spark_worker_start() {
  local h="$1" cores="$2"
  mkdir -p "$T/work/$h" "$T/local/$h"
  bg_on "$h" "$T/logs/worker-$h.out" env SPARK_LOCAL_IP="$(host_addr "$h")" SPARK_LOCAL_DIRS="$T/local/$h" \
    "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker --host "$(host_addr "$h")" \
    --webui-port 8081 --cores "$cores" --memory 2g --work-dir "$T/work/$h" "$SPARK_MASTER_URL"
  SPARK_PIDS+=("$BG_PID")
}

# Waits (at most 90 s) for the master to register HOST's worker at HOST's address.
spark_worker_registered() {
  local h="$1" pid deadline=$((SECONDS + 90))
  until grep -q "Registering worker $(host_addr "$h"):" "$T/logs/master.out" 2>/dev/null; do
    ((SECONDS < deadline)) || { tail -n 20 "$T"/logs/*.out >&2; fail "the Spark worker on $h did not register with the master on n0 at $(host_addr "$h") within 90 s"; }
    for pid in "${SPARK_PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { tail -n 20 "$T"/logs/*.out >&2; fail "a Spark daemon exited during start-up"; }
    done
    sleep 0.5
  done
}

# Waits (at most 30 s) until no process matching PATTERN is left on any of HOSTS; else fails
# with WHAT and what is left.
#   spark_hosts_clear WHAT PATTERN HOST...
spark_hosts_clear() {
  local what="$1" pattern="$2" h deadline=$((SECONDS + 30))
  shift 2
  for h in "$@"; do
    while [[ -n "$(host_procs "$h" "$pattern")" ]]; do
      ((SECONDS < deadline)) || fail "$what: processes left on $h: $(host_procs "$h" "$pattern")"
      sleep 0.3
    done
  done
}
