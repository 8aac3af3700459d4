#!/usr/bin/env bash
# The Ray engine on a real Ray cluster of separate hosts (network namespaces, started once
# here; tests/ray/lib.sh): the head on n0, where the drivers run too (0 CPUs: nothing is placed
# there), and a worker node of 2 CPUs on n1 and on n2, each with its own address; the drivers
# reach the nodes over that network only. Then:
#   1-6 six run() calls of one C++ program through one kept Ray driver: function mode 2 bundles x
#     2 processes STRICT_SPREAD (ranks 0-1 on one worker host, 2-3 on the other), the same
#     with 4 bundles of 1 PACK (2 ranks per host), a SIGSEGV on n2 (WorkerError naming n2), 3
#     STRICT_SPREAD bundles on 2 nodes (a clear error before anything starts), program mode
#     (rank and host of each process: 1 per node with STRICT_SPREAD), the Fashion-MNIST example
#     2 x 2 for 100 steps;
#   7 `dtrain run --ray-address` through Ray Client (ray://): prefixed output, the failing
#     rank's exit code;
#   8 dtrain.ray.Distributor from Python;
#   9 while Ray Train's TorchTrainer runs 2 workers on one worker node (started before 8, on
#     the node 8 leaves free): `dtrain run --ray-address` 5 times with 2 ranks in one bundle
#     that print 5 lines each and exit at once (every line on the console), and once with 2
#     bundles of 1 STRICT_PACK; the workers' RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK
#     are TorchTrainer's, GROUP_RANK the agent's (torchrun's);
#  10 a Tune search of 4 trials x 2 processes: the Tuner asks the cluster for its free slots (4
#     CPUs) and runs the trials two at a time across the nodes;
#  11 dtrain.ray.Distributor's function mode from Python (function_test.py): rank 0's return
#     value from a worker host (2 bundles x 2, a Gloo all-reduce, args and kwargs), a function
#     raising on rank 1 (WorkerError with rank, host, exception and traceback), and in local mode
#     the same plus the clear errors (rank 0 returns nothing, a value that cannot be unpickled or
#     pickled); nothing left on any host, no placement group;
#  12 the C++ driver SIGKILLed while every rank runs: no dtrain process on any host and no
#     placement group left within 30 s.
# Everything (processes, namespaces, veths) is torn down after. Fails (never skips) when
# root, ray or the data is missing.
#   ray_test.sh BUILD_DIR DTRAIN ENGINE_DRIVER TUNE_DRIVER PYTHON_DIR
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../support/launch_check.sh"
BUILD="$(realpath "$1")" DTRAIN="$(realpath "$2")" DRIVER="$(realpath "$3")" TUNE="$(realpath "$4")" PYDIR="$(realpath "$5")"
FM="$BUILD/examples/fashion_mnist"
for f in "$DTRAIN" "$DRIVER" "$TUNE" "$FM"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "dataset-fashion-mnist is not installed: run scripts/setup.sh"
export DTRAIN_LAUNCHER="$DTRAIN"
ray_init
t0=$SECONDS
ray_hosts_up 2
echo "Ray nodes up in $((SECONDS - t0)) s"
t0=$SECONDS
OURS="^($DTRAIN|$DRIVER|$TUNE|$FM)( |$)"
RAY=(--engine ray --ray-address "$RAY_GCS")

# The placement groups the cluster holds (not removed), as "name:state" words.
cat >"$T/pgs.py" <<'PY'
import sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
from ray.util.placement_group import placement_group_table
print(" ".join(sorted("%s:%s" % (v["name"], v["state"]) for v in placement_group_table().values() if v["state"] != "REMOVED")))
PY
pgs() { on n0 "$PY" "$T/pgs.py" "$RAY_GCS" 2>/dev/null; }

# 1-6: one C++ program, six run() calls, one kept Ray driver (one ray.init for all).
on n0 "$DRIVER" "${RAY[@]}" --nproc 4 --per-bundle 2 --strategy STRICT_SPREAD \
  --then --per-bundle 1 --strategy PACK \
  --then --per-bundle 2 --strategy STRICT_SPREAD --crash-host n2 \
  --then --nproc 6 --placement-timeout 5 \
  --then --nproc 2 --per-bundle 1 --program /bin/sh -c 'echo "rank $RANK of $WORLD_SIZE on $(hostname)"' \
  --then --nproc 4 --per-bundle 2 --program "$FM" --epochs 1 --max-steps 100 --no-eval --log-every 50 >"$T/kept.out" 2>&1
