#!/usr/bin/env bash
# Slurm on two hosts (network namespaces n1, n2): slurmctld on n1, slurmd on n1 and n2.
#   slurm_test.sh BUILD_DIR DTRAIN CLUSTER_WORKER TEST_WORKER
# 1. srun -N2 -n4 cluster_worker: init_process_group() from SLURM_*; 4-rank all-reduce.
# 2. srun --ntasks-per-node=1 dtrain run --nproc-per-node 2: node list, node rank and master
#    from Slurm; rank-prefixed logs of both nodes on srun's console.
# 3. The same from an sbatch script.
# 4. A worker SIGKILLed on n2 ends the job on both nodes with its root cause (host n2, rank 3,
#    SIGKILL); no worker is left on either node.
# 5. scancel of a running dtrain job leaves no process on either node.
# 6. --dry-run under srun prints the plan; srun -n4 dtrain run (4 agents on 2 nodes) is a clear
#    error, exit code 2; --ifname reaches the workers, a missing interface is named, and a node
#    that fails before joining cancels the step.
# 7. The Fashion-MNIST example on 2 nodes x 2 processes (sbatch, 1 epoch, accuracy >= 0.80).
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" W="$3" TW="$4"
for f in "$DTRAIN" "$W" "$TW"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
cluster_init
start=$SECONDS
hosts_up
slurm_up
echo "slurm cluster up in $((SECONDS - start)) s"

count() { grep -c -- "$2" <<<"$1" || true; }

# 1 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 srun -N2 -n4 --kill-on-bad-exit=1 "$W" 2>&1)" || fail "srun -n4 cluster_worker exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "srun -n4: expected 4 ranks to all-reduce to 10: $out"
for r in 0 1; do grep -q "rank=$r world=4 local_rank=$r local_world=2 host=n1 master=n1:" <<<"$out" || fail "srun -n4: rank $r not on n1: $out"; done
for r in 2 3; do grep -q "rank=$r world=4 local_rank=$((r - 2)) local_world=2 host=n2 master=n1:" <<<"$out" || fail "srun -n4: rank $r not on n2: $out"; done
pass "srun -N2 -n4 cluster_worker: 4 ranks on n1,n2 formed a group from SLURM_* ($((SECONDS - t)) s)"

# 2 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 srun -N2 --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 2 "$W" 2>&1)" ||
  fail "srun dtrain run exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "srun dtrain run: expected 4 ranks summing to 10: $out"
for r in 0 1; do grep -q "^\[default$r\]:cluster_worker rank=$r world=4 .*host=n1 master=n1:" <<<"$out" || fail "srun dtrain run: rank $r: $out"; done
for r in 2 3; do grep -q "^\[default$r\]:cluster_worker rank=$r world=4 .*host=n2 master=n1:" <<<"$out" || fail "srun dtrain run: rank $r: $out"; done
pass "srun --ntasks-per-node=1 dtrain run --nproc-per-node 2: ranks 0-1 on n1, 2-3 on n2, prefixed ($((SECONDS - t)) s)"

out="$(on n1 timeout 120 srun -N2 --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 1 --ifname eth0 \
  "$TW" --print-var GLOO_SOCKET_IFNAME 2>&1)" || fail "srun dtrain run --ifname eth0 exited $?: $out"
[[ $(count "$out" "GLOO_SOCKET_IFNAME=eth0") -eq 2 ]] || fail "--ifname eth0: workers lack GLOO_SOCKET_IFNAME=eth0: $out"
out="$(on n1 timeout 120 srun -N2 --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 1 --ifname wlan9 "$TW" 2>&1)"
code=$?
# The agent exits 2 after cancelling the step; srun reports the step's worst end (often an
# agent killed by the cancel, which may be the failing one itself).
[[ $code -ne 0 ]] || fail "--ifname wlan9: srun exited 0: $out"
grep -q "this host (n2) has no network interface 'wlan9'" <<<"$out" || fail "--ifname wlan9: message: $out"
pass "srun dtrain run --ifname eth0 gives workers GLOO_SOCKET_IFNAME; a missing interface: agent exit 2 naming the host"

