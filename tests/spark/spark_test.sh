#!/usr/bin/env bash
# The Spark engine on a real Spark standalone cluster of separate hosts (network namespaces,
# started once here): the master on n0, where the drivers run too (a Databricks driver node),
# and a worker of 2 cores on n1 and on n2, each with its own address; the drivers reach the
# workers over that network only. Then: the C++ Distributor's function mode (every rank's
# result, 2 ranks on each worker host) and program mode (the Fashion-MNIST example, 2 nodes x
# 2 processes, to accuracy), a crash on the second worker (WorkerError naming n2), too few
# slots, `dtrain run --spark-master`, the Python module dtrain.spark, and the driver SIGKILLed
# (no dtrain process left on any host). Everything (processes, namespaces, veths) is torn
# down after. Fails (never skips) when root, Java, pyspark or the data is missing.
#   spark_test.sh BUILD_DIR DTRAIN SPARK_DRIVER PYTHON_DIR
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../support/launch_check.sh"
BUILD="$(realpath "$1")" DTRAIN="$(realpath "$2")" DRIVER="$(realpath "$3")" PYDIR="$(realpath "$4")"
FM="$BUILD/examples/fashion_mnist"
[[ -x "$FM" ]] || fail "$FM is not built: run scripts/setup.sh"
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "dataset-fashion-mnist is not installed: run scripts/setup.sh"
export DTRAIN_LAUNCHER="$DTRAIN"
spark_init
t0=$SECONDS
spark_hosts_up 2
echo "Spark hosts up in $((SECONDS - t0)) s"
CONF="$T/driver.out"
t0=$SECONDS

# Our own processes on a host: the dtrain agents and the driver's re-executed workers.
OURS="^($DTRAIN|$DRIVER)( |$)"

# 1-3 and 6 are 5 run() calls of one C++ driver process: one kept Spark application (as a
# notebook's SparkSession serves every TorchDistributor.run()), one spark-submit for all.
#   run 1: function mode, 2 tasks x 2 processes; run 2: the same again (the same application,
#   no new spark-submit); run 3: a crash on n2; run 4: too few slots; run 5: Fashion-MNIST.
on n0 "$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 \
  --then \
  --then --crash-host n2 \
  --then --nproc 10 --slot-timeout 8 \
  --then --nproc 4 --program "$FM" --epochs 1 --log-every 100 >"$T/kept.out" 2>&1
rc=$?
# run K's output (the lines between "--- run K" and the next run's)
section() { awk -v k="$1" '$0 == "--- run " k {f = 1; next} /^--- run [0-9]+$/ {f = 0} f' "$T/kept.out"; }
for k in 1 2 3 4 5; do section $k >"$T/run$k.out"; done
app_of() { sed -n "s/^run $1: exit [0-9]* after [0-9.]* s in Spark application \(app-[^ ]*\)\$/\1/p" "$T/kept.out"; }
secs_of() { sed -n "s/^run $1: exit [0-9]* after \([0-9.]*\) s in .*/\1/p" "$T/kept.out"; }
[[ $rc -eq 1 ]] || { tail -n 40 "$T/kept.out" >&2; fail "kept application: driver exited $rc, expected 1 (runs 3 and 4 fail)"; }

# 1. Function mode, 2 tasks x 2 processes: every rank's result comes back to the driver.
CONF="$T/run1.out"
# threads=1: Spark gives each task OMP_NUM_THREADS = spark.task.cpus (2); its 2 workers
# share those cores (2 x 2 OpenMP threads made training 24x slower under load).
for r in 0 1 2 3; do
  grep -qx "result rank=$r sum=10 host=n[12] threads=1" "$CONF" || { cat "$CONF" >&2; fail "function mode: no result of rank $r from a worker host with OMP_NUM_THREADS=1"; }
done
# One task per worker host: ranks 0-1 (node 0) on one of them, ranks 2-3 (node 1) on the other.
h0="$(sed -n 's/^result rank=0 .* host=\([^ ]*\).*/\1/p' "$CONF")" h2="$(sed -n 's/^result rank=2 .* host=\([^ ]*\).*/\1/p' "$CONF")"
grep -qx "result rank=1 sum=10 host=$h0 threads=1" "$CONF" && grep -qx "result rank=3 sum=10 host=$h2 threads=1" "$CONF" && [[ "$h0" != "$h2" ]] ||
  { cat "$CONF" >&2; fail "function mode: expected ranks 0-1 on one worker host and 2-3 on the other"; }