rc=$?
section() { awk -v k="$1" '$0 == "--- run " k {f = 1; next} /^--- run [0-9]+$/ {f = 0} f' "$T/kept.out"; }
for k in 1 2 3 4 5 6; do section $k >"$T/run$k.out"; done
driver_of() { sed -n "s/^run $1: exit [0-9]* after [0-9.]* s in Ray driver \(.*\)\$/\1/p" "$T/kept.out"; }
secs_of() { sed -n "s/^run $1: exit [0-9]* after \([0-9.]*\) s in .*/\1/p" "$T/kept.out"; }
[[ $rc -eq 1 ]] || { tail -n 60 "$T/kept.out" >&2; fail "kept driver: the program exited $rc, expected 1 (runs 3 and 4 fail)"; }
for k in 1 2 3 4 5 6; do
  [[ "$(driver_of $k)" == "$RAY_GCS" ]] || { tail -n 60 "$T/kept.out" >&2; fail "run $k: not in the kept Ray driver connected to $RAY_GCS (got '$(driver_of $k)')"; }
done
[[ $(grep -c "^dtrain.ray: job [0-9]* of the Ray driver connected to $RAY_GCS " "$T/kept.out") -eq 6 ]] ||
  { tail -n 60 "$T/kept.out" >&2; fail "kept driver: expected jobs 1-6 of one driver"; }

# 1. Function mode, 2 bundles x 2 processes, STRICT_SPREAD: every rank's result, one bundle per host.
CONF="$T/run1.out"
for r in 0 1 2 3; do
  grep -qx "result rank=$r sum=10 host=n[12] threads=1" "$CONF" || { cat "$CONF" >&2; fail "function mode: no result of rank $r from a worker host with OMP_NUM_THREADS=1"; }
done
host_of() { sed -n "s/^result rank=$1 .* host=\([^ ]*\).*/\1/p" "$2"; }
h0="$(host_of 0 "$CONF")" h2="$(host_of 2 "$CONF")"
[[ "$(host_of 1 "$CONF")" == "$h0" && "$(host_of 3 "$CONF")" == "$h2" && "$h0" != "$h2" ]] ||
  { cat "$CONF" >&2; fail "function mode, STRICT_SPREAD: expected ranks 0-1 on one worker host and 2-3 on the other"; }
pass "function mode: 4 ranks in 2 bundles (ranks 0-1 on $h0, 2-3 on $h2), all-reduce sum 10 back on n0 ($(secs_of 1) s, connecting the driver)"

# 2. 4 bundles of 1 process, PACK: 2 ranks on each worker host (each has 2 CPUs).
CONF="$T/run2.out"
[[ $(grep -c "^result rank=[0-3] sum=10 host=n1 " "$CONF") -eq 2 && $(grep -c "^result rank=[0-3] sum=10 host=n2 " "$CONF") -eq 2 ]] ||
  { cat "$CONF" >&2; fail "PACK, 4 bundles of 1: expected 2 ranks on n1 and 2 on n2"; }
pass "4 bundles of 1 process, PACK: 2 ranks on n1, 2 on n2 ($(secs_of 2) s, the same driver)"

# 3. A SIGSEGV on n2: the worker of local rank 1 there (rank 1 or 3, as Ray placed the bundles).
CONF="$T/run3.out"
grep -Eq "^WorkerError rank=[13] host=n2 exit=139 signal=11" "$CONF" ||
  { cat "$CONF" >&2; fail "crash: no WorkerError naming rank 1 or 3 on host n2 and SIGSEGV"; }
pass "a SIGSEGV on n2 comes back as $(grep -o '^WorkerError rank=[0-9]* host=n2 exit=139 signal=11' "$CONF") ($(secs_of 3) s)"

