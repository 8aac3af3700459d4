#!/usr/bin/env bash
# dtrain's Distributor on Spark against PySpark's own TorchDistributor, on the same real Spark
# standalone cluster in one run: the hosts of tests/spark/lib.sh (network namespaces; root):
# the master and every driver on n0, a worker of 2 cores on n1 and on n2. 4 processes each:
#   dtrain       the C++ Distributor (tests/support/engine_driver: engine "spark", num_processes
#                4, spark_processes_per_task 2 -> 2 barrier tasks x 2 processes, spark.task.cpus
#                2); one program per round whose run() calls share one kept Spark application
#                (ClusterOptions::spark_keep_app): the first starts it (spark-submit), the
#                later ones ("warm") are one barrier stage each.
#   TorchDistributor  pyspark.ml.torch.distributor (the venv's pyspark, PyPI torch 2.x),
#                num_processes 4, local_mode=False, use_gpu=False -> 4 barrier tasks x 1
#                torchrun of 1 process (its only CPU sizing), from one SparkSession as in a
#                notebook (bench/spark_bench_td.py): its first run() pays the executors' start,
#                the later ones ("warm") do not.
# Cases: a trivial function (init a Gloo group, all-reduce, return), one epoch of Fashion-MNIST
# (the example in program mode, --no-eval --schedule constant, against its PyTorch peer
# bench/pytorch_fashion_mnist.py: same MLP, Adam, batch 64/rank, no evaluation), ROUNDS rounds
# with the two systems' order alternating, medians; a rank that exits with code 7 and one
# that is SIGKILLed before the all-reduce (what each reports, how long run() takes, what is
# left running 5 s after); the same output script under both (what reaches the driver, log
# volume). Prints a table with the ratios of this run and names the machine. Timing never
# fails it; a broken case (no result, wrong sum) does (exit 1). Everything started here -
# namespaces, JVMs, tasks - is torn down on exit, Ctrl-C included (lib.sh's trap).
#   bench/spark_bench.sh BUILD_DIR [ROUNDS (3)]      (BUILD_DIR: the libtorch 2.x build)
#   SPARK_BENCH_KEEP=DIR keeps the drivers' output files there; SPARK_BENCH_CAP=S (120):
#   TorchDistributor's failure cases are cancelled after S s; SPARK_BENCH_ROUNDS_ONLY=1 runs
#   the round trips only (no failure or output cases).
source "$(dirname "$0")/../tests/spark/lib.sh"
BUILD="$(realpath "${1:-build-torch2}")"
ROUNDS="${2:-3}"
CAP="${SPARK_BENCH_CAP:-120}"
HERE="$(realpath "$(dirname "$0")")"
DRIVER="$BUILD/tests/engine_driver" DTRAIN="$BUILD/tools/dtrain" FM="$BUILD/examples/fashion_mnist"
for f in "$DRIVER" "$DTRAIN" "$FM"; do [[ -x "$f" ]] || fail "$f is not built (cmake --build $BUILD --target engine_driver dtrain_cli fashion_mnist)"; done
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "dataset-fashion-mnist is not installed: run scripts/setup.sh"
export DTRAIN_LAUNCHER="$DTRAIN"
spark_init
"$PY" -c 'import torch, pyspark.ml.torch.distributor' 2>/dev/null || fail "the venv ($PY) lacks torch or pyspark: pip install -r scripts/requirements.txt"
load() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD0="$(load)"
t0=$SECONDS
spark_hosts_up 2
echo "Spark hosts up in $((SECONDS - t0)) s"
R="$T/results.tsv"
: >"$R"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$R"; }
now() { echo "$EPOCHREALTIME"; }
since() { "$PY" -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }

