#!/usr/bin/env bash
# MPI launchers starting dtrain programs (we never link MPI; the launchers only start them).
#   mpi_test.sh BUILD_DIR DTRAIN CLUSTER_WORKER TEST_WORKER
# 1. Open MPI's mpirun -np 4 on one host: init_process_group() from OMPI_COMM_WORLD_*.
# 2. Open MPI across two hosts (namespaces n1, n2, mpirun's ssh to each host's sshd): ranks
#    2-3 on n2 reach rank 0's store at mpirun's address.
# 3. A rank SIGKILLed on n2: mpirun tears the job down and exits non-zero; no rank is left.
#    Rank 0 placed away from mpirun's host: a clear error, and mpirun ends the job.
# 4. MPICH's mpiexec.hydra -n 4 on one host: PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS.
# 5. MPICH across two hosts with MASTER_ADDR (Hydra does not say where rank 0 is), and without
#    it: a clear error.
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" W="$3" TW="$4"
for f in "$DTRAIN" "$W" "$TW"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
require mpirun.openmpi mpiexec.hydra
cluster_init
start=$SECONDS
count() { grep -c -- "$2" <<<"$1" || true; }
# As root, Open MPI wants both of these; btl self,tcp: no shared-memory transport between the
# namespace "hosts" of one machine (it hung in CLUSTERS.md's checks).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp

# 1 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(timeout 120 mpirun.openmpi --oversubscribe -np 4 "$W" 2>&1)" || fail "mpirun -np 4 exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "mpirun -np 4: expected 4 ranks summing to 10: $out"
for r in 0 1 2 3; do grep -q "rank=$r world=4 local_rank=$r local_world=4 .*master=127.0.0.1:" <<<"$out" || fail "mpirun: rank $r: $out"; done
pass "mpirun.openmpi -np 4 cluster_worker: a 4-rank dtrain group from OMPI_COMM_WORLD_* ($((SECONDS - t)) s)"

hosts_up
sshd_up
echo "hosts and sshd up"

# 2 -------------------------------------------------------------------------------------
t=$SECONDS
mpi2() {
  on n1 timeout 120 mpirun.openmpi --oversubscribe -np 4 --host n1:2,n2:2 \
    --mca plm_rsh_agent "$SSH_WRAPPER" --mca oob_tcp_if_include 10.200.0.0/24 \
    --mca btl_tcp_if_include 10.200.0.0/24 "$@"
}
out="$(mpi2 "$W" 2>&1)" || fail "mpirun across n1,n2 exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "mpirun n1,n2: expected 4 ranks summing to 10: $out"
for r in 0 1; do grep -q "rank=$r world=4 local_rank=$r local_world=2 host=n1 master=10.200.0.1:" <<<"$out" || fail "mpirun n1,n2: rank $r: $out"; done
for r in 2 3; do grep -q "rank=$r world=4 local_rank=$((r - 2)) local_world=2 host=n2 master=10.200.0.1:" <<<"$out" || fail "mpirun n1,n2: rank $r: $out"; done
pass "mpirun.openmpi --host n1:2,n2:2: ranks 2-3 on n2 joined rank 0's store on n1 ($((SECONDS - t)) s)"

# 3 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(mpi2 "$W" --kill-self-on-rank 3 --sleep 120 2>&1)"
code=$?
took=$((SECONDS - t))
[[ $code -ne 0 ]] || fail "killed rank: mpirun exited 0: $out"
grep -q "killing myself with SIGKILL" <<<"$out" || fail "killed rank: rank 3's stderr missing: $out"
grep -qi "signal 9\|Killed" <<<"$out" || fail "killed rank: mpirun does not report the signal: $out"
((took < 60)) || fail "killed rank: the job took $took s to end (the others sleep 120 s)"
for h in n1 n2; do wait_gone "$h" "$W" 15 || fail "killed rank: left on $h: $(leftovers "$h" "$W")"; done
pass "a rank SIGKILLed on n2: mpirun exited $code in $took s, no rank left on n1 or n2"

# 3b: rank 0 placed on n2 while mpirun runs on n1: rank 0 says where it is and what to set,
# and mpirun's teardown ends the others.
t=$SECONDS
printf 'rank 0=n2 slot=0\nrank 1=n2 slot=1\nrank 2=n1 slot=0\nrank 3=n1 slot=1\n' >"$T/rankfile"
out="$(on n1 timeout 120 mpirun.openmpi --oversubscribe -np 4 --host n1:2,n2:2 --rankfile "$T/rankfile" \
  --mca plm_rsh_agent "$SSH_WRAPPER" --mca oob_tcp_if_include 10.200.0.0/24 \
  --mca btl_tcp_if_include 10.200.0.0/24 "$W" 2>&1)"
code=$?
[[ $code -ne 0 ]] || fail "rank 0 off mpirun's host: mpirun exited 0: $out"
grep -q "Open MPI: rank 0 runs on n2, but mpirun runs on 10.200.0.1" <<<"$out" || fail "rank 0 off mpirun's host: no clear error: $out"
for h in n1 n2; do wait_gone "$h" "$W" 15 || fail "rank 0 off mpirun's host: left on $h: $(leftovers "$h" "$W")"; done
pass "rank 0 not on mpirun's host: a clear error naming both hosts and MASTER_ADDR, mpirun exited $code ($((SECONDS - t)) s)"

# 4 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(timeout 120 mpiexec.hydra -n 4 "$W" 2>&1)" || fail "mpiexec.hydra -n 4 exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "mpiexec.hydra: expected 4 ranks summing to 10: $out"
for r in 0 1 2 3; do grep -q "rank=$r world=4 local_rank=$r local_world=4 .*master=127.0.0.1:" <<<"$out" || fail "mpiexec.hydra: rank $r: $out"; done
pass "mpiexec.hydra -n 4 cluster_worker: a 4-rank dtrain group from PMI_* ($((SECONDS - t)) s)"

# 5 -------------------------------------------------------------------------------------
t=$SECONDS
hydra2() {
  on n1 timeout 120 mpiexec.hydra -hosts n1:2,n2:2 -n 4 -launcher ssh -launcher-exec "$SSH_WRAPPER" "$@"
}
out="$(hydra2 -genv MASTER_ADDR n1 -genv MASTER_PORT 29555 "$W" 2>&1)" || fail "mpiexec.hydra across n1,n2 exited $?: $out"
[[ $(count "$out" "sum=10 expected=10") -eq 4 ]] || fail "mpiexec.hydra n1,n2: expected 4 ranks summing to 10: $out"
for r in 2 3; do grep -q "rank=$r world=4 local_rank=$((r - 2)) local_world=2 host=n2 master=n1:29555" <<<"$out" || fail "hydra n1,n2: rank $r: $out"; done
out="$(hydra2 "$W" 2>&1)"
code=$?
[[ $code -ne 0 ]] || fail "mpiexec.hydra n1,n2 without MASTER_ADDR exited 0: $out"
grep -q "set MASTER_ADDR" <<<"$out" || fail "hydra without MASTER_ADDR: no clear error: $out"
for h in n1 n2; do wait_gone "$h" "$W" 15 || fail "hydra: left on $h: $(leftovers "$h" "$W")"; done
pass "mpiexec.hydra across n1,n2 with MASTER_ADDR; without it a clear error ($((SECONDS - t)) s)"

echo "mpi tests passed in $((SECONDS - start)) s"
