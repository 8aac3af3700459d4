#!/usr/bin/env bash
# The Spark engine on a real Spark standalone cluster (master + 2 workers x 2 cores on
# loopback, started once here): the C++ Distributor's function and program modes, a crash on
# the second node, too few slots, the driver SIGKILLed, `dtrain run --spark-master`, and the
# Python module dtrain.spark. Fails (never skips) when Java or pyspark is missing.
#   spark_test.sh BUILD_DIR DTRAIN SPARK_DRIVER PYTHON_DIR
source "$(dirname "$0")/lib.sh"
BUILD="$(realpath "$1")" DTRAIN="$(realpath "$2")" DRIVER="$(realpath "$3")" PYDIR="$(realpath "$4")"
export DTRAIN_LAUNCHER="$DTRAIN"
spark_init
spark_up 2
CONF="$T/driver.out"
t0=$SECONDS

# Our own processes on the workers: the dtrain agents and the driver's re-executed workers.
ours() { pgrep -f "^($DTRAIN|$DRIVER)( |$)" 2>/dev/null | grep -vx "$$" || true; }

# 1. Function mode, 2 tasks x 2 processes: every rank's result comes back to the driver.
"$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 >"$CONF" 2>"$T/driver.err" ||
  { cat "$T/driver.err" >&2; fail "function mode: driver exited $?"; }
for r in 0 1 2 3; do
  grep -qx "result rank=$r sum=10" "$CONF" || { cat "$CONF" "$T/driver.err" >&2; fail "function mode: no result of rank $r"; }
done
pass "function mode on Spark: 4 ranks in 2 barrier tasks, all-reduce sum 10 back on the driver ($((SECONDS - t0)) s)"

# 2. Rank 3 (node 1, the second task) crashes after the collective: WorkerError naming it.
t1=$SECONDS
"$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 --crash-rank 3 >"$CONF" 2>"$T/driver.err"
rc=$?
[[ $rc -eq 1 ]] || { cat "$CONF" "$T/driver.err" >&2; fail "crash: driver exit $rc, expected 1"; }
grep -q "^WorkerError rank=3 host=$(hostname) exit=139 signal=11" "$CONF" ||
  { cat "$CONF" "$T/driver.err" >&2; fail "crash: no WorkerError naming rank 3, its host and SIGSEGV"; }
pass "a SIGSEGV on rank 3 comes back as WorkerError rank 3, host, signal 11 ($((SECONDS - t1)) s)"

# 3. Too few slots (8 tasks, the cluster has 4): a clear error within the slot timeout.
t1=$SECONDS
"$DRIVER" --master "$SPARK_MASTER_URL" --nproc 8 --per-task 1 --slot-timeout 8 >"$CONF" 2>"$T/driver.err"
rc=$?
[[ $rc -eq 1 ]] || { cat "$CONF" "$T/driver.err" >&2; fail "slots: driver exit $rc, expected 1"; }
# (spark-submit passes the PySpark driver's stderr to its stdout.)
grep -q "too few free task slots" "$CONF" && grep -q "barrier stage needs 8" "$CONF" ||
  { cat "$CONF" "$T/driver.err" >&2; fail "slots: no clear message"; }
pass "8 tasks on 4 slots: a clear error after $((SECONDS - t1)) s, not a hang"

# 4. `dtrain run --spark-master` from a shell: rank-prefixed output on this console, the
#    failing rank's exit code (7) as dtrain's. Rank 2 fails 3 s after printing, so that the
#    others have printed before its failure stops them.
t1=$SECONDS
"$DTRAIN" run --spark-master "$SPARK_MASTER_URL" --nnodes 2 --nproc-per-node 2 \
  /bin/sh -c 'echo "hello from $RANK of $WORLD_SIZE"; [ "$RANK" = 2 ] && sleep 3; exit $((RANK == 2 ? 7 : 0))' >"$CONF" 2>"$T/driver.err"
rc=$?
[[ $rc -eq 7 ]] || { cat "$CONF" "$T/driver.err" >&2; fail "cli: exit $rc, expected 7"; }
for r in 0 1 2 3; do
  grep -q "^\[default$r\]:hello from $r of 4" "$CONF" || { cat "$CONF" >&2; fail "cli: no prefixed line of rank $r"; }
done
grep -q "rank       : 2" "$CONF" && grep -q "exit code  : 7" "$CONF" ||
  { cat "$T/driver.err" >&2; fail "cli: the root cause does not name rank 2, exit code 7"; }
pass "dtrain run --spark-master: 4 prefixed lines on the driver, rank 2's exit code 7 ($((SECONDS - t1)) s)"

# 5. The Python module: TorchDistributor's shape, in a PySpark session, twice in one session
#    (a success and a failure's exit status).
t1=$SECONDS
cat >"$T/module.py" <<PY
import sys
from pyspark.sql import SparkSession
from dtrain.spark import Distributor
spark = SparkSession.builder.master("$SPARK_MASTER_URL").appName("dtrain-test") \
    .config("spark.task.maxFailures", "1").config("spark.driver.host", "127.0.0.1").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
ok = Distributor(num_processes=2, local_mode=False, dtrain="$DTRAIN").run("/bin/sh", "-c", "echo module rank \$RANK")
bad = Distributor(num_processes=2, local_mode=False, dtrain="$DTRAIN").run("/bin/sh", "-c", "exit \$((RANK == 1 ? 5 : 0))")
local = Distributor(num_processes=2, local_mode=True, dtrain="$DTRAIN").run("/bin/sh", "-c", "echo local rank \$RANK")
spark.stop()
print("statuses", ok, bad, local, flush=True)
PY
PYTHONPATH="$PYDIR" "$PY" "$T/module.py" >"$CONF" 2>"$T/driver.err" || { cat "$CONF" "$T/driver.err" >&2; fail "module: python failed"; }
grep -qx "statuses 0 5 0" "$CONF" && grep -q "module rank 1" "$CONF" && grep -q "local rank 1" "$CONF" ||
  { cat "$CONF" "$T/driver.err" >&2; fail "module: expected statuses 0 5 0 and both ranks' output"; }
pass "dtrain.spark.Distributor(...).run(program): 0, the failing rank 1's 5, local mode 0 ($((SECONDS - t1)) s)"

# 6. The driver SIGKILLed while training runs: no dtrain agent or worker is left on the workers.
t1=$SECONDS
"$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 --sleep-rank 1 >"$CONF" 2>"$T/driver.err" &
drv=$!
deadline=$((SECONDS + 90))
until (($(ours | wc -l) >= 6)); do
  ((SECONDS < deadline)) || { kill -KILL $drv; cat "$T/driver.err" >&2; fail "kill: the workers did not start within 90 s"; }
  sleep 0.3
done
kill -KILL $drv
wait $drv 2>/dev/null
deadline=$((SECONDS + 30))
while [[ -n "$(ours)" ]]; do
  ((SECONDS < deadline)) || { ps -o pid,ppid,args -p "$(ours | tr '\n' ',' | sed 's/,$//')" >&2; fail "kill: dtrain processes left 30 s after the driver was SIGKILLed"; }
  sleep 0.3
done
pass "driver SIGKILLed during training: no dtrain process left after $((SECONDS - t1)) s in all"
echo "spark suite: $((SECONDS - t0)) s on the cluster"