# 4. 3 bundles of 2 CPUs STRICT_SPREAD on 2 worker nodes: the cluster can never hold them.
CONF="$T/run4.out"
grep -q "^WorkerError .*cannot hold the job's placement group" "$CONF" &&
  grep -q "can never hold this job: it needs 3 bundle(s) of {CPU 2}" "$CONF" ||
  { cat "$CONF" >&2; fail "too few CPUs: no clear message"; }
! grep -q '^\[default' "$CONF" || { cat "$CONF" >&2; fail "too few CPUs: workers started"; }
pass "3 bundles of 2 CPUs, STRICT_SPREAD, on 2 nodes: a clear error after $(secs_of 4) s, nothing started"

# 5. Program mode, 2 bundles of 1, STRICT_SPREAD: one process on each worker host.
CONF="$T/run5.out"
grep -Eq '^\[default0\]:rank 0 of 2 on n[12]$' "$CONF" && grep -Eq '^\[default1\]:rank 1 of 2 on n[12]$' "$CONF" &&
  [[ "$(sed -n 's/^\[default0\]:rank 0 of 2 on //p' "$CONF")" != "$(sed -n 's/^\[default1\]:rank 1 of 2 on //p' "$CONF")" ]] &&
  grep -qx "program ok" "$CONF" || { cat "$CONF" >&2; fail "program mode: expected ranks 0 and 1 on different worker hosts"; }
pass "program mode, 2 bundles of 1 STRICT_SPREAD: $(grep -o 'rank 0 of 2 on n[12]' "$CONF"), $(grep -o 'rank 1 of 2 on n[12]' "$CONF") ($(secs_of 5) s)"

# 6. The Fashion-MNIST example, 2 x 2 processes on n1 and n2, 100 steps: its result line reaches the driver.
CONF="$T/run6.out"
json="$(grep -o '{.*"world_size".*}' "$CONF" | tail -1)"
grep -qx "program ok" "$CONF" && [[ -n "$json" ]] || { tail -n 30 "$CONF" >&2; fail "Fashion-MNIST: no result on the driver"; }
"$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["world_size"] == 4, r' "$json" || fail "Fashion-MNIST result: $json"
pass "Fashion-MNIST example in program mode on n1 + n2, 2 x 2 processes, 100 steps ($(secs_of 6) s)"
[[ -z "$(host_procs n0 'dtrain/ray\.py( |$)')" ]] || fail "kept driver: still running after the program exited: $(host_procs n0 'dtrain/ray\.py( |$)')"
[[ -z "$(pgs)" ]] || fail "kept driver: placement groups left: $(pgs)"
pass "6 run() calls in one kept Ray driver, gone when the program exited, no placement group left ($((SECONDS - t0)) s)"

# 7. `dtrain run --ray-address ray://...` (Ray Client): prefixed output on this console, the
#    failing rank's exit code (7) as dtrain's. Rank 2 fails 2 s after printing.
t1=$SECONDS
CONF="$T/cli.out"
on n0 "$DTRAIN" run --ray-address "ray://$(host_addr n0):10001" --ray-strategy STRICT_SPREAD --nnodes 2 --nproc-per-node 2 \
  /bin/sh -c 'echo "hello from $RANK of $WORLD_SIZE on $(hostname)"; [ "$RANK" = 2 ] && sleep 2; exit $((RANK == 2 ? 7 : 0))' >"$CONF" 2>"$T/cli.err"
rc=$?
[[ $rc -eq 7 ]] || { cat "$CONF" "$T/cli.err" >&2; fail "cli: exit $rc, expected 7"; }
for r in 0 1 2 3; do
  grep -Eq "^\[default$r\]:hello from $r of 4 on n[12]$" "$CONF" || { cat "$CONF" "$T/cli.err" >&2; fail "cli: no prefixed line of rank $r from a worker host"; }
done
grep -q "rank       : 2" "$CONF" && grep -q "exit code  : 7" "$CONF" ||
  { cat "$CONF" "$T/cli.err" >&2; fail "cli: the root cause does not name rank 2, exit code 7"; }
pass "dtrain run --ray-address ray://$(host_addr n0):10001: 4 prefixed lines on the driver, rank 2's exit code 7 ($((SECONDS - t1)) s)"

