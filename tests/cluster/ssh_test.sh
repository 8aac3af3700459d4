#!/usr/bin/env bash
# Host files over ssh: two hosts (network namespaces n1, n2), each with its own sshd on its
# own address (port 2222); `dtrain run --hostfile` runs on n1 and starts one agent per host.
#   ssh_test.sh BUILD_DIR DTRAIN CLUSTER_WORKER TEST_WORKER
# 1. --hostfile (slots=2 each) with --ssh-port, --ssh-identity and --ssh-arg: a 4-rank
#    all-reduce, ranks 2-3 on n2, every rank's output on the launching console.
# 2. -H n1:1,n2:1 with --nproc-per-node 2 overriding the slots.
# 3. --dry-run: the plan, every host reachable; an unknown host is named, exit code 2.
# 4. The same unknown host in a real run: exit 2, nothing started.
# 5. A worker SIGKILLed on n2: root cause with host n2 and rank 3, exit 137, no process left.
# 6. SIGTERM to the launching dtrain: the agents on both hosts stop their workers.
# 7. Bad host files: exit 2 with the line named, nothing started.
# 8. A master address that a node cannot reach: that node says so, and what to do.
# 9. The launching dtrain SIGKILLed: the agents see their stdin close and stop everything.
# 10. `dtrain deepspeed` with DeepSpeed's hostfile and --include "n1:1@n2": one agent per host
#     over ssh, DeepSpeed's variables on each (CROSS_RANK, CUDA_VISIBLE_DEVICES, ...).
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" W="$3" TW="$4"
for f in "$DTRAIN" "$W" "$TW"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
cluster_init
start=$SECONDS
hosts_up
sshd_up
echo "hosts and sshd up in $((SECONDS - start)) s"
count() { grep -c -- "$2" <<<"$1" || true; }
SSH_OPTS=(--ssh-port "$SSH_PORT" --ssh-identity "$SSH_KEY" --ssh-arg=-F --ssh-arg="$SSH_CONFIG")
printf '# two hosts\nn1 slots=2\nn2 slots=2   # the second\n' >"$T/hosts.txt"

# 1 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$DTRAIN" run --hostfile "$T/hosts.txt" "${SSH_OPTS[@]}" "$W" 2>&1)" ||
  fail "dtrain run --hostfile exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "--hostfile: expected 4 ranks summing to 10: $out"
for r in 0 1; do grep -q "^\[default$r\]:cluster_worker rank=$r world=4 .*host=n1 master=n1:29500" <<<"$out" || fail "--hostfile: rank $r: $out"; done
for r in 2 3; do grep -q "^\[default$r\]:cluster_worker rank=$r world=4 .*host=n2 master=n1:29500" <<<"$out" || fail "--hostfile: rank $r: $out"; done
pass "dtrain run --hostfile (n1 slots=2, n2 slots=2) over ssh: 4 ranks, prefixed output of both hosts ($((SECONDS - t)) s)"

# 2 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$DTRAIN" run -H n1:1,n2:1 --nproc-per-node 2 --master-port 29601 "${SSH_OPTS[@]}" "$W" 2>&1)" ||
  fail "dtrain run -H exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "-H: expected 4 ranks summing to 10: $out"
grep -q "^\[default3\]:cluster_worker rank=3 .*host=n2 master=n1:29601" <<<"$out" || fail "-H: rank 3: $out"
pass "dtrain run -H n1:1,n2:1 --nproc-per-node 2: 4 ranks ($((SECONDS - t)) s)"

# 3 -------------------------------------------------------------------------------------
out="$(on n1 timeout 60 "$DTRAIN" run --dry-run --hostfile "$T/hosts.txt" "${SSH_OPTS[@]}" "$W" 2>&1)" ||
  fail "--dry-run exited $?: $out"
grep -q "engine     : ssh" <<<"$out" || fail "dry run: engine: $out"
grep -q "master     : n1:29500" <<<"$out" || fail "dry run: master: $out"
grep -q "node 0     : n1, ranks 0-1 (2 workers), reachable over ssh" <<<"$out" || fail "dry run: node 0: $out"
grep -q "node 1     : n2, ranks 2-3 (2 workers), reachable over ssh" <<<"$out" || fail "dry run: node 1: $out"
[[ -z "$(leftovers n2 "$W")$(leftovers n1 "$W")" ]] || fail "dry run started workers"
out="$(on n1 timeout 60 "$DTRAIN" run --dry-run -H n1:2,nosuchhost:2 "${SSH_OPTS[@]}" "$W" 2>&1)"
code=$?
[[ $code -eq 2 ]] || fail "dry run with an unknown host: exit $code, expected 2: $out"
grep -q "node 1     : nosuchhost, ranks 2-3 (2 workers), UNREACHABLE: .*nosuchhost" <<<"$out" || fail "dry run: unknown host not named: $out"
pass "--dry-run: plan with ranks per host and master; an unknown host is named, exit 2"