app="$(app_of 1)"
[[ -n "$app" ]] && grep -q "dtrain.spark: job 1 of Spark application $app " "$CONF" ||
  { cat "$CONF" >&2; fail "function mode: no kept Spark application named after run 1"; }
pass "function mode on Spark: 4 ranks in 2 barrier tasks (ranks 0-1 on $h0, 2-3 on $h2), all-reduce sum 10 back on the driver on n0 ($(secs_of 1) s, starting application $app)"

# The second run() of the same process: the same application (job 2 of it, no spark-submit).
CONF="$T/run2.out"
[[ $(grep -c "^result rank=[0-3] sum=10 host=n[12] threads=1$" "$CONF") -eq 4 ]] || { cat "$CONF" >&2; fail "second run: expected 4 results"; }
[[ "$(app_of 2)" == "$app" ]] && grep -q "dtrain.spark: job 2 of Spark application $app " "$CONF" ||
  { cat "$CONF" >&2; fail "second run: not job 2 of application $app (got '$(app_of 2)')"; }
# Timing never fails a test: the figures only.
pass "second run() in the same Spark application $app (job 2, no spark-submit): $(secs_of 2) s vs the first's $(secs_of 1) s (ratio $("$PY" -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(secs_of 2)" "$(secs_of 1)"))"

# 2. A crash on the second worker host: the worker of local rank 1 on n2 (rank 1 or 3, as
#    Spark placed the tasks) raises SIGSEGV after the collective: WorkerError naming n2.
CONF="$T/run3.out"
grep -Eq "^WorkerError rank=[13] host=n2 exit=139 signal=11" "$CONF" ||
  { cat "$CONF" >&2; fail "crash: no WorkerError naming rank 1 or 3 on host n2 and SIGSEGV"; }
[[ "$(app_of 3)" == "$app" ]] || fail "crash: the run left application $app (now '$(app_of 3)')"
pass "a SIGSEGV on n2 comes back as $(grep -o '^WorkerError rank=[0-9]* host=n2 exit=139 signal=11' "$CONF") ($(secs_of 3) s, job 3 of $app)"

# 3. Too few slots (5 tasks of 2 cores, the cluster has 2): a clear error within the slot timeout.
CONF="$T/run4.out"
grep -q "^WorkerError .*too few free task slots" "$CONF" && grep -q "barrier stage needs 5" "$CONF" ||
  { cat "$CONF" >&2; fail "slots: no clear message"; }
[[ "$(app_of 4)" == "$app" ]] || fail "slots: the run left application $app (now '$(app_of 4)')"
pass "5 tasks on 2 slots: a clear error after $(secs_of 4) s, not a hang (job 4 of $app)"

# 6. The Fashion-MNIST example in program mode, 2 nodes x 2 processes on n1 and n2 (1 epoch,
#    test accuracy >= 0.80 as the Slurm test asks), after the failures, in the same application:
#    its JSON result line reaches the driver.
CONF="$T/run5.out"
grep -qx "program ok" "$CONF" || { tail -n 30 "$CONF" >&2; fail "Fashion-MNIST: the driver did not report success"; }
json="$(grep -o '{.*"test_accuracy".*}' "$CONF" | tail -1)"
[[ -n "$json" ]] || { tail -n 30 "$CONF" >&2; fail "Fashion-MNIST: no result line on the driver"; }
"$PY" -c '
import json, sys
r = json.loads(sys.argv[1])
assert r["world_size"] == 4, r
assert r["test_accuracy"] >= 0.80, r
print("fashion_mnist on Spark, 2 nodes x 2: world_size %d, test accuracy %.4f, %.0f samples/s" % (r["world_size"], r["test_accuracy"], r["samples_per_s"]))
' "$json" || fail "Fashion-MNIST result: $json"
grep -q "^\[default0\]:epoch 1 test accuracy" "$CONF" || { tail -n 30 "$CONF" >&2; fail "Fashion-MNIST: rank 0's progress missing on the driver"; }
[[ "$(app_of 5)" == "$app" ]] && grep -q "dtrain.spark: job 5 of Spark application $app " "$CONF" || fail "Fashion-MNIST: not job 5 of application $app"
pass "Fashion-MNIST example in program mode on n1 + n2, 2 x 2 processes, to accuracy ($(secs_of 5) s, job 5 of $app)"
# The driver's exit stopped its application: no PySpark driver left on n0.
[[ -z "$(host_procs n0 'spark\.py')" ]] || fail "kept application: its driver is still running after the program exited: $(host_procs n0 'spark\.py')"
pass "5 run() calls in one Spark application: $(grep -c 'dtrain.spark: job [0-9]* of Spark application' "$T/kept.out") jobs, its driver gone when the program exited ($((SECONDS - t0)) s)"
CONF="$T/driver.out"