# 7b. `dtrain launch --ray-address ... --use-env` (torch.distributed.launch): the agents are
#     `dtrain launch` too, so --use-env is theirs: LOCAL_RANK in the environment, the arguments as
#     given.
t1=$SECONDS
check_dtrain_launch "dtrain launch --ray-address --use-env" 0 --ray-address "$RAY_GCS" --nnodes 2 --nproc-per-node 2 --use-env
pass "dtrain launch --ray-address --use-env: 4 workers, LOCAL_RANK set, arguments as given ($((SECONDS - t1)) s)"

# 9's peer, started now to run beside 8 and 9 (each uses one worker node at a time, the peer
# the other): Ray Train's TorchTrainer, 2 workers STRICT_PACK, each writing its variables.
mkdir -p "$T/rt"
bg_on n0 "$T/rt.log" timeout 240 "$PY" "$(dirname "$0")/torchtrainer_env.py" "$RAY_GCS" "$T/rt" 2 STRICT_PACK
rt_pid=$BG_PID

# 8. dtrain.ray.Distributor from Python (a driver that called ray.init itself): a success and a
#    failure's exit status.
t1=$SECONDS
cat >"$T/module.py" <<PY
import ray
from dtrain.ray import Distributor
ray.init(address="$RAY_GCS", log_to_driver=False, logging_level="ERROR")
ok = Distributor(num_processes=2, local_mode=False, dtrain="$DTRAIN").run("/bin/sh", "-c", "echo module rank \$RANK")
bad = Distributor(num_processes=2, local_mode=False, processes_per_bundle=2, dtrain="$DTRAIN").run("/bin/sh", "-c", "exit \$((RANK == 1 ? 5 : 0))")
print("statuses", ok, bad, flush=True)
PY
on n0 env PYTHONPATH="$PYDIR" "$PY" "$T/module.py" >"$T/module.out" 2>"$T/module.err" || { cat "$T/module.out" "$T/module.err" >&2; fail "module: python failed"; }
grep -qx "statuses 0 5" "$T/module.out" && grep -q "module rank 1" "$T/module.out" ||
  { cat "$T/module.out" "$T/module.err" >&2; fail "module: expected statuses 0 5 and rank 1's output"; }
pass "dtrain.ray.Distributor(...).run(program): 0, then the failing rank 1's 5 ($((SECONDS - t1)) s)"

# 9. Every line of workers that exit right after printing reaches the console (the failing
#    shape: 2 ranks in one bundle), and the workers' environment is TorchTrainer's.
t1=$SECONDS
ENVLINE='echo "env RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE NODE_RANK=$NODE_RANK host=$(hostname) GROUP_RANK=$GROUP_RANK"'
PRINT="for i in 1 2 3 4 5; do echo \"line \$i of rank \$RANK\"; done; $ENVLINE"
lines_run() {  # lines_run K DTRAIN-RUN-FLAGS...: run K, every rank's 5 lines and env line
  local k="$1" r i
  shift
  on n0 timeout 120 "$DTRAIN" run --ray-address "$RAY_GCS" "$@" /bin/sh -c "$PRINT" >"$T/lines$k.out" 2>"$T/lines$k.err"
  rc=$?
  [[ $rc -eq 0 ]] || { cat "$T/lines$k.out" "$T/lines$k.err" >&2; fail "lines run $k ($*): exit $rc"; }
  for r in 0 1; do
    for i in 1 2 3 4 5; do
      grep -qx "\[default$r\]:line $i of rank $r" "$T/lines$k.out" ||
        { cat "$T/lines$k.out" "$T/lines$k.err" >&2; fail "lines run $k ($*): line $i of rank $r did not reach the console"; }
    done
    grep -q "^\[default$r\]:env RANK=$r " "$T/lines$k.out" ||
      { cat "$T/lines$k.out" "$T/lines$k.err" >&2; fail "lines run $k ($*): no env line of rank $r"; }
  done
  [[ $(grep -c '^\[default' "$T/lines$k.out") -eq 12 ]] || { cat "$T/lines$k.out" >&2; fail "lines run $k: expected 12 lines"; }
}
for k in 1 2 3 4 5; do lines_run $k --nnodes 1 --nproc-per-node 2; done
lines_run 6 --nnodes 2 --nproc-per-node 1 --ray-strategy STRICT_PACK
pass "dtrain run --ray-address, 2 ranks in 1 bundle printing and exiting at once: all 12 lines in 5 of 5 runs, and with 2 bundles of 1 ($((SECONDS - t1)) s)"
wait $rt_pid || { cat "$T/rt.log" >&2; fail "Ray Train's TorchTrainer (the environment's peer) failed"; }
# Side by side, without the host (each ran on its own node) and GROUP_RANK (TorchTrainer sets none).
envs() { sed -n 's/^\[default[0-9]*\]:\(env .*\) host=.*/\1/p' "$1" | sort; }
ours_hosts() { sed -n 's/^\[default[0-9]*\]:env .* host=\([^ ]*\) .*/\1/p' "$1" | sort -u | wc -l; }
theirs="$(cat "$T"/rt/rank_* | sed 's/ host=.*//' | sort)"
[[ $(cat "$T"/rt/rank_* | sed -n 's/.* host=//p' | sort -u | wc -l) -eq 1 && $(wc -l <<<"$theirs") -eq 2 ]] ||
  { cat "$T"/rt/rank_* >&2; fail "TorchTrainer: expected 2 workers on one node"; }
