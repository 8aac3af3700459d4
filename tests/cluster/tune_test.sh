#!/usr/bin/env bash
# tune::Tuner with local_mode = false: every trial a Distributor job on a cluster engine, two
# hosts (network namespaces n1, n2; tests/cluster/lib.sh). The driver runs on n1 and hosts
# the store the trials report to; their workers (one on n1, one on n2 per trial) reach it at
# n1's address.
#   tune_test.sh BUILD_DIR DTRAIN TUNE_CLUSTER_DRIVER
# 1. ssh host list n1:1,n2:1: 2 trials x 2 processes, 3 reports each; every report's
#    all-reduce spans both hosts (rank sum 3, one rank on n2); trial x=2's rank 1 (on n2)
#    throws once and the trial is restarted from its checkpoint (iteration 1) and finishes.
#    The search's state and checkpoints are in the storage path; nothing is left on n1 or n2.
# 2. Cluster options that do not fit the trials: UsageError (exit 2) before anything starts.
# 3. Engine mpi (MPICH's mpiexec.hydra on n1, no dtrain agent): the same search; report()
#    takes its rank from the MPI launcher's variables.
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" D="$3"
for f in "$DTRAIN" "$D"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
cluster_init
start=$SECONDS
hosts_up
sshd_up
echo "hosts and sshd up in $((SECONDS - start)) s"
SSH=(--ssh-port "$SSH_PORT" --ssh-identity "$SSH_KEY" --ssh-arg -F --ssh-arg "$SSH_CONFIG")

# 1 -------------------------------------------------------------------------------------
t=$SECONDS
storage="$T/tune"
out="$(on n1 timeout 180 "$D" --storage "$storage" --engine ssh --hosts n1:1,n2:1 "${SSH[@]}" 2>&1)" ||
  fail "tune over ssh: exit $?: $out"
grep -q "^trial [0-9a-f]\{5\}_00000 x=1 status=TERMINATED failures=0 iterations=3 rank_sum=3 on_n2=1 world=2 restored=0$" <<<"$out" ||
  fail "tune over ssh: trial x=1: $out"
grep -q "^trial [0-9a-f]\{5\}_00001 x=2 status=TERMINATED failures=1 iterations=3 rank_sum=3 on_n2=1 world=2 restored=1$" <<<"$out" ||
  fail "tune over ssh: trial x=2 (failed once on n2, restarted from its iteration-1 checkpoint): $out"
grep -q "injected failure on rank 1 at n2" <<<"$out" || fail "tune over ssh: the failure on n2 was not reported: $out"
[[ "$(cat "$storage"/tune/*_00001_*/failed_once 2>/dev/null)" == n2 ]] || fail "tune over ssh: the failing rank did not run on n2"
[[ -n "$(compgen -G "$storage/tune/*_00000_*/checkpoint_000002")" && -f "$storage/tune/tuner_state.json" && -f "$storage/tune/results.csv" ]] ||
  fail "tune over ssh: checkpoints or state missing under $storage/tune: $(ls -R "$storage/tune" | head -30)"
nothing_left "tune over ssh" "$D"
pass "Tuner over ssh (n1:1,n2:1): 2 trials of 2 ranks across both hosts; the trial failing on n2 restarted from its checkpoint; nothing left ($((SECONDS - t)) s)"

# 2 -------------------------------------------------------------------------------------
out="$(on n1 timeout 60 "$D" --storage "$T/tune-bad" --engine ssh --hosts n1:2,n2:2 --nproc 3 "${SSH[@]}" 2>&1)"
code=$?
[[ $code -eq 2 ]] || fail "bad processes: exit $code, expected 2: $out"
grep -q "tune::Tuner: the trials cannot run on cluster engine \"ssh\".*num_processes is 3, but the 2 host(s) have 4 slots" <<<"$out" ||
  fail "bad processes: message: $out"
[[ ! -e "$T/tune-bad" && -z "$(leftovers n2 "$DTRAIN")" ]] || fail "bad processes: started something"
out="$(on n1 timeout 60 "$D" --storage "$T/tune-bad" --engine yarn 2>&1)"
code=$?
[[ $code -eq 2 ]] || fail "unknown engine: exit $code, expected 2: $out"
grep -q "expected \"ssh\" (a host file or list), \"slurm\", \"mpi\", \"spark\" or \"ray\" (a Ray cluster)" <<<"$out" || fail "unknown engine: message: $out"
pass "trial_resources that fit no host layout, an unknown engine: UsageError, exit 2, nothing started"

# 3 -------------------------------------------------------------------------------------
t=$SECONDS
storage="$T/tune-mpi"
out="$(on n1 timeout 180 "$D" --storage "$storage" --engine mpi --mpi-launcher mpiexec.hydra 2>&1)" ||
  fail "tune on mpiexec.hydra: exit $?: $out"
grep -q "^trial [0-9a-f]\{5\}_00000 x=1 status=TERMINATED failures=0 iterations=3 rank_sum=3 on_n2=0 world=2 restored=0$" <<<"$out" ||
  fail "tune on mpiexec.hydra: trial x=1: $out"
grep -q "^trial [0-9a-f]\{5\}_00001 x=2 status=TERMINATED failures=1 iterations=3 rank_sum=3 on_n2=0 world=2 restored=1$" <<<"$out" ||
  fail "tune on mpiexec.hydra: trial x=2 (failed once, restarted from its checkpoint): $out"
nothing_left "tune on mpiexec.hydra" "$D"
pass "Tuner on MPICH (mpiexec.hydra -np 2 on n1): 2 trials; the failing one restarted from its checkpoint ($((SECONDS - t)) s)"
echo "tune cluster tests took $((SECONDS - start)) s"