# 4. `dtrain run --spark-master` from a shell: rank-prefixed output on this console, the
#    failing rank's exit code (7) as dtrain's. Rank 2 fails 3 s after printing, so that the
#    others have printed before its failure stops them.
t1=$SECONDS
on n0 "$DTRAIN" run --spark-master "$SPARK_MASTER_URL" --nnodes 2 --nproc-per-node 2 \
  /bin/sh -c 'echo "hello from $RANK of $WORLD_SIZE on $(hostname)"; [ "$RANK" = 2 ] && sleep 3; exit $((RANK == 2 ? 7 : 0))' >"$CONF" 2>"$T/driver.err"
rc=$?
[[ $rc -eq 7 ]] || { cat "$CONF" "$T/driver.err" >&2; fail "cli: exit $rc, expected 7"; }
for r in 0 1 2 3; do
  grep -Eq "^\[default$r\]:hello from $r of 4 on n[12]$" "$CONF" || { cat "$CONF" >&2; fail "cli: no prefixed line of rank $r from a worker host"; }
done
grep -q "rank       : 2" "$CONF" && grep -q "exit code  : 7" "$CONF" ||
  { cat "$T/driver.err" >&2; fail "cli: the root cause does not name rank 2, exit code 7"; }
# Every agent's output reaches this console: node 0's agent prints the root cause, the other one line.
blocks=$(cat "$CONF" "$T/driver.err" | grep -c "root cause (first failure)")
[[ $blocks -eq 1 ]] || { cat "$CONF" "$T/driver.err" >&2; fail "cli: the root cause printed $blocks times, expected once"; }
grep -q "node 0's agent prints the root cause" "$CONF" "$T/driver.err" ||
  { cat "$CONF" "$T/driver.err" >&2; fail "cli: node 1's agent did not say where the root cause is"; }
pass "dtrain run --spark-master: 4 prefixed lines on the driver, rank 2's exit code 7 ($((SECONDS - t1)) s)"

# 4b. `dtrain launch --spark-master` (torch.distributed.launch): the agents on the worker hosts
#     are `dtrain launch` too, so each worker gets --local-rank=N before its arguments.
t1=$SECONDS
check_dtrain_launch "dtrain launch --spark-master" 1 --spark-master "$SPARK_MASTER_URL" --nnodes 2 --nproc-per-node 2
pass "dtrain launch --spark-master: each of 4 workers got --local-rank=N before its arguments ($((SECONDS - t1)) s)"

# 5. The Python module: TorchDistributor's shape, in a PySpark session, twice in one session:
#    a success (None, as TorchDistributor's run() of a script) and a failure (RuntimeError
#    with the failing rank's exit status), then local mode. tests/spark/distributor_test.sh
#    compares it with TorchDistributor itself.
t1=$SECONDS
cat >"$T/module.py" <<PY
import re
from pyspark.sql import SparkSession
from dtrain.spark import Distributor
spark = SparkSession.builder.master("$SPARK_MASTER_URL").appName("dtrain-test") \
    .config("spark.task.maxFailures", "1").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
ok = Distributor(num_processes=2, local_mode=False, use_gpu=False, dtrain="$DTRAIN").run("/bin/sh", "-c", "echo module rank \$RANK")
try:
    Distributor(num_processes=2, local_mode=False, use_gpu=False, dtrain="$DTRAIN").run("/bin/sh", "-c", "exit \$((RANK == 1 ? 5 : 0))")
    bad = "no error"
