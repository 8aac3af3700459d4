#!/usr/bin/env bash
# dtrain's Distributor on Ray against Ray Train's TorchTrainer, on the same real Ray cluster in
# one run: the hosts of tests/ray/lib.sh (network namespaces; root): the head and every driver
# on n0 (0 CPUs), a worker node of 2 CPUs on n1 and on n2. 4 processes each:
#   dtrain       the C++ Distributor (tests/engine_driver: engine "ray", num_processes 4,
#                ray.processes_per_bundle 2, STRICT_SPREAD -> 2 bundles x 2 processes, one
#                dtrain agent per node); one program per round whose run() calls share one
#                kept Ray driver (ClusterOptions::ray.keep_driver): the first connects it, the
#                later ones ("warm") are a placement group and 2 Ray tasks each.
#   Ray Train    TorchTrainer (the venv's ray 2.60, PyPI torch 2.11), ScalingConfig(num_workers=
#                4) (4 bundles of 1 CPU, PACK: Ray Train's defaults), TorchConfig(backend="gloo"),
#                from one driver connected once (ray.init), as in a notebook
#                (bench/ray_train_peer.py): every fit() starts its controller and worker actors.
# Cases: a trivial function (all-reduce in the Gloo group, return), one epoch of Fashion-MNIST
# (the example in program mode, --no-eval --schedule constant, against Ray Train running its
# PyTorch peer bench/pytorch_fashion_mnist.py's train(): same MLP, Adam, batch 64/rank, no
# evaluation), ROUNDS rounds with the two systems' order alternating, medians; a rank that exits
# with code 7, one SIGKILLed, one raising, before the all-reduce (what each reports, how long the
# call takes, what is left running 5 s after). Prints a table with the ratios of this run and
# names the machine. Timing never fails it; a broken case (no result, wrong sum) does (exit 1).
# Everything started here - namespaces, Ray nodes, drivers - is torn down on exit, Ctrl-C too.
#   bench/ray_bench.sh BUILD_DIR [ROUNDS (3)]      (BUILD_DIR: the libtorch 2.x build)
#   RAY_BENCH_ROUNDS_ONLY=1 runs the round trips only (no failure cases).
source "$(dirname "$0")/../tests/ray/lib.sh"
BUILD="$(realpath "${1:-build-torch2}")"
ROUNDS="${2:-3}"
HERE="$(realpath "$(dirname "$0")")"
DRIVER="$BUILD/tests/engine_driver" DTRAIN="$BUILD/tools/dtrain" FM="$BUILD/examples/fashion_mnist"
for f in "$DRIVER" "$DTRAIN" "$FM"; do [[ -x "$f" ]] || fail "$f is not built (cmake --build $BUILD --target engine_driver dtrain_cli fashion_mnist)"; done
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "dataset-fashion-mnist is not installed: run scripts/setup.sh"
export DTRAIN_LAUNCHER="$DTRAIN"
ray_init
"$PY" -c 'import torch, ray.train.torch' 2>/dev/null || fail "the venv ($PY) lacks torch or ray[train]: pip install -r scripts/requirements.txt"
load() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD0="$(load)"
t0=$SECONDS
ray_hosts_up 2
echo "Ray nodes up in $((SECONDS - t0)) s"
R="$T/results.tsv"
: >"$R"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$R"; }
now() { echo "$EPOCHREALTIME"; }
since() { "$PY" -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }
jq_() { "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print(eval(sys.argv[2], {}, {"r": r}))' "$@"; }

# What is left of a job on the worker nodes: dtrain's agents and workers, Ray Train's workers.
JOBS="^$DTRAIN |^$DRIVER |^$FM |RayTrainWorker|ray_train_peer"
leftovers() {
  sleep 5
  local h out="" p
  for h in n1 n2; do
    p="$(host_procs $h "$JOBS")"
    [[ -n "$p" ]] && out+="$h: $p"
  done
  echo "$out"
}

rt_run() {  # rt_run TAG CASE... : one Ray Train driver on n0, its cases in order
  local tag="$1"
  shift
  on n0 env PYTHONUNBUFFERED=1 "$PY" "$HERE/ray_train_peer.py" --address "$RAY_GCS" --storage "$T/ray_train" \
    "$@" >"$T/rt-$tag.out" 2>"$T/rt-$tag.err"
  local rc=$?
  grep -q '^RTCASE {"case": "session"' "$T/rt-$tag.out" || { tail -n 30 "$T/rt-$tag.out" "$T/rt-$tag.err" >&2; fail "Ray Train ($tag): the driver did not connect (exit $rc)"; }
}
rt_case() { grep '^RTCASE ' "$T/rt-$1.out" | sed -n "$(($2 + 2))p" | cut -c8-; }  # the Nth case's JSON

DT_FLAGS=(--engine ray --ray-address "$RAY_GCS" --nproc 4 --per-bundle 2 --strategy STRICT_SPREAD)

# One C++ driver process per round, 3 run() calls through its kept Ray driver: run 1 the
# trivial function (it connects the driver: what a fresh program pays), run 2 the same
# ("warm"), run 3 one epoch ("warm").
dtrain_round() {
  local t out="$T/dt-round$1.out" rc s json k
  t="$(now)"
  on n0 "$DRIVER" "${DT_FLAGS[@]}" --then --then --program "$FM" --epochs 1 --no-eval \
    --schedule constant --log-every 100 >"$out" 2>&1
  rc=$?
  s="$(since "$t")"
  section() { awk -v k="$1" '$0 == "--- run " k {f = 1; next} /^--- run [0-9]+$/ {f = 0} f' "$out"; }
  secs() { sed -n "s/^run $1: exit 0 after \([0-9.]*\) s in .*/\1/p" "$out"; }
  for k in 1 2; do
    [[ $rc -eq 0 ]] && [[ $(section $k | grep -cE '^result rank=[0-3] sum=10 host=n[12]( |$)') -eq 4 && -n "$(secs $k)" ]] ||
      { tail -n 40 "$out" >&2; fail "dtrain trivial (run $k): exit $rc, expected 4 results of sum 10"; }
  done
  json="$(section 3 | grep -o '{.*"samples_per_s".*}' | tail -1)"
  [[ -n "$json" && -n "$(secs 3)" ]] || { tail -n 30 "$out" >&2; fail "dtrain epoch: no result line"; }
  record dtrain trivial-first "$(secs 1)"
  record dtrain trivial "$(secs 2)" "$(section 2 | wc -c) bytes on the driver"
  record dtrain epoch "$(secs 3)" "$(jq_ "$json" 'round(r["samples_per_s"])')"
  record dtrain process "$s"
  echo "  dtrain: first trivial (connects the driver) $(secs 1) s, trivial $(secs 2) s, epoch $(secs 3) s ($(jq_ "$json" 'round(r["samples_per_s"])') samples/s in the loop), the whole program $s s"
}

rt_round() {
  local tag="round$1" j n
  rt_run "$tag" trivial trivial epoch
  record rt session "$(jq_ "$(rt_case $tag -1)" '"%.2f" % r["seconds"]')"
  for n in 0 1; do
    j="$(rt_case $tag $n)"
    [[ "$(jq_ "$j" 'r.get("ok")')" == True ]] || { echo "$j" >&2; tail -n 40 "$T/rt-$tag.err" >&2; fail "Ray Train trivial failed"; }
  done
  record rt trivial-first "$(jq_ "$(rt_case $tag 0)" '"%.2f" % r["seconds"]')"
  record rt trivial "$(jq_ "$(rt_case $tag 1)" '"%.2f" % r["seconds"]')"
  j="$(rt_case $tag 2)"
  [[ "$(jq_ "$j" 'r.get("ok")')" == True ]] || { echo "$j" >&2; tail -n 40 "$T/rt-$tag.err" >&2; fail "Ray Train epoch failed"; }
  record rt epoch "$(jq_ "$j" '"%.2f" % r["seconds"]')" "$(grep -o '"samples_per_s": [0-9.]*' "$T/rt-$tag.out" "$T/rt-$tag.err" | tail -1 | grep -o '[0-9.]*$')"
  echo "  Ray Train: connect $(jq_ "$(rt_case $tag -1)" '"%.2f" % r["seconds"]') s, first trivial $(jq_ "$(rt_case $tag 0)" '"%.2f" % r["seconds"]') s, trivial $(jq_ "$(rt_case $tag 1)" '"%.2f" % r["seconds"]') s, epoch $(jq_ "$j" '"%.2f" % r["seconds"]') s"
}

# 1. Round trips, ROUNDS rounds, the order alternating.
for ((i = 1; i <= ROUNDS; i++)); do
  echo "round $i/$ROUNDS (load $(load))"
  record load "round$i" "$(load)"
  if ((i % 2)); then
    rt_round $i; dtrain_round $i
  else
    dtrain_round $i; rt_round $i
  fi
done

# 2. Failures before the all-reduce the others wait in: rank 3 exits with code 7, rank 2
#    SIGKILLs itself, rank 1 raises.
: >"$T/failures.txt"
fail_summary() {
  grep -aE "WorkerError|root cause|Rank [0-9] Error|rank *:|host *:|exit ?code *:|signal|Signal|Error:|exits with code|SIGKILL|died|node_ip|hostname=" "$@" |
    cut -c1-220 | head -n 25
}
for mode in exit7 kill9 raise; do
  [[ "${RAY_BENCH_ROUNDS_ONLY:-0}" == 1 ]] && break
  echo "failure $mode (load $(load))"
  case $mode in
    exit7) flags=(--exit-rank 3 --exit-code 7) ;;
    kill9) flags=(--kill-rank 2) ;;
    raise) flags=(--fail-rank 1) ;;
  esac
  t="$(now)"
  on n0 "$DRIVER" "${DT_FLAGS[@]}" "${flags[@]}" >"$T/dt-$mode.out" 2>"$T/dt-$mode.err"
  rc=$?
  s="$(since "$t")"
  left="$(leftovers)"
  we="$(grep -a '^WorkerError' "$T/dt-$mode.out")"
  [[ $rc -eq 1 && -n "$we" ]] || { cat "$T/dt-$mode.out" "$T/dt-$mode.err" >&2; fail "dtrain $mode: exit $rc, expected a WorkerError"; }
  record dtrain "$mode" "$s" "$we | left after 5 s: ${left:-nothing}"
  { echo "=== dtrain $mode: run() returned after $s s; left on the workers 5 s later: ${left:-nothing}"; echo "$we"; fail_summary "$T/dt-$mode.err"; } >>"$T/failures.txt"
  echo "  dtrain: $s s: $we"

  rt_run "$mode" "$mode"
  j="$(rt_case "$mode" 0)"
  left="$(leftovers)"
  s="$(jq_ "$j" '"%.2f" % r["seconds"]')"
  what="$(jq_ "$j" '("returned normally" if r.get("ok") else r["error_type"] + ": " + " ".join(r["error"].split())[:600])')"
  record rt "$mode" "$s" "$what | left after 5 s: ${left:-nothing}"
  { echo "=== Ray Train $mode: fit() returned after $s s; left on the workers 5 s after: ${left:-nothing}"; echo "$what"; } >>"$T/failures.txt"
  echo "  Ray Train: $s s: ${what:0:200}"
