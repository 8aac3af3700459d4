#!/usr/bin/env bash
# Chaos soak: an elastic training job on two namespace hosts (tests/cluster/lib.sh) while a
# driver, at random intervals for DURATION, SIGKILLs workers and n2's agent, SIGSTOPs and
# SIGCONTs workers, takes n2's link down and up, and fills the disk the commits go to.
#   scripts/soak.sh DURATION [BUILD_DIR] [SEED]      (root; DURATION like 30m, 120s, 2m)
# The job: `dtrain run --nnodes 1:2 --rdzv-backend c10d` on n1 (hosting the store) and n2, the
# ElasticState worker with the ZeRO engine (tests/elastic/elastic_train_worker.cpp, float64,
# the same global batches at any world size), disk commits every 3 steps on an 8 MiB tmpfs.
# n1's agent is never attacked: it hosts the job's store, and losing it ends any c10d job (as
# torchrun's). n2's agent is started again whenever it died or gave up.
# At the end it checks, and fails unless: n1's agent exited 0; every sample of every epoch
# was trained on exactly once (each attempt counted up to where the next one resumed); the
# final parameters equal an uninterrupted run's (world size 1, same data) to 1e-9 relative;
# nothing is left - no worker or agent on either host, no new /dev/shm segment, the tmpfs
# and both namespaces gone; n1's agent's RSS and open files flat (last sample within 10 MiB /
# 4 fds of the first). It prints what it did: events by kind, attempts, recovery times (from
# an event to the next attempt's first step) p50/p99, RSS and fd samples.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/tests/cluster/lib.sh"
[[ $# -ge 1 ]] || { sed -n '2,18p' "$0"; exit 2; }
dur="$1"
case "$dur" in
  *m) DURATION=$((${dur%m} * 60)) ;;
  *s) DURATION=${dur%s} ;;
  *) DURATION=$dur ;;
esac
[[ "$DURATION" =~ ^[0-9]+$ && $DURATION -ge 30 ]] || fail "DURATION: got '$dur', expected 30s or more (e.g. 2m, 30m)"
B="${2:-$here/build}"
SEED="${3:-$RANDOM}"
RANDOM=$SEED
DTRAIN="$B/tools/dtrain" W="$B/tests/elastic_train_worker"
for f in "$DTRAIN" "$W"; do [[ -x "$f" ]] || fail "$f is not built: cmake --build $B -t dtrain_cli elastic_train_worker"; done
require python3 fallocate
shm_before="$(ls /dev/shm | sort)"
cluster_init
hosts_up
O="$T/soak"
L="$O/logs"
CK="$O/ckpt"
mkdir -p "$L" "$CK"
mount -t tmpfs -o size=8m tmpfs "$CK" || fail "mount tmpfs on $CK"
unmount_ckpt() { umount "$CK" 2>/dev/null; }
# cluster_down (lib.sh) stops everything and exits with the status it finds in $?; the tmpfs
# goes first, and the script's status is put back in $? for cluster_down (a failed run must
# not exit 0).
trap 'soak_rc=$?; unmount_ckpt; (exit "$soak_rc"); cluster_down' EXIT

# Sized to outlast DURATION (~0.08 s a step, 15 steps an epoch, plus the restarts), so the
# chaos runs the whole DURATION; the job then finishes undisturbed.
EPOCHS=$((DURATION > 3 ? DURATION : 3))
worker=("$W" --zero 1 --double --size 240 --batch 16 --epochs "$EPOCHS" --commit-every 3
  --step-sleep 0.05 --log-dir "$L" --checkpoint-dir "$CK" --params-out "$O/final_params")
common=(run --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint n1:29460 --rdzv-id soak
  --monitor-interval 0.1 --max-restarts 100000 --rdzv-timeout 20
  --rdzv-conf last_call_timeout=2,heartbeat_timeout=3)
EV="$O/events"
: >"$EV"
event() { echo "$(date +%s.%N) $*" >>"$EV"; echo "soak: $(date +%T) $*"; }

bg_on n1 "$O/n1.log" "$DTRAIN" "${common[@]}" "${worker[@]}"
A_PID=$BG_PID
wait_listen n1 29460 20 || fail "the agent on n1 did not open the store: $(cat "$O/n1.log")"
n2_runs=0
start_n2() {
  n2_runs=$((n2_runs + 1))
  bg_on n2 "$O/n2_$n2_runs.log" "$DTRAIN" "${common[@]}" "${worker[@]}"
  B_PID=$BG_PID
}
start_n2
deadline=$((SECONDS + 120))
until grep -q "world 2" "$O/n1.log" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "the job did not start on both hosts: $(cat "$O/n1.log" "$O/n2_1.log")"
  sleep 0.2
done
event start epochs=$EPOCHS seed=$SEED

