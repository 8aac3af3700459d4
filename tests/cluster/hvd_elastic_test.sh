#!/usr/bin/env bash
# Elastic `dtrain horovodrun` across two hosts (network namespaces n1, n2 with sshd): the
# driver runs on n1, its discovery script lists n1:1 and n2:1; n1's agent is its child, n2's
# starts over ssh. Rank 1 SIGKILLs itself mid-training: its host leaves the job (blacklisted),
# the other host's worker rolls back to the last commit and finishes alone (size 1); the
# driver exits 0, and no worker, agent or in-memory commit is left on either host.
#   hvd_elastic_test.sh BUILD_DIR DTRAIN HVD_ELASTIC_WORKER
source "$(dirname "$0")/lib.sh"
B="$1" DTRAIN="$2" W="$3"
for f in "$DTRAIN" "$W"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
cluster_init
start=$SECONDS
hosts_up
sshd_up
echo "hosts and sshd up in $((SECONDS - start)) s"

printf '#!/bin/sh\necho n1:1\necho n2:1\n' >"$T/discover.sh"
chmod 755 "$T/discover.sh"
t=$SECONDS
out="$(on n1 timeout 120 "$DTRAIN" horovodrun --min-np 1 --max-np 2 --host-discovery-script "$T/discover.sh" \
  --network-interface eth0 --elastic-timeout 30 -p "$SSH_PORT" -i "$SSH_KEY" --ssh-arg -F --ssh-arg "$SSH_CONFIG" \
  "$W" "$T/params.pt" 1 2>&1)"
code=$?
grep -E "elastic: |start rank=|done rank=" <<<"$out" | cut -c1-160  # the driver's story, for the log
[[ $code -eq 0 ]] || fail "elastic horovodrun over ssh: exit $code: $out"
grep -q "started the agent for n2 (1 process(es), pid [0-9]*, over ssh)" <<<"$out" || fail "n2's agent did not start over ssh: $out"
grep -q "started the agent for n1 (1 process(es), pid [0-9]*)" <<<"$out" || fail "n1's agent did not start here: $out"
for r in 0 1; do
  grep -q "start rank=$r size=2 attempt=0" <<<"$out" || fail "rank $r did not start at size 2: $out"
done
grep -q "is blacklisted" <<<"$out" || fail "the failed host was not blacklisted: $out"
grep -q "start rank=0 size=1 attempt=1 step=[1-9]" <<<"$out" || fail "the survivor did not resume from a commit at size 1: $out"
grep -q "^.*done rank=0 size=1" <<<"$out" || fail "the job did not finish at size 1: $out"
[[ -s "$T/params.pt" ]] || fail "rank 0 wrote no parameters: $out"
nothing_left "elastic horovodrun over ssh" "$W"
run_id="$(grep -o 'job hvd-elastic-[0-9]*-[0-9]*' <<<"$out" | head -1 | cut -d' ' -f2)"
[[ -n "$run_id" ]] || fail "the driver did not name its job: $out"
left="$(ls -d /dev/shm/dtrain-hvd-elastic-*-"$run_id"-* 2>/dev/null)"
[[ -z "$left" ]] || fail "in-memory commits left: $left"
pass "elastic horovodrun, hosts n1 (here) and n2 (ssh): rank 1 killed, finished at size 1 from the last commit; nothing left ($((SECONDS - t)) s)"