# Processes of a job still alive on the worker hosts: TorchDistributor's torchrun and its
# workers, dtrain's agents and workers.
JOBS="torch\.distributed\.run|torch_run_process_wrapper|/train\.py|pytorch_fashion_mnist|out\.py|^$DTRAIN |^$DRIVER |^$FM "
leftovers() {
  sleep 5
  local h out="" p
  for h in n1 n2; do
    p="$(host_procs $h "$JOBS")"
    [[ -n "$p" ]] && out+="$h: $p"
  done
  echo "$out"
}
kill_leftovers() {
  local h pid
  for h in n1 n2; do
    for pid in $(host_procs $h "$JOBS" | grep -oE '(^|; )[0-9]+:' | tr -dc '0-9\n'); do kill -KILL "$pid" 2>/dev/null; done
  done
}

td_run() {  # td_run TAG CASE... : one TorchDistributor session on n0, its cases in order
  local tag="$1"
  shift
  on n0 env PYTHONUNBUFFERED=1 "$PY" "$HERE/spark_bench_td.py" --master "$SPARK_MASTER_URL" --nproc 4 \
    --cap "$CAP" --peer "$HERE/pytorch_fashion_mnist.py" --output "$T/out.py" "$@" >"$T/td-$tag.out" 2>"$T/td-$tag.err"
  local rc=$?
  grep -q '^TDCASE {"case": "session"' "$T/td-$tag.out" || { tail -n 30 "$T/td-$tag.out" "$T/td-$tag.err" >&2; fail "TorchDistributor ($tag): the session did not start (exit $rc)"; }
}
td_case() { grep '^TDCASE ' "$T/td-$1.out" | sed -n "$(($2 + 2))p" | cut -c8-; }  # td_case TAG N: the Nth case's JSON
jq_() { "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print(eval(sys.argv[2], {}, {"r": r}))' "$@"; }

# One C++ driver process per round, 3 run() calls in its kept Spark application (as TD's
# cases share one SparkSession): run 1 the trivial function (it starts the application: what
# a fresh program pays), run 2 the same ("warm"), run 3 one epoch ("warm").
dtrain_round() {
  local t out="$T/dt-round$1.out" rc s json k
  t="$(now)"
  on n0 "$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 --then --then --program "$FM" --epochs 1 --no-eval \
    --schedule constant --log-every 100 >"$out" 2>&1
  rc=$?
  s="$(since "$t")"
  section() { awk -v k="$1" '$0 == "--- run " k {f = 1; next} /^--- run [0-9]+$/ {f = 0} f' "$out"; }
  secs() { sed -n "s/^run $1: exit 0 after \([0-9.]*\) s in Spark application app-.*/\1/p" "$out"; }
  for k in 1 2; do
    [[ $rc -eq 0 ]] && [[ $(section $k | grep -cE '^result rank=[0-3] sum=10 host=n[12]( |$)') -eq 4 && -n "$(secs $k)" ]] ||
      { tail -n 40 "$out" >&2; fail "dtrain trivial (run $k): exit $rc, expected 4 results of sum 10"; }
  done
  json="$(section 3 | grep -o '{.*"samples_per_s".*}' | tail -1)"
  [[ -n "$json" && -n "$(secs 3)" ]] || { tail -n 30 "$out" >&2; fail "dtrain epoch: no result line"; }
  [[ "$(sed -n 's/^run 1: .* application //p' "$out")" == "$(sed -n 's/^run 3: .* application //p' "$out")" ]] ||
    { tail -n 30 "$out" >&2; fail "dtrain: the runs were not in one Spark application"; }
  record dtrain trivial-first "$(secs 1)"
  record dtrain trivial "$(secs 2)" "$(section 2 | wc -c) bytes on the driver"
  record dtrain epoch "$(secs 3)" "$(jq_ "$json" 'round(r["samples_per_s"])')"
  record dtrain process "$s"
  echo "  dtrain: first trivial (starts the application) $(secs 1) s, trivial $(secs 2) s, epoch $(secs 3) s ($(jq_ "$json" 'round(r["samples_per_s"])') samples/s in the loop), the whole program $s s"
}

td_round() {
  local tag="round$1" j s
  td_run "$tag" trivial trivial epoch
  record td session "$(jq_ "$(td_case $tag -1)" '"%.2f" % r["seconds"]')"
  for n in 0 1; do
    j="$(td_case $tag $n)"
    [[ "$(jq_ "$j" 'r.get("ok") and r["result"][1] == 10.0')" == True ]] || { echo "$j" >&2; tail -n 40 "$T/td-$tag.err" >&2; fail "TorchDistributor trivial: no result of sum 10"; }
  done
  record td trivial-first "$(jq_ "$(td_case $tag 0)" '"%.2f" % r["seconds"]')"
  record td trivial "$(jq_ "$(td_case $tag 1)" '"%.2f" % r["seconds"]')" "$(jq_ "$(td_case $tag 1)" 'r["driver_bytes"]') bytes on the driver"
  j="$(td_case $tag 2)"
  [[ "$(jq_ "$j" 'r.get("ok")')" == True ]] || { echo "$j" >&2; fail "TorchDistributor epoch failed"; }
  local sps
  sps="$(grep -o '{.*"samples_per_s".*}' "$(jq_ "$j" 'r["text_file"]')" | tail -1)"
  [[ -n "$sps" ]] || fail "TorchDistributor epoch: the peer's result line did not reach the driver"
  record td epoch "$(jq_ "$j" '"%.2f" % r["seconds"]')" "$(jq_ "$sps" 'round(r["samples_per_s"])')"
  echo "  TorchDistributor: session $(jq_ "$(td_case $tag -1)" '"%.2f" % r["seconds"]') s, first trivial $(jq_ "$(td_case $tag 0)" '"%.2f" % r["seconds"]') s, trivial $(jq_ "$(td_case $tag 1)" '"%.2f" % r["seconds"]') s, epoch $(jq_ "$j" '"%.2f" % r["seconds"]') s"
}

# The output script both run under their launcher (4 processes): 50 short lines, one line
# of 10,000 characters on stdout, one line on stderr, per rank.
cat >"$T/out.py" <<'PY'
import os, sys
r = os.environ.get("RANK", "?")
for i in range(50):
    print("payload rank %s line %d" % (r, i))
print("payload rank %s long %s" % (r, "x" * 10000))
sys.stdout.flush()
print("payload rank %s on stderr" % r, file=sys.stderr, flush=True)
PY

# 1. Round trips, ROUNDS rounds, the order alternating.
for ((i = 1; i <= ROUNDS; i++)); do
  echo "round $i/$ROUNDS (load $(load))"
  record load "round$i" "$(load)"
  if ((i % 2)); then
    td_round $i; dtrain_round $i
  else
    dtrain_round $i; td_round $i
  fi
done

ONLY="${SPARK_BENCH_ROUNDS_ONLY:-0}"
: >"$T/failures.txt"
# 2. Failures: rank 3 exits with code 7, rank 2 SIGKILLs itself, before the all-reduce.
fail_summary() {  # what a driver's output says about the failure: the lines naming it
  grep -aE "WorkerError|root cause|Root Cause|rank *:|host *:|exit ?code *:|exitcode|signal|Signal|error_file|failed with return code|RuntimeError|ChildFailedError|FAILED|exits with code|SIGKILL" "$@" |
    grep -av "^\s*at \|WARN" | cut -c1-220 | head -n 25
}
for mode in exit7 kill9; do
  [[ $ONLY == 1 ]] && break
  echo "failure $mode (load $(load))"
  if [[ $mode == exit7 ]]; then flags=(--exit-rank 3 --exit-code 7); else flags=(--kill-rank 2); fi
  t="$(now)"
  on n0 "$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 "${flags[@]}" >"$T/dt-$mode.out" 2>"$T/dt-$mode.err"
  rc=$?
  s="$(since "$t")"
  left="$(leftovers)"
  kill_leftovers
  we="$(grep -a '^WorkerError' "$T/dt-$mode.out")"
  [[ $rc -eq 1 && -n "$we" ]] || { cat "$T/dt-$mode.out" "$T/dt-$mode.err" >&2; fail "dtrain $mode: exit $rc, expected a WorkerError"; }
  record dtrain "$mode" "$s" "$we | left after 5 s: ${left:-nothing}"
  { echo "=== dtrain $mode: run() returned after $s s; left on the workers 5 s later: ${left:-nothing}"; echo "$we"; fail_summary "$T/dt-$mode.err"; } >>"$T/failures.txt"
  echo "  dtrain: $s s: $we"

  td_run "$mode" "$mode"
  j="$(td_case "$mode" 0)"
  left="$(leftovers)"
  kill_leftovers
  s="$(jq_ "$j" '"%.2f" % r["seconds"]')"
  what="$(jq_ "$j" '("returned normally" if r.get("ok") else ("cancelled after the cap: run() had not returned; " if r.get("cancelled") else "") + r["error_type"] + ": " + " ".join(r["error"].split())[:300])')"
  record td "$mode" "$s" "$what | left after 5 s: ${left:-nothing}"
  { echo "=== TorchDistributor $mode: run() returned after $s s; left on the workers 5 s after: ${left:-nothing}"; echo "$what"; fail_summary "$(jq_ "$j" 'r["text_file"]')"; } >>"$T/failures.txt"
  echo "  TorchDistributor: $s s: ${what:0:200}"
done

# 3. Output: the same script under both; what reaches the driver's console.
echo "output (load $(load))"
if [[ $ONLY == 1 ]]; then
  : >"$T/dt-output.all"; : >"$T/td-output.all"
else
on n0 "$DRIVER" --master "$SPARK_MASTER_URL" --nproc 4 --per-task 2 --program "$PY" "$T/out.py" >"$T/dt-output.out" 2>"$T/dt-output.err" ||
  { cat "$T/dt-output.out" "$T/dt-output.err" >&2; fail "dtrain output case failed"; }
cat "$T/dt-output.out" "$T/dt-output.err" >"$T/dt-output.all"
td_run output output
j="$(td_case output 0)"
[[ "$(jq_ "$j" 'r.get("ok")')" == True ]] || { echo "$j" >&2; fail "TorchDistributor output case failed"; }
cp "$(jq_ "$j" 'r["text_file"]')" "$T/td-output.all"
fi
LOAD1="$(load)"

"$PY" - "$R" "$T/dt-output.all" "$T/td-output.all" "$LOAD0" "$LOAD1" "$ROUNDS" <<'PY'
import collections, os, platform, re, statistics, sys
rows = collections.defaultdict(list)
extra = collections.defaultdict(list)
loads = []
for line in open(sys.argv[1]):
    system, case, value, more = (line.rstrip("\n").split("\t") + [""])[:4]
    if system == "load":
        loads.append(value)
        continue
    rows[system, case].append(float(value))
    extra[system, case].append(more)
med = lambda k: statistics.median(rows[k]) if rows.get(k) else float("nan")
runs = lambda k: ", ".join("%.1f" % v for v in rows.get(k, []))
print()
print("machine: 2-core Debian 12 VM, shared (%s, %d CPUs, %s); load average (1/5/15 min) at start %s, per round %s, at end %s"
      % (platform.node(), os.cpu_count(), platform.release(), sys.argv[4], " | ".join(loads), sys.argv[5]))
print("cluster: Spark standalone master on n0, workers n1 + n2 x 2 cores (network namespaces); 4 processes per job")
print("dtrain: C++ Distributor, 2 tasks x 2 processes, one kept Spark application per program; 'warm' = a later run() in it")
print("TorchDistributor: 4 tasks x 1 torchrun/process, one SparkSession; 'warm' = a later run() in it")
print()
print("%-44s %10s %10s %8s   %s" % ("time from run() to the result (median of %s)" % sys.argv[6], "dtrain", "TorchDist.", "ratio", "runs (s): dtrain | TorchDistributor"))
def row(name, d, t):
    print("%-44s %9.1fs %9.1fs %8.2f   %s | %s" % (name, med(d), med(t), med(d) / med(t), runs(d), runs(t)))
row("trivial function, warm vs TD warm", ("dtrain", "trivial"), ("td", "trivial"))
sess = med(("td", "session"))
print("%-44s %9.1fs %9.1fs %8.2f   (dtrain: run 1 starts the application; TD: SparkSession start %.1f s + first run())" % (
    "trivial, first vs TD session start + first", med(("dtrain", "trivial-first")), sess + med(("td", "trivial-first")),
    med(("dtrain", "trivial-first")) / (sess + med(("td", "trivial-first"))), sess))
print("%-44s %9.1fs   (runs %s: start, 2 trivial runs, an epoch, exit)" % ("dtrain's whole program", med(("dtrain", "process")), runs(("dtrain", "process"))))
row("one epoch of Fashion-MNIST, warm vs TD warm", ("dtrain", "epoch"), ("td", "epoch"))
sps = lambda k: statistics.median(float(x) for x in extra[k]) if extra.get(k) else float("nan")
print("%-44s %10.0f %10.0f %8.2f   (samples/s in the training loop, median)" % (
    "  throughput", sps(("dtrain", "epoch")), sps(("td", "epoch")), sps(("dtrain", "epoch")) / sps(("td", "epoch"))))
nbytes = lambda k: statistics.median(int(x.split()[0]) for x in extra[k]) if extra.get(k) else float("nan")
print("%-44s %10.0f %10.0f %8.2f   (bytes on the driver's console, stdout + stderr, median)" % (
    "  log volume of a trivial run", nbytes(("dtrain", "trivial")), nbytes(("td", "trivial")),
    nbytes(("dtrain", "trivial")) / nbytes(("td", "trivial"))))
print()
for mode, what in (("exit7", "rank 3 exits with code 7"), ("kill9", "rank 2 SIGKILLed")):
    for system, name in (("dtrain", "dtrain"), ("td", "TorchDistributor")):
        k = (system, mode)
        if rows.get(k):
            print("%s, %s: run() returned after %.1f s: %s" % (what, name, rows[k][0], extra[k][0][:600]))
print()
def output(path, name):
    data = open(path, "rb").read()
    if not data:
        return
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    payload = [l for l in lines if "payload rank" in l]
    short = [l for l in payload if re.search(r"payload rank [0-3] line \d+$", l)]
    long_ = [l for l in payload if " long " in l]
    intact = sum(1 for l in long_ if l.endswith("x" * 10000))
    prefixed = sum(1 for l in payload if not l.startswith("payload"))
    payload_bytes = sum(len(l) + 1 for l in payload)
    print("%s: %d bytes / %d lines on the driver (payload %d lines, %d bytes; the rest %d bytes / %d lines); "
          "%d/200 short lines, %d/4 stderr lines, %d/4 long lines (max %d chars, %d intact), %d/%d payload lines carry a prefix (e.g. %r)"
          % (name, len(data), len(lines), len(payload), payload_bytes, len(data) - payload_bytes, len(lines) - len(payload),
             len(short), sum(1 for l in payload if l.endswith("on stderr")), len(long_),
             max((len(l) for l in long_), default=0), intact, prefixed, len(payload),
             (payload[0][:40] if payload else "")))
print("output, 4 processes x (50 short lines + 1 line of 10,000 chars on stdout + 1 line on stderr):")
output(sys.argv[2], "  dtrain")
output(sys.argv[3], "  TorchDistributor")
PY
echo
echo "what each reported for the failures (driver output, the lines naming the failure):"
cat "$T/failures.txt"
if [[ -n "${SPARK_BENCH_KEEP:-}" ]]; then
  mkdir -p "$SPARK_BENCH_KEEP" && cp "$T"/*.out "$T"/*.err "$T"/*.all "$T"/*.case-* "$T/results.tsv" "$T/failures.txt" "$SPARK_BENCH_KEEP"/ 2>/dev/null
  echo "driver outputs kept in $SPARK_BENCH_KEEP"
fi