# pids_on HOST PROGRAM: the PIDs in HOST's namespace running PROGRAM (their argv[0]). Not a
# match on the whole command line: the agent's holds the worker's path too, and n1's agent
# must never be picked.
pids_on() {
  local pid argv0 out=""
  for pid in $(ip netns pids "$(ns_of "$1")" 2>/dev/null); do
    argv0="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -1)"
    [[ "$argv0" == "$2" ]] && out+="$pid "
  done
  echo "$out"
}
pick() { local a=($1); ((${#a[@]})) && echo "${a[RANDOM % ${#a[@]}]}"; }
# fd_list PID: what each open fd of PID is (socket lines with their TCP ends, from ss in n1).
fd_list() {
  local fd target
  for fd in /proc/"$1"/fd/*; do
    target="$(readlink "$fd" 2>/dev/null)" || continue
    echo "${fd##*/} $target"
  done
  ip netns exec "$NS1" ss -tanpe 2>/dev/null | grep "pid=$1," | awk '{print "tcp", $1, $4, $5, $NF}'
}
sample() {  # RSS (KiB) and open fds of n1's agent; the first and last fd lists are kept
  local rss fds
  rss="$(awk '/VmRSS/ {print $2}' "/proc/$A_PID/status" 2>/dev/null)"
  fds="$(ls "/proc/$A_PID/fd" 2>/dev/null | wc -l)"
  [[ -n "$rss" ]] || return 0
  echo "$(date +%s) $rss $fds" >>"$O/agent_samples"
  [[ -f "$O/agent_fds_first" ]] || fd_list "$A_PID" >"$O/agent_fds_first"
  fd_list "$A_PID" >"$O/agent_fds_last"
}

chaos_start=$SECONDS
chaos_end=$((SECONDS + DURATION))
last_sample=0
while ((SECONDS < chaos_end)) && kill -0 "$A_PID" 2>/dev/null; do
  sleep "$((4 + RANDOM % 9)).$((RANDOM % 10))"
  kill -0 "$A_PID" 2>/dev/null || break
  if ((SECONDS - last_sample >= 10)); then sample; last_sample=$SECONDS; fi
  if ! kill -0 "$B_PID" 2>/dev/null; then
    wait "$B_PID" 2>/dev/null
    event restart_agent n2 "(its agent had exited $?)"
    start_n2
    continue
  fi
  host="$(pick "n1 n2")"
  case $((RANDOM % 10)) in
    0 | 1 | 2)
      pid="$(pick "$(pids_on "$host" "$W")")"
      [[ -n "$pid" ]] && { kill -KILL "$pid" 2>/dev/null; event kill_worker "$host" "$pid"; } ;;
    3 | 4)
      pid="$(pick "$(pids_on "$host" "$W")")"
      if [[ -n "$pid" ]]; then
        pause="$((1 + RANDOM % 4))"
        kill -STOP "$pid" 2>/dev/null && event stop_worker "$host" "$pid" "${pause}s"
        sleep "$pause"
        kill -CONT "$pid" 2>/dev/null
      fi ;;
    5)
      kill -KILL "$B_PID" 2>/dev/null && event kill_agent n2 "$B_PID"
      wait "$B_PID" 2>/dev/null
      sleep "$((2 + RANDOM % 6))"
      event restart_agent n2
      start_n2 ;;
    6 | 7)
      down="$((2 + RANDOM % 5))"
      ip -n "$NS2" link set eth0 down && event link_down n2 "${down}s"
      sleep "$down"
      ip -n "$NS2" link set eth0 up ;;
    8 | 9)
      # The next disk commit(s) fail with ENOSPC until the filler goes.
      fallocate -l 16M "$CK/.filler" 2>/dev/null || dd if=/dev/zero of="$CK/.filler" bs=64k 2>/dev/null
      full="$((3 + RANDOM % 5))"
      event disk_full "${full}s" "$(df --output=avail -k "$CK" | tail -1 | tr -d ' ')KiB free"
      sleep "$full"
      rm -f "$CK/.filler" ;;
  esac
done
event chaos_over
chaos_spent=$((SECONDS - chaos_start))
sample
if ! kill -0 "$B_PID" 2>/dev/null && kill -0 "$A_PID" 2>/dev/null; then
  wait "$B_PID" 2>/dev/null
  start_n2
fi

wait_exit() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$1" 2>/dev/null; then RC=124; else wait "$1"; RC=$?; fi
}
wait_exit "$A_PID" $((DURATION + 600))
a_rc=$RC
event job_over "n1 agent exit $a_rc"
wait_exit "$B_PID" 60
[[ $a_rc -eq 0 ]] || fail "n1's agent exited $a_rc: $(tail -30 "$O/n1.log")"
for h in n1 n2; do
  wait_gone "$h" elastic_train_worker 15 || fail "workers left on $h: $(leftovers "$h" elastic_train_worker)"
  wait_gone "$h" "$DTRAIN" 15 || fail "agents left on $h: $(leftovers "$h" "$DTRAIN")"