done
LOAD1="$(load)"

"$PY" - "$R" "$LOAD0" "$LOAD1" "$ROUNDS" <<'PY'
import collections, os, platform, statistics, sys
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
      % (platform.node(), os.cpu_count(), platform.release(), sys.argv[2], " | ".join(loads), sys.argv[3]))
print("cluster: Ray 2.60 head on n0 (0 CPUs), worker nodes n1 + n2 x 2 CPUs (network namespaces); 4 processes per job")
print("dtrain: C++ Distributor, 2 bundles x 2 processes (STRICT_SPREAD), one kept Ray driver per program; 'warm' = a later run()")
print("Ray Train: TorchTrainer, ScalingConfig(num_workers=4), gloo, one driver (ray.init once); every fit() starts its actors")
print()
print("%-44s %10s %10s %8s   %s" % ("time from the call to the result (median of %s)" % sys.argv[4], "dtrain", "Ray Train", "ratio", "runs (s): dtrain | Ray Train"))
def row(name, d, t):
    print("%-44s %9.1fs %9.1fs %8.2f   %s | %s" % (name, med(d), med(t), med(d) / med(t), runs(d), runs(t)))
row("trivial function, warm vs fit()", ("dtrain", "trivial"), ("rt", "trivial"))
sess = med(("rt", "session"))
print("%-44s %9.1fs %9.1fs %8.2f   (dtrain: run 1 connects the driver; Ray Train: import + ray.init %.1f s + first fit())" % (
    "trivial, first vs connect + first fit()", med(("dtrain", "trivial-first")), sess + med(("rt", "trivial-first")),
    med(("dtrain", "trivial-first")) / (sess + med(("rt", "trivial-first"))), sess))
print("%-44s %9.1fs   (runs %s: start, 2 trivial runs, an epoch, exit)" % ("dtrain's whole program", med(("dtrain", "process")), runs(("dtrain", "process"))))
row("one epoch of Fashion-MNIST, warm vs fit()", ("dtrain", "epoch"), ("rt", "epoch"))
def sps(k):
    vals = [float(x) for x in extra.get(k, []) if x]
    return statistics.median(vals) if vals else float("nan")
print("%-44s %10.0f %10.0f %8.2f   (samples/s in the training loop, median)" % (
    "  throughput", sps(("dtrain", "epoch")), sps(("rt", "epoch")), sps(("dtrain", "epoch")) / sps(("rt", "epoch"))))
print()
for mode, what in (("exit7", "rank 3 exits with code 7"), ("kill9", "rank 2 SIGKILLed"), ("raise", "rank 1 raises")):
    for system, name in (("dtrain", "dtrain"), ("rt", "Ray Train")):
        k = (system, mode)
        if rows.get(k):
            print("%s, %s: returned after %.1f s: %s" % (what, name, rows[k][0], extra[k][0][:700]))
PY
echo
echo "--- what each reported on a failure ($T/failures.txt) ---"
cat "$T/failures.txt"