# 4 -------------------------------------------------------------------------------------
out="$(on n1 timeout 60 "$DTRAIN" run -H n1:2,nosuchhost:2 "${SSH_OPTS[@]}" "$W" 2>&1)"
code=$?
[[ $code -eq 2 ]] || fail "run with an unknown host: exit $code, expected 2: $out"
grep -q "cannot reach 1 of 2 host(s) over ssh; nothing was started" <<<"$out" || fail "unknown host: message: $out"
grep -q "nosuchhost: .*Could not resolve hostname" <<<"$out" || fail "unknown host: ssh's reason: $out"
[[ -z "$(leftovers n1 "$W")" ]] || fail "unknown host: workers started on n1"
pass "a run with an unknown host: exit 2, the host and ssh's reason named, nothing started"

# 5 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$DTRAIN" run --hostfile "$T/hosts.txt" "${SSH_OPTS[@]}" "$W" --kill-self-on-rank 3 --sleep 120 2>&1)"
code=$?
took=$((SECONDS - t))
[[ $code -eq 137 ]] || fail "killed worker: exit $code, expected 137: $out"
[[ $(count "$out" "root cause (first failure)") -eq 1 ]] || fail "killed worker: the root cause should be printed once (by node 0): $out"
grep -q "dtrain: job failed: rank 3 on n2 (node 1) died of SIGKILL, exit code 137" <<<"$out" || fail "killed worker: node 1's one-line summary missing: $out"
grep -q "host       : n2" <<<"$out" || fail "killed worker: root cause does not name n2: $out"
grep -q "rank       : 3 (local rank 1)" <<<"$out" || fail "killed worker: rank 3 not named: $out"
grep -q "signal     : SIGKILL" <<<"$out" || fail "killed worker: SIGKILL not named: $out"
((took < 60)) || fail "killed worker: took $took s"
for h in n1 n2; do
  wait_gone "$h" "$W" 10 || fail "killed worker: workers left on $h: $(leftovers "$h" "$W")"
  wait_gone "$h" "$DTRAIN" 10 || fail "killed worker: agents left on $h: $(leftovers "$h" "$DTRAIN")"
done
pass "a worker SIGKILLed on n2: exit 137 in $took s, root cause host n2 rank 3, nothing left on either host"

# 6 -------------------------------------------------------------------------------------
t=$SECONDS
bg_on n1 "$T/term.out" "$DTRAIN" run --hostfile "$T/hosts.txt" "${SSH_OPTS[@]}" "$W" --sleep 300
driver=$BG_PID
deadline=$((SECONDS + 60))
until [[ $(count "$(cat "$T/term.out")" "sum=10") -eq 4 ]]; do
  ((SECONDS < deadline)) || fail "SIGTERM: the 4 workers did not start in 60 s: $(cat "$T/term.out")"
  sleep 0.2
done
kill -TERM "$driver"
deadline=$((SECONDS + 30))
while kill -0 "$driver" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "SIGTERM: the launching dtrain did not exit in 30 s: $(cat "$T/term.out")"
  sleep 0.1
done
wait "$driver"
code=$?
[[ $code -eq 143 ]] || fail "SIGTERM: exit $code, expected 143: $(cat "$T/term.out")"
for h in n1 n2; do
  wait_gone "$h" "$W" 15 || fail "SIGTERM: workers left on $h: $(leftovers "$h" "$W")"
  wait_gone "$h" "$DTRAIN" 15 || fail "SIGTERM: agents left on $h: $(leftovers "$h" "$DTRAIN")"
done
pass "SIGTERM to the launching dtrain: exit 143, the agents on n1 and n2 stopped every worker ($((SECONDS - t)) s)"

# 7 -------------------------------------------------------------------------------------
check_bad() {
  local text="$1" want="$2"
  printf '%b' "$text" >"$T/bad.txt"
  out="$(on n1 timeout 30 "$DTRAIN" run --hostfile "$T/bad.txt" "${SSH_OPTS[@]}" "$TW" --touch "$T/ran" 2>&1)"
  code=$?
  [[ $code -eq 2 ]] || fail "bad host file '$text': exit $code, expected 2: $out"
  grep -qF -- "$want" <<<"$out" || fail "bad host file '$text': message lacks '$want': $out"
  [[ ! -e "$T/ran" ]] || fail "bad host file '$text': the program ran"
}
check_bad 'n1 slots=2\nn2 slots=x\n' "line 2: 'n2 slots=x': slots must be a positive integer"
check_bad 'n1 slots=2\nn1 slots=2\n' "host 'n1' appears twice"
check_bad 'n1 gpus=2\n' "unexpected 'gpus=2'"
check_bad '# only a comment\n' "no hosts in it"
out="$(on n1 timeout 30 "$DTRAIN" run --hostfile "$T/missing.txt" "$TW" 2>&1)"
[[ $? -eq 2 ]] && grep -q "cannot read" <<<"$out" || fail "missing host file: $out"
pass "bad host files: exit 2 naming the line and what is wrong; nothing ran"