for k in 1 6; do
  [[ "$(envs "$T/lines$k.out")" == "$theirs" && $(ours_hosts "$T/lines$k.out") -eq 1 ]] ||
    { { echo "dtrain:"; envs "$T/lines$k.out"; echo "TorchTrainer:"; echo "$theirs"; } >&2
      fail "lines run $k: the workers' environment differs from Ray Train's TorchTrainer on one node"; }
done
[[ "$(sed -n 's/^\[default[0-9]*\]:env .* GROUP_RANK=//p' "$T/lines1.out" | sort | tr '\n' ' ')" == "0 0 " &&
  "$(sed -n 's/^\[default[0-9]*\]:env .* GROUP_RANK=//p' "$T/lines6.out" | sort | tr '\n' ' ')" == "0 1 " ]] ||
  { cat "$T/lines1.out" "$T/lines6.out" >&2; fail "GROUP_RANK: expected the agent's rank (0 0 in 1 bundle, 0 1 in 2)"; }
pass "workers of 1 bundle of 2 and of 2 bundles of 1 on one node: $(envs "$T/lines6.out" | tr '\n' ';' | sed 's/;$//'), as TorchTrainer's; GROUP_RANK the agent's ($((SECONDS - t1)) s)"

# 10. Tune: 4 trials x 2 processes of 1 CPU on 4 CPUs: two at a time, across both nodes.
t1=$SECONDS
out="$(on n0 timeout 300 "$TUNE" --storage "$T/tune" --engine ray --ray-address "$RAY_GCS" --trials 4 --sleep 1 \
  --inject-failure 0 2>&1)" ||
  fail "tune on ray: exit $?: $out"
[[ $(grep -c "^trial [0-9a-f]\{5\}_0000[0-3] x=[1-4] status=TERMINATED .* rank_sum=3 " <<<"$out") -eq 4 ]] ||
  fail "tune on ray: expected 4 terminated trials of 2 ranks: $out"
grep -q "^tune: 2 trial(s) at a time on engine ray (4 free of 4 slots; 2 process(es) each)$" <<<"$out" ||
  fail "tune on ray: the Tuner did not size 2 trials at once from the cluster's 4 free CPUs: $out"
# Every trial's [start, end] (wall clock, from its reports): at most 2 overlap, and 2 do.
"$PY" - "$out" <<'PY' || fail "tune on ray: trials did not run two at a time: $out"
import re, sys
spans = [(float(a), float(b)) for a, b in re.findall(r"^span \S+ start=([0-9.]+) end=([0-9.]+)", sys.argv[1], re.M)]
assert len(spans) == 4, spans
most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
assert most == 2, "at most %d trials ran at once: %s" % (most, spans)
PY
# PACK (the default): each trial's 2 bundles of 1 CPU on one node, the two at once on n1 and n2.
grep -q "on_n2=[12] " <<<"$out" && grep -q "on_n2=[01] " <<<"$out" ||
  fail "tune on ray: the trials did not use both n1 and n2: $out"
