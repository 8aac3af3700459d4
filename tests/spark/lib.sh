# A real Spark standalone cluster on loopback for the spark tests: a master and two workers
# (java from Debian's openjdk-17, Spark's jars from the venv's pyspark), each a separate JVM
# with its own work and local dirs under $T. Sourced (bash).
#
#   spark_init            temp dir $T, `trap spark_down EXIT`; fails when java or pyspark is missing
#   spark_up [CORES]      master + 2 workers (CORES each, default 2); sets $SPARK_MASTER_URL
#   spark_down            stops every JVM started here and every dtrain process left under
#                         them, checks nothing is left, deletes $T
# Every wait has a deadline.
set -uo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pass() { echo "ok: $*"; }

spark_init() {
  PY="${DTRAIN_VENV:-/work/main/.venv}/bin/python"
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
  local left pid
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
}