# An interface only n1 has: n2's agent fails before it joins; it cancels the step (scancel),
# so n1's agent does not wait for it until the rendezvous timeout.
ip -n "$NS1" link add extra0 type veth peer name extra1 || fail "ip link add extra0"
t=$SECONDS
out="$(on n1 timeout 120 srun -N2 --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 1 --ifname extra0 "$TW" --sleep 100 2>&1)"
code=$?
took=$((SECONDS - t))
[[ $code -ne 0 ]] || fail "--ifname extra0 (n1 only): srun exited 0: $out"
grep -q "this host (n2) has no network interface 'extra0'" <<<"$out" || fail "--ifname extra0: message: $out"
# The agent's own "cancelling Slurm step" line can be lost when the cancel aborts the step's
# output; Slurm's report of the cancel is there either way.
grep -q "cancelling Slurm step\|CANCELLED" <<<"$out" || fail "--ifname extra0: the step was not cancelled: $out"
((took < 30)) || fail "--ifname extra0: the job took $took s to end"
for h in n1 n2; do wait_gone "$h" "$DTRAIN" 15 || fail "--ifname extra0: agents left on $h: $(leftovers "$h" "$DTRAIN")"; done
pass "a node that fails before joining cancels the step: srun ended in $took s (exit $code), nothing left"

# 3 -------------------------------------------------------------------------------------
t=$SECONDS
cat >"$T/job.sh" <<EOF
#!/bin/sh
#SBATCH -N 2
srun --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 2 "$W"
EOF
on n1 timeout 120 sbatch -W -o "$T/job.out" "$T/job.sh" >"$T/sbatch.log" 2>&1 || fail "sbatch -W exited $?: $(cat "$T/sbatch.log" "$T/job.out")"
out="$(cat "$T/job.out")"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "sbatch: expected 4 ranks summing to 10: $out"
grep -q "^\[default3\]:cluster_worker rank=3 .*host=n2" <<<"$out" || fail "sbatch: rank 3 not on n2: $out"
pass "sbatch script with srun dtrain run: 4 ranks on 2 nodes ($((SECONDS - t)) s)"

# 4 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 srun -N2 --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 2 "$W" \
  --kill-self-on-rank 3 --sleep 120 2>&1)"
code=$?
took=$((SECONDS - t))
[[ $code -eq 137 ]] || fail "killed worker: srun exited $code, expected 137 (128 + SIGKILL): $out"
[[ $(count "$out" "root cause (first failure)") -eq 1 ]] || fail "killed worker: the root cause should be printed once (by node 0): $out"
grep -q "dtrain: job failed: rank 3 on n2 (node 1) died of SIGKILL, exit code 137" <<<"$out" || fail "killed worker: node 1's one-line summary missing: $out"
grep -q "host       : n2" <<<"$out" || fail "killed worker: root cause does not name host n2: $out"
grep -q "rank       : 3 (local rank 1)" <<<"$out" || fail "killed worker: root cause does not name rank 3: $out"
grep -q "signal     : SIGKILL" <<<"$out" || fail "killed worker: root cause does not name SIGKILL: $out"
grep -q "killing myself with SIGKILL" <<<"$out" || fail "killed worker: rank 3's stderr tail missing: $out"
((took < 60)) || fail "killed worker: the job took $took s to end (the others sleep 120 s)"
for h in n1 n2; do wait_gone "$h" "$W" 10 || fail "killed worker: left on $h: $(leftovers "$h" "$W")"; done
pass "a worker SIGKILLed on n2 ended the job on both nodes in $took s, root cause host n2 rank 3, no worker left"

# 5 -------------------------------------------------------------------------------------
t=$SECONDS
cat >"$T/long.sh" <<EOF
#!/bin/sh
#SBATCH -N 2
srun --ntasks-per-node=1 "$DTRAIN" run --nproc-per-node 2 "$W" --sleep 300
EOF
job="$(on n1 sbatch --parsable -o "$T/long.out" "$T/long.sh" 2>&1)" || fail "sbatch: $job"
deadline=$((SECONDS + 60))
until [[ $(count "$(cat "$T/long.out" 2>/dev/null)" "sum=10") -eq 4 ]]; do
  ((SECONDS < deadline)) || fail "scancel: the job's 4 workers did not start in 60 s: $(cat "$T/long.out")"
  sleep 0.2
