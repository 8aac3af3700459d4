#!/usr/bin/env bash
# Elastic training on namespace hosts (issue #15): two hosts n1, n2 (network namespaces,
# tests/cluster/lib.sh), one agent each, `dtrain run --nnodes 1:2 --rdzv-backend c10d` with
# the ElasticState worker (tests/elastic/elastic_train_worker.cpp; Gloo between the hosts).
#   elastic_test.sh BUILD_DIR DTRAIN ELASTIC_TRAIN_WORKER
# 1. n2's agent SIGKILLed mid-epoch: n1 goes on alone at world size 1, resuming from the
#    newest commit; every sample of each epoch trained on exactly once; nothing left on n2.
# 2. n2's interface goes down mid-epoch (its Gloo peer hangs, no reset): n1's agent notices
#    the silent heartbeat, restarts alone and finishes, exactly once; n2's agent gives up
#    within its store timeout and leaves no worker behind.
# 3. A node joins mid-run: the job starts on n1 alone (--nnodes 1:2), n2's agent comes up
#    mid-epoch, the job restarts at world size 2 at the next tick and finishes there, every
#    sample exactly once; both agents exit 0 and nothing is left on either host.
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" W="$3"
for f in "$DTRAIN" "$W"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
require python3
cluster_init
hosts_up

# check_logs LOG_DIR FINAL_WORLD: every sample of both epochs exactly once, counting each
# attempt's steps up to the step the next attempt resumed from; the last attempt at FINAL_WORLD.
check_logs() {
  PYTHONPATH="$(dirname "$0")" python3 - "$1" "$2" <<'PY'
import sys
import attempt_logs
d, final_world = sys.argv[1], int(sys.argv[2])
att = attempt_logs.read(d)
order = sorted(att)
if len(order) < 2:
    sys.exit(f"expected a restart, got attempts {order}")
bad = attempt_logs.not_exactly_once(att, order, 2, 240, 5)
if bad:
    sys.exit(f"epoch {bad[0][0]}: samples not seen exactly once, e.g. {bad[0][1]}")
last = att[order[-1]]
if last["world"] != final_world:
    sys.exit(f"last attempt at world size {last['world']}, expected {final_world}")
print("attempts " + ", ".join(f"{n}: world {att[n]['world']} resumed at step {att[n]['resume']}" for n in order))
PY
}

# start_pair NAME PORT: agents on n1 (hosting the store) and n2; sets A_PID, B_PID, L, O.
start_pair() {
  O="$T/$1"
  L="$O/logs"
  mkdir -p "$L" "$O/ckpt"
  local common=(run --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "n1:$2" --rdzv-id "$1"
    --monitor-interval 0.1 --max-restarts 1 --rdzv-timeout 10 --rdzv-conf last_call_timeout=4,heartbeat_timeout=2)
  local worker=("$W" --size 240 --batch 8 --epochs 2 --commit-every 3 --step-sleep 0.1 --log-dir "$L"
    --checkpoint-dir "$O/ckpt")
  bg_on n1 "$O/n1.log" "$DTRAIN" "${common[@]}" "${worker[@]}"
  A_PID=$BG_PID
  wait_listen n1 "$2" 10 || fail "$1: the agent on n1 did not open the store: $(cat "$O/n1.log")"
  bg_on n2 "$O/n2.log" "$DTRAIN" "${common[@]}" "${worker[@]}"
  B_PID=$BG_PID
  local deadline=$((SECONDS + 60))
  until grep -q "step 4 loss" "$O/n1.log" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "$1: training did not reach step 4: $(cat "$O/n1.log" "$O/n2.log")"
    sleep 0.1
  done
  grep -q "world 2" "$O/n1.log" || fail "$1: the job did not start on both hosts: $(cat "$O/n1.log"; echo "--- n2:"; cat "$O/n2.log")"
}

# wait_exit PID SECONDS: waits for a background job; its exit status in RC (124 at the deadline).
wait_exit() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then
    RC=124
  else
    wait "$1"
    RC=$?
  fi
}

# 1 -------------------------------------------------------------------------------------
t=$SECONDS
start_pair killagent 29410
kill -KILL "$B_PID"
wait "$B_PID" 2>/dev/null
wait_exit "$A_PID" 90
[[ $RC -eq 0 ]] || fail "agent SIGKILLed: n1's agent exited $RC: $(cat "$O/n1.log")"
grep -q "stopped responding\|lost the connection\|left the group\|Connection" "$O/n1.log" ||
  fail "agent SIGKILLed: n1 does not say what it lost: $(cat "$O/n1.log")"