done

# The uninterrupted reference: world size 1, no sleeps, fresh commits.
mkdir -p "$O/ref_logs" "$O/ref_ckpt"
on n1 "$DTRAIN" run --nproc-per-node 1 "$W" --zero 1 --double --size 240 --batch 16 --epochs "$EPOCHS" \
  --commit-every 1000000 --log-dir "$O/ref_logs" --checkpoint-dir "$O/ref_ckpt" --params-out "$O/ref_params" \
  >"$O/ref.log" 2>&1 || fail "the uninterrupted reference run failed: $(tail -20 "$O/ref.log")"

if PYTHONPATH="$here/tests/cluster" python3 - "$L" "$EPOCHS" "$EV" "$O/agent_samples" "$O/ref_params" "$O/final_params" <<'PY'
import collections, os, sys
import attempt_logs
logs, epochs, ev_path, samples_path, ref_path, final_path = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
att = attempt_logs.read(logs)
order = [n for n in sorted(att) if att[n]["resume"] is not None]
bad = attempt_logs.not_exactly_once(att, order, epochs, 240, 3)
if bad:
    sys.exit(f"samples not seen exactly once: {bad[:3]}")
print(f"exactly once: {epochs} epochs x 240 samples over {len(order)} attempts "
      f"(world sizes {collections.Counter(att[n]['world'] for n in order)})")

def params(path):
    return {f[0]: [float(x) for x in f[1:]] for f in (l.split() for l in open(path)) if f}
if not os.path.exists(final_path):
    sys.exit("no final parameters were written (rank 0's --params-out)")
got, ref = params(final_path), params(ref_path)
worst = 0.0
for k, vs in ref.items():
    scale = max(max(abs(v) for v in vs), 1e-12)
    worst = max(worst, max(abs(a - b) for a, b in zip(vs, got[k])) / scale)
print(f"final parameters vs the uninterrupted run: largest relative difference {worst:.3g}")
if worst > 1e-9:
    sys.exit(f"the final model differs from the uninterrupted run's by {worst:.3g} (> 1e-9)")

events = [l.split(None, 2) for l in open(ev_path)]
kinds = collections.Counter(e[1] for e in events if e[1] not in ("start", "chaos_over", "job_over"))
print("events: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
firsts = sorted(att[n]["first"] for n in order if att[n]["first"])
rec = []
for e in events:
    if e[1] in ("kill_worker", "kill_agent", "link_down", "disk_full", "stop_worker"):
        t = float(e[0])
        nxt = [f for f in firsts if f > t]
        if nxt:
            rec.append(nxt[0] - t)
if rec:
    rec.sort()
    p = lambda q: rec[min(len(rec) - 1, int(q * len(rec)))]
    print(f"recovery (event -> next attempt's first step): n={len(rec)} p50 {p(0.5):.2f} s p99 {p(0.99):.2f} s max {rec[-1]:.2f} s")
print(f"attempts: {len(order)}; steps done: {max(s for n in order for (s, e) in att[n]['steps'])}")
s = [l.split() for l in open(samples_path)]
if s:
    first, last = s[0], s[-1]
    peak = max(int(x[1]) for x in s)
    print(f"n1 agent: RSS {int(first[1]) // 1024} -> {int(last[1]) // 1024} MiB (peak {peak // 1024}), "
          f"open fds {first[2]} -> {last[2]}, {len(s)} samples")
    if int(last[1]) > int(first[1]) + 10 * 1024 or int(last[2]) > int(first[2]) + 4:
        sys.exit("n1's agent grew: RSS or open files not flat")
PY
then :
else
  [[ -f "$O/agent_fds_last" ]] &&
    echo "n1's agent's open files, first sample -> last (diff):" &&
    diff <(sort "$O/agent_fds_first") <(sort "$O/agent_fds_last") | head -60
  fail "checks failed (above)"
fi
shm_after="$(ls /dev/shm | sort)"
new_shm="$(comm -13 <(echo "$shm_before") <(echo "$shm_after"))"
[[ -z "$new_shm" ]] || fail "left in /dev/shm: $new_shm"
unmount_ckpt
mountpoint -q "$CK" && fail "the commit tmpfs is still mounted"
trap - EXIT
(cluster_down) # stops what is left and deletes the namespaces (it exits: in a subshell)
ip netns list | grep -q "dtc$ID" && { echo "FAIL: namespaces left: $(ip netns list | grep "dtc$ID")" >&2; exit 1; }
pass "soak of ${DURATION}s, chaos for ${chaos_spent}s (seed $SEED): every check above held; no namespace left"