except RuntimeError as e:
    bad = "RuntimeError " + re.search(r"failed with return code -?[0-9]+", str(e)).group(0)
local = Distributor(num_processes=2, local_mode=True, use_gpu=False, dtrain="$DTRAIN").run("/bin/sh", "-c", "echo local rank \$RANK")
spark.stop()
print("results", ok, bad, local, sep=";", flush=True)
PY
on n0 env PYTHONPATH="$PYDIR" "$PY" "$T/module.py" >"$CONF" 2>"$T/driver.err" || { cat "$CONF" "$T/driver.err" >&2; fail "module: python failed"; }
grep -qx "results;None;RuntimeError failed with return code 5;None" "$CONF" && grep -q "module rank 1" "$CONF" && grep -q "local rank 1" "$CONF" ||
  { cat "$CONF" "$T/driver.err" >&2; fail "module: expected None, a RuntimeError with return code 5, None, and both ranks' output"; }
pass "dtrain.spark.Distributor(...).run(program): None, the failing rank 1's RuntimeError (return code 5), local mode None ($((SECONDS - t1)) s)"

# 7. The driver SIGKILLed while training runs: after a bounded wait no dtrain agent or worker
#    is left on any host, and no spark-submit of it on n0.
t1=$SECONDS
#    First a run in an application that stops after 2 s idle: the run 6 s later starts a new
#    one (job 1 of another application), the one killed.
bg_on n0 "$CONF" "$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 --app-idle 2 \
  --then --pause 6 --sleep-rank all
drv=$BG_PID
deadline=$((SECONDS + 150))
# Each worker host: its agent and its 2 workers (the driver's binary, re-executed). Every rank
# sleeps after its all-reduce: a rank that returned would let its host's agent exit, and the
# count below could then miss it (CI saw this with --sleep-rank 1).
until grep -q "^--- run 2$" "$CONF" && [[ $(host_procs n1 "$OURS" | grep -o '; ' | wc -l) -ge 3 && $(host_procs n2 "$OURS" | grep -o '; ' | wc -l) -ge 3 ]]; do
  ((SECONDS < deadline)) || { kill -KILL $drv; cat "$CONF" >&2; fail "kill: the agents and workers of run 2 did not start on n1 and n2 within 150 s"; }
  kill -0 $drv 2>/dev/null || { cat "$CONF" >&2; fail "kill: the driver exited before training started"; }
  sleep 0.3
done
idle_app="$(sed -n 's/^run 1: exit 0 after [0-9.]* s in Spark application \(app-[^ ]*\)$/\1/p' "$CONF")"
new_app="$(sed -n 's/^dtrain.spark: job 1 of Spark application \(app-[^ ]*\) .*/\1/p' "$CONF" | tail -1)"
# The driver's private directory (its driver service's socket): there now, gone after.
own_dir="${TMPDIR:-/tmp}/dtrain-spark-$drv-*"
compgen -G "$own_dir" > /dev/null || fail "kill: the driver (pid $drv) has no directory $own_dir"
kill -KILL $drv
wait $drv 2>/dev/null
[[ -n "$idle_app" && -n "$new_app" && "$idle_app" != "$new_app" ]] ||
  { cat "$CONF" >&2; fail "idle: the run after the idle timeout was not job 1 of a new application (first '$idle_app', then '$new_app')"; }
pass "an application idle for 2 s stopped ($idle_app); the next run() started $new_app"
deadline=$((SECONDS + 30))
for h in n0 n1 n2; do
  pattern="$OURS"
  [[ $h == n0 ]] && pattern="$OURS|spark\.py"
  while [[ -n "$(host_procs $h "$pattern")" ]]; do
    ((SECONDS < deadline)) || fail "kill: processes left on $h 30 s after the driver was SIGKILLed: $(host_procs $h "$pattern")"
    sleep 0.3
  done
done
left="$(compgen -G "$own_dir" || true)"
[[ -z $left ]] || fail "kill: the killed driver's directory is left: $left"
pass "driver on n0 SIGKILLed during training: its directory removed, no dtrain process left on n0, n1 or n2 after $((SECONDS - t1)) s in all"
echo "spark suite: $((SECONDS - t0)) s on the cluster"