pass "Tuner on Ray: 4 trials of 2 processes, 2 at a time (the cluster's 4 free CPUs), across n1 and n2 ($((SECONDS - t1)) s)"

# 11. dtrain.ray.Distributor's function mode from Python (tests/ray/function_test.py, one driver
#     on n0): on the cluster, rank 0's value back from the worker host that ran it, a raising
#     rank's WorkerError; in local mode the same, and the clear errors. Then nothing of it is
#     left on any host and no placement group.
t1=$SECONDS
on n0 env PYTHONPATH="$PYDIR" timeout 300 "$PY" "$(dirname "$0")/function_test.py" "$RAY_GCS" "$DTRAIN" >"$T/fn.out" 2>"$T/fn.err" ||
  { cat "$T/fn.out" >&2; tail -n 60 "$T/fn.err" >&2; fail "function mode: function_test.py failed"; }
sed 's/^/  /' "$T/fn.out"
for h in n0 n1 n2; do
  [[ -z "$(host_procs $h "$OURS|function\.pickle")" ]] || fail "function mode: processes left on $h: $(host_procs $h "$OURS|function\.pickle")"
done
[[ -z "$(pgs)" ]] || fail "function mode: placement groups left: $(pgs)"
pass "dtrain.ray.Distributor(...).run(function): rank 0's value from a worker host, WorkerError with the root cause, nothing left ($((SECONDS - t1)) s)"

# 12. The C++ driver SIGKILLed while every rank sleeps after its all-reduce: within 30 s no
#     dtrain process on any host, no Ray driver on n0, no placement group.
t1=$SECONDS
CONF="$T/kill.out"
bg_on n0 "$CONF" "$DRIVER" "${RAY[@]}" --nproc 4 --per-bundle 2 --strategy STRICT_SPREAD --sleep-rank all
drv=$BG_PID
deadline=$((SECONDS + 120))
until [[ $(host_procs n1 "$OURS" | grep -o '; ' | wc -l) -ge 3 && $(host_procs n2 "$OURS" | grep -o '; ' | wc -l) -ge 3 ]]; do
  ((SECONDS < deadline)) || { kill -KILL $drv; cat "$CONF" >&2; fail "kill: the agents and workers did not start on n1 and n2 within 120 s"; }
  kill -0 $drv 2>/dev/null || { cat "$CONF" >&2; fail "kill: the driver exited before training started"; }
  sleep 0.3
done
[[ -n "$(pgs)" ]] || fail "kill: no placement group while the job runs"
# The driver's private directory (its driver service's socket): there now, gone after.
own_dir="${TMPDIR:-/tmp}/dtrain-ray-$drv-*"
compgen -G "$own_dir" > /dev/null || fail "kill: the driver (pid $drv) has no directory $own_dir"
kill -KILL $drv
wait $drv 2>/dev/null
t2=$SECONDS
deadline=$((SECONDS + 30))
for h in n0 n1 n2; do
  pattern="$OURS"
  [[ $h == n0 ]] && pattern="$OURS|dtrain/ray\.py( |\$)"
  while [[ -n "$(host_procs $h "$pattern")" ]]; do
    ((SECONDS < deadline)) || fail "kill: processes left on $h 30 s after the driver was SIGKILLed: $(host_procs $h "$pattern")"
    sleep 0.3
  done
done
while [[ -n "$(pgs)" ]]; do
  ((SECONDS < deadline)) || fail "kill: placement groups left 30 s after the driver was SIGKILLed: $(pgs)"
  sleep 1
done
left="$(compgen -G "$own_dir" || true)"
[[ -z $left ]] || fail "kill: the killed driver's directory is left: $left"
pass "driver on n0 SIGKILLed during training: its directory removed, no dtrain process on n0, n1, n2 and no placement group after $((SECONDS - t2)) s"
echo "ray suite: $((SECONDS - t0)) s on the cluster"
