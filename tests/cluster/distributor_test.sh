#!/usr/bin/env bash
# The Distributor with local_mode = false on real engines, two hosts (network namespaces n1,
# n2): the driver runs on n1, hosts its store there, and the nodes connect back to it.
#   distributor_test.sh BUILD_DIR DTRAIN DISTRIBUTOR_DRIVER
# 1. ssh host list n1:2,n2:2: every rank's result comes back to the driver (run_all).
# 2. ssh: rank 3 (on n2) throws: WorkerError with rank 3, the type and message; nothing left.
#    Rank 3 crashing (SIGSEGV): WorkerError with rank 3, the signal and host n2 (the root cause
#    comes back through --failure-store: the failure file is written on n2).
# 2b. Elastic over ssh (min_nodes 1, max_nodes 2; issue #15): n2's agent SIGKILLed in the
#    first attempt; n1 goes on alone at world size 2 and run_all returns its 2 ranks (a 2 s
#    heartbeat timeout through ClusterOptions::heartbeat_timeout: n2 counts as lost sooner).
#    Elastic on Slurm (srun -N 2 --no-kill, agents --nnodes 1:2): the same drill.
# 3. Slurm, 2 nodes x 2 processes: every rank's result.
# 4. Slurm: rank 2 (on n2) throws: WorkerError; nothing left on either node.
# 5. num_processes that does not fit the hosts: UsageError (exit 2), nothing started.
# 6. Open MPI's mpirun across n1,n2 (its ssh to each host's sshd): every rank's result; rank 3
#    (on n2) throwing is a WorkerError; nothing left.
# 7. MPICH's mpiexec.hydra on one host: every rank's result; a .py in program mode runs
#    through python3.
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" D="$3"
for f in "$DTRAIN" "$D"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
cluster_init
start=$SECONDS
hosts_up
sshd_up
slurm_up
echo "hosts, sshd and slurm up in $((SECONDS - start)) s"
SSH=(--ssh-port "$SSH_PORT" --ssh-identity "$SSH_KEY" --ssh-arg -F --ssh-arg "$SSH_CONFIG")

check_results() {
  local what="$1" out="$2"
  for r in 0 1; do grep -q "^result rank=$r host=n1 sum=10$" <<<"$out" || fail "$what: rank $r on n1: $out"; done
  for r in 2 3; do grep -q "^result rank=$r host=n2 sum=10$" <<<"$out" || fail "$what: rank $r on n2: $out"; done
}
# worker_error WHAT RANK OUT CODE: the driver exited 1 naming RANK (on n2) and its exception.
worker_error() {
  local what="$1" rank="$2" out="$3" code="$4"
  [[ $code -eq 1 ]] || fail "$what: exit $code, expected 1: $out"
  grep -q "^WorkerError rank=$rank type=std::runtime_error message=failing on purpose on rank $rank at n2$" <<<"$out" ||
    fail "$what: WorkerError: $out"
}

# 1 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine ssh --hosts n1:2,n2:2 "${SSH[@]}" 2>&1)" || fail "ssh: exit $?: $out"
check_results "ssh" "$out"
nothing_left "ssh" "$D"
pass "Distributor over ssh (n1:2,n2:2): 4 ranks' results back at the driver on n1 ($((SECONDS - t)) s)"

# 2 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine ssh --hosts n1:2,n2:2 "${SSH[@]}" --fail-rank 3 2>&1)"
worker_error "ssh failure" 3 "$out" $?
nothing_left "ssh failure" "$D"
pass "Distributor over ssh: rank 3 throwing on n2 is a WorkerError naming it; nothing left ($((SECONDS - t)) s)"
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine ssh --hosts n1:2,n2:2 "${SSH[@]}" --crash-rank 3 2>&1)"
code=$?
[[ $code -eq 1 ]] || fail "ssh crash: exit $code, expected 1: $out"
grep -q "^WorkerCrash rank=3 signal=11 host=n2$" <<<"$out" || fail "ssh crash: $out"
nothing_left "ssh crash" "$D"
pass "Distributor over ssh: rank 3 crashing on n2 comes back with its rank, SIGSEGV and host ($((SECONDS - t)) s)"

# 2b ------------------------------------------------------------------------------------
# elastic_shrunk WHAT OUT: both results from n1 at world size 2 (sum 1+2), none from n2.
elastic_shrunk() {
  local what="$1" out="$2"
  for r in 0 1; do grep -q "^result rank=$r host=n1 sum=3$" <<<"$out" || fail "$what: rank $r on n1 at world size 2: $out"; done
  [[ $(grep -c "^result " <<<"$out") -eq 2 ]] || fail "$what: expected 2 results: $out"
}
ELASTIC=(--min-nodes 1 --max-nodes 2 --last-call 2 --heartbeat 2 --max-restarts 1 --kill-agent-on n2)
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine ssh --hosts n1:2,n2:2 "${SSH[@]}" "${ELASTIC[@]}" 2>&1)" ||
  fail "elastic ssh: exit $?: $out"