done
on n1 scancel "$job" || fail "scancel $job failed"
for h in n1 n2; do
  wait_gone "$h" "$W" 30 || fail "scancel: workers left on $h: $(leftovers "$h" "$W")"
  wait_gone "$h" "$DTRAIN" 30 || fail "scancel: agents left on $h: $(leftovers "$h" "$DTRAIN")"
done
pass "scancel of a running dtrain job: no agent or worker left on n1 or n2 ($((SECONDS - t)) s)"

# 6 -------------------------------------------------------------------------------------
out="$(on n1 timeout 60 srun -N2 --ntasks-per-node=1 "$DTRAIN" run --dry-run --nproc-per-node 2 "$TW" 2>&1)" ||
  fail "dry run exited $?: $out"
grep -q "engine     : slurm" <<<"$out" || fail "dry run: no engine line: $out"
grep -q "node 0     : n1, ranks 0-1 (2 workers)" <<<"$out" || fail "dry run: node 0 plan: $out"
grep -q "node 1     : n2, ranks 2-3 (2 workers) <- this node" <<<"$out" || fail "dry run: node 1 plan: $out"
grep -q "master     : n1:2" <<<"$out" || fail "dry run: master: $out"
leftovers_n2="$(leftovers n2 "$TW")"
[[ -z "$leftovers_n2" ]] || fail "dry run started workers: $leftovers_n2"
pass "srun dtrain run --dry-run prints the plan from Slurm and starts nothing"

out="$(on n1 timeout 60 srun -N2 -n4 "$DTRAIN" run --nproc-per-node 2 "$TW" 2>&1)"
code=$?
[[ $code -eq 2 ]] || fail "srun -n4 dtrain run: exit $code, expected 2: $out"
grep -q "needs one task per node" <<<"$out" || fail "srun -n4 dtrain run: message: $out"
grep -q "4 tasks on 2 node(s)" <<<"$out" || fail "srun -n4 dtrain run: message: $out"
pass "srun -n4 dtrain run (4 agents on 2 nodes): exit 2 naming the fix"

# 7 -------------------------------------------------------------------------------------
# The Fashion-MNIST example on 2 nodes x 2 processes, from an sbatch script (1 epoch).
FM="$B/examples/fashion_mnist"
[[ -x "$FM" ]] || fail "$FM is not built: run scripts/setup.sh"
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "dataset-fashion-mnist is not installed: run scripts/setup.sh"
t=$SECONDS
printf '#!/bin/sh\n#SBATCH -N 2\nsrun --ntasks-per-node=1 "%s" run --nproc-per-node 2 "%s" --epochs 1 --log-every 100\n' \
  "$DTRAIN" "$FM" >"$T/fm.sh"
on n1 timeout 300 sbatch -W -o "$T/fm.out" "$T/fm.sh" >"$T/sbatch.log" 2>&1 || fail "Fashion-MNIST sbatch exited $?: $(cat "$T/sbatch.log" "$T/fm.out")"
out="$(cat "$T/fm.out")"
json="$(grep -o '{.*"test_accuracy".*}' <<<"$out" | tail -1)"
[[ -n "$json" ]] || fail "Fashion-MNIST: no result line: $out"
/usr/bin/python3 -c '
import json, sys
r = json.loads(sys.argv[1])
assert r["world_size"] == 4, r
assert r["test_accuracy"] >= 0.80, r
print("fashion_mnist on 2 nodes x 2: world_size %d, test accuracy %.4f, %.0f samples/s" % (r["world_size"], r["test_accuracy"], r["samples_per_s"]))
' "$json" || fail "Fashion-MNIST result: $json"
grep -q "^\[default0\]:epoch 1 test accuracy" <<<"$out" || fail "Fashion-MNIST: rank 0's progress missing: $out"
pass "Fashion-MNIST example, 2 nodes x 2 processes under sbatch + srun dtrain run ($((SECONDS - t)) s)"

echo "slurm tests passed in $((SECONDS - start)) s"