grep -q "(committed at world size 2, now 1)" "$O/n1.log" || fail "agent SIGKILLed: no resume at world size 1: $(cat "$O/n1.log")"
res="$(check_logs "$L" 1)" || fail "agent SIGKILLed: $res"
wait_gone n2 elastic_train_worker 10 || fail "agent SIGKILLed: left on n2: $(leftovers n2 elastic_train_worker)"
wait_gone n1 elastic_train_worker 10 || fail "agent SIGKILLed: left on n1: $(leftovers n1 elastic_train_worker)"
pass "n2's agent SIGKILLed mid-epoch: n1 resumed alone, each sample once ($res; $((SECONDS - t)) s)"

# 2 -------------------------------------------------------------------------------------
t=$SECONDS
start_pair linkdown 29420
ip -n "$NS2" link set eth0 down || fail "ip link set eth0 down in $NS2"
cut=$SECONDS
wait_exit "$A_PID" 90
[[ $RC -eq 0 ]] || fail "interface down: n1's agent exited $RC: $(cat "$O/n1.log")"
grep -q "stopped responding" "$O/n1.log" || fail "interface down: n1 does not name the silent agent: $(cat "$O/n1.log")"
grep -q "(committed at world size 2, now 1)" "$O/n1.log" || fail "interface down: no resume at world size 1: $(cat "$O/n1.log")"
res="$(check_logs "$L" 1)" || fail "interface down: $res"
a_secs=$((SECONDS - cut))
wait_exit "$B_PID" 60
[[ $RC -ne 0 && $RC -ne 124 ]] || fail "interface down: n2's agent exited $RC (expected a failure within 60 s): $(cat "$O/n2.log")"
wait_gone n2 elastic_train_worker 10 || fail "interface down: left on n2: $(leftovers n2 elastic_train_worker)"
pass "n2's interface down mid-epoch: n1 finished alone in $a_secs s, each sample once ($res); n2's agent gave up (exit $RC) after $((SECONDS - cut)) s, nothing left"

# 3 -------------------------------------------------------------------------------------
# n1 starts alone after a short last call; n2's agent (a longer one: it waits in the next
# round while n1's agent stops its workers) arrives once training is under way.
ip -n "$NS2" link set eth0 up || fail "ip link set eth0 up in $NS2 (case 2 took it down)"
t=$SECONDS
O="$T/join"
L="$O/logs"
mkdir -p "$L" "$O/ckpt"
join_args=(run --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint n1:29430 --rdzv-id join
  --monitor-interval 0.1 --max-restarts 1 --rdzv-timeout 10)
join_worker=("$W" --size 240 --batch 8 --epochs 2 --commit-every 3 --step-sleep 0.1 --log-dir "$L" --checkpoint-dir "$O/ckpt")
bg_on n1 "$O/n1.log" "$DTRAIN" "${join_args[@]}" --rdzv-conf last_call_timeout=0.2,heartbeat_timeout=2 "${join_worker[@]}"
A_PID=$BG_PID
deadline=$((SECONDS + 60))
until grep -q "step 4 loss" "$O/n1.log" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "node join: n1 alone did not reach step 4: $(cat "$O/n1.log")"
  sleep 0.1
done
grep -q "world 1" "$O/n1.log" || fail "node join: n1 did not start alone at world size 1: $(cat "$O/n1.log")"
bg_on n2 "$O/n2.log" "$DTRAIN" "${join_args[@]}" --rdzv-conf last_call_timeout=5,heartbeat_timeout=2 "${join_worker[@]}"
B_PID=$BG_PID
joined=$SECONDS
wait_exit "$A_PID" 90
[[ $RC -eq 0 ]] || fail "node join: n1's agent exited $RC: $(cat "$O/n1.log"; echo "--- n2:"; cat "$O/n2.log")"
wait_exit "$B_PID" 30
[[ $RC -eq 0 ]] || fail "node join: n2's agent exited $RC: $(cat "$O/n2.log")"
grep -q "restarting the workers for a membership change" "$O/n1.log" ||
  fail "node join: n1 did not restart to admit n2: $(cat "$O/n1.log")"
grep -q "round 1: 2 node(s)" "$O/n2.log" || fail "node join: n2 was not admitted to round 1: $(cat "$O/n2.log")"
res="$(check_logs "$L" 2)" || fail "node join: $res"
[[ "$res" == "attempts 0: world 1 "* ]] || fail "node join: the first attempt was not at world size 1: $res"
for h in n1 n2; do
  wait_gone "$h" elastic_train_worker 10 || fail "node join: left on $h: $(leftovers "$h" elastic_train_worker)"
  wait_gone "$h" "$DTRAIN" 10 || fail "node join: agents left on $h: $(leftovers "$h" "$DTRAIN")"
done
pass "n2 joined mid-run: the job went from world size 1 to 2 and finished, each sample once ($res); nothing left ($((SECONDS - t)) s, $((SECONDS - joined)) s after n2's agent started)"