# 8 -------------------------------------------------------------------------------------
# A master address that n2 cannot reach: n2's agent names the address and what to do.
t=$SECONDS
out="$(on n1 timeout 60 "$DTRAIN" run --hostfile "$T/hosts.txt" "${SSH_OPTS[@]}" --master-addr 10.200.0.9 \
  --rdzv-timeout 3 "$TW" 2>&1)"
code=$?
[[ $code -ne 0 ]] || fail "unreachable master: exit 0: $out"
grep -q "node 1 (n2) cannot reach the job's store at 10.200.0.9:29500 on node 0" <<<"$out" || fail "unreachable master: message: $out"
grep -q "give node 0's address with --master-addr" <<<"$out" || fail "unreachable master: no advice: $out"
for h in n1 n2; do wait_gone "$h" "$DTRAIN" 15 || fail "unreachable master: agents left on $h: $(leftovers "$h" "$DTRAIN")"; done
pass "a master address n2 cannot reach: n2 names it and the fix, exit $code, nothing left ($((SECONDS - t)) s)"

# 9 -------------------------------------------------------------------------------------
# The launching dtrain SIGKILLed: its end of every ssh's stdin closes, each agent sees EOF
# and stops its workers; nothing is left on either host.
t=$SECONDS
bg_on n1 "$T/kill.out" "$DTRAIN" run --hostfile "$T/hosts.txt" "${SSH_OPTS[@]}" "$W" --sleep 300
driver=$BG_PID
deadline=$((SECONDS + 60))
until [[ $(count "$(cat "$T/kill.out")" "sum=10") -eq 4 ]]; do
  ((SECONDS < deadline)) || fail "SIGKILL: the 4 workers did not start in 60 s: $(cat "$T/kill.out")"
  sleep 0.2
done
kill -KILL "$driver"
wait "$driver" 2>/dev/null
for h in n1 n2; do
  wait_gone "$h" "$W" 30 || fail "SIGKILL of the launcher: workers left on $h: $(leftovers "$h" "$W")"
  wait_gone "$h" "$DTRAIN" 30 || fail "SIGKILL of the launcher: agents left on $h: $(leftovers "$h" "$DTRAIN")"
  wait_gone "$h" "ssh -F" 30 || fail "SIGKILL of the launcher: ssh clients left on $h: $(leftovers "$h" "ssh -F")"
done
pass "the launching dtrain SIGKILLed: agents, workers and ssh clients on n1 and n2 all gone ($((SECONDS - t)) s)"

# 10 ------------------------------------------------------------------------------------
t=$SECONDS
DSW="$B/tests/ds_env_worker"
[[ -x "$DSW" ]] || fail "$DSW is not built: run scripts/setup.sh"
printf '# DeepSpeed hostfile\nn1 slots=2\nn2 slots=2\n' >"$T/ds_hosts.txt"
out="$(on n1 timeout 120 "$DTRAIN" deepspeed -H "$T/ds_hosts.txt" --include "n1:1@n2" \
  --ssh_port "$SSH_PORT" --ssh-identity "$SSH_KEY" --ssh-arg=-F --ssh-arg="$SSH_CONFIG" \
  --master_port 29611 --no_python "$DSW" x 2>&1)" || fail "dtrain deepspeed over ssh exited $?: $out"
# Each worker's JSON line: rank, host-side variables and argv, checked in one place.
python3 - "$out" <<'PY' || fail "dtrain deepspeed over ssh: $out"
import json, sys
seen = {}
for line in sys.argv[1].splitlines():
    if "{" in line:
        j = json.loads(line[line.index("{"):])
        e = j["env"]
        seen[int(e["RANK"])] = (e["LOCAL_RANK"], e["LOCAL_SIZE"], e["CROSS_RANK"], e["CROSS_SIZE"],
                                e["WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"], e["MASTER_ADDR"],
                                e["MASTER_PORT"], j["argv"][1:],
                                any(k.startswith("TORCHELASTIC") for k in e))
# LOCAL_RANK is RANK % LOCAL_SIZE, as DeepSpeed's launch.py computes it: n2's ranks 1 and 2 get
# 1 and 0 (hosts of 1 and 2 slots).
want = {0: ("0", "1", "0", "2", "3", "1", "n1", "29611", ["--local_rank=0", "x"], False),
        1: ("1", "2", "1", "2", "3", "0,1", "n1", "29611", ["--local_rank=1", "x"], False),
        2: ("0", "2", "1", "2", "3", "0,1", "n1", "29611", ["--local_rank=0", "x"], False)}
if seen != want:
    sys.exit("got %s\nwant %s" % (seen, want))
PY
for h in n1 n2; do wait_gone "$h" "$DSW" 10 || fail "dtrain deepspeed: workers left on $h"; done
pass "dtrain deepspeed -H (n1, n2) --include n1:1@n2 over ssh: 3 ranks with DeepSpeed's variables ($((SECONDS - t)) s)"

echo "ssh tests passed in $((SECONDS - start)) s"