elastic_shrunk "elastic ssh" "$out"
grep -q "elastic job (--nnodes 1:2)" <<<"$out" || fail "elastic ssh: the driver does not say n2's agent ended: $out"
grep -q "round 0: 2 node(s)" <<<"$out" || fail "elastic ssh: the first round did not have both nodes: $out"
nothing_left "elastic ssh" "$D"
pass "Distributor over ssh, min_nodes 1 / max_nodes 2: n2's agent SIGKILLed, n1 finished alone at world size 2 ($((SECONDS - t)) s)"
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine slurm "${ELASTIC[@]}" 2>&1)" || fail "elastic slurm: exit $?: $out"
elastic_shrunk "elastic slurm" "$out"
nothing_left "elastic slurm" "$D"
grep -q "round 0: 2 node(s)" <<<"$out" || fail "elastic slurm: the first round did not have both nodes: $out"
pass "Distributor on Slurm, min_nodes 1 / max_nodes 2: n2's agent SIGKILLed, n1 finished alone at world size 2 ($((SECONDS - t)) s)"

# 3 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine slurm --nodes 2 2>&1)" || fail "slurm: exit $?: $out"
check_results "slurm" "$out"
nothing_left "slurm" "$D"
pass "Distributor on Slurm (2 nodes x 2): 4 ranks' results back at the driver ($((SECONDS - t)) s)"

# 4 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine slurm --nodes 2 --fail-rank 2 2>&1)"
worker_error "slurm failure" 2 "$out" $?
nothing_left "slurm failure" "$D"
pass "Distributor on Slurm: rank 2 throwing on n2 is a WorkerError naming it; nothing left ($((SECONDS - t)) s)"

# 5 -------------------------------------------------------------------------------------
out="$(on n1 timeout 60 "$D" --engine ssh --hosts n1:2,n2:2 --nproc 3 "${SSH[@]}" 2>&1)"
code=$?
[[ $code -eq 2 ]] || fail "bad num_processes: exit $code, expected 2: $out"
grep -q "num_processes is 3, but the 2 host(s) have 4 slots" <<<"$out" || fail "bad num_processes: message: $out"
[[ -z "$(leftovers n2 "$D")" ]] || fail "bad num_processes: started something on n2"
pass "num_processes that fits no host layout: UsageError, exit 2, nothing started"
# 6 -------------------------------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp
MPI=(--engine mpi --mpi-launcher mpirun.openmpi --mpi-arg --oversubscribe --mpi-arg --host --mpi-arg n1:2,n2:2
  --mpi-arg --mca --mpi-arg plm_rsh_agent --mpi-arg "$SSH_WRAPPER"
  --mpi-arg --mca --mpi-arg oob_tcp_if_include --mpi-arg 10.200.0.0/24)
t=$SECONDS
out="$(on n1 timeout 120 "$D" "${MPI[@]}" 2>&1)" || fail "mpirun: exit $?: $out"
check_results "mpirun" "$out"
nothing_left "mpirun" "$D"
out="$(on n1 timeout 120 "$D" "${MPI[@]}" --fail-rank 3 2>&1)"
worker_error "mpirun failure" 3 "$out" $?
nothing_left "mpirun failure" "$D"
pass "Distributor on Open MPI (mpirun --host n1:2,n2:2): results of 4 ranks; rank 3 throwing on n2 is a WorkerError ($((SECONDS - t)) s)"

# 7 -------------------------------------------------------------------------------------
t=$SECONDS
out="$(on n1 timeout 120 "$D" --engine mpi --mpi-launcher mpiexec.hydra 2>&1)" || fail "mpiexec.hydra: exit $?: $out"
for r in 0 1 2 3; do grep -q "^result rank=$r host=n1 sum=10$" <<<"$out" || fail "mpiexec.hydra: rank $r: $out"; done
nothing_left "mpiexec.hydra" "$D"
pass "Distributor on MPICH (mpiexec.hydra -np 4 on n1): results of 4 ranks ($((SECONDS - t)) s)"
t=$SECONDS
py="$(dirname "$0")/mpi_rank.py"
out="$(on n1 timeout 120 "$D" --engine mpi --mpi-launcher mpiexec.hydra --program "$py" 2>&1)" || fail "mpiexec.hydra .py: exit $?: $out"
for r in 0 1 2 3; do grep -q "py rank=$r python=3" <<<"$out" || fail "mpiexec.hydra .py: rank $r: $out"; done
grep -q "^program ok$" <<<"$out" || fail "mpiexec.hydra .py: $out"
pass "Distributor program mode on MPICH: a .py (not executable) runs through python3 on 4 ranks ($((SECONDS - t)) s)"
echo "distributor cluster tests took $((SECONDS - start)) s"
