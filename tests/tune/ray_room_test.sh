#!/usr/bin/env bash
# A Tune search on the ray engine grows into room that appears during it, up to
# max_concurrent_trials, without waiting for a trial to end - as Ray Tune starts a pending trial
# once the cluster has its resources. A real Ray cluster of separate hosts (tests/ray/lib.sh:
# the head on n0, where the driver runs, 0 CPUs; network namespaces, root) starts with one worker
# node of 1 CPU on n1: the Tuner starts with 1 trial at a time (5 trials of 1 process,
# max_concurrent_trials 3). While the first trial runs (held until two more started beside it),
# a worker node of 4 CPUs joins on n2. With trials waiting, the Tuner asks the cluster again
# every 10 s and grows to 3 trials at a time, capped (the 5 CPUs would hold 4 or 5), while the
# first trial is still held. The trials' own timestamps show two trials started before the first
# one ended, 3 at once and never 4, and trials ran on n2. Fails (never skips) when root or ray
# is missing.
#   ray_room_test.sh DTRAIN TUNE_CLUSTER_SEARCH
source "$(dirname "$0")/../ray/lib.sh"
source "$(dirname "$0")/room_lib.sh"
DTRAIN="$(realpath "$1")" SEARCH="$(realpath "$2")"
for f in "$DTRAIN" "$SEARCH"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
export DTRAIN_LAUNCHER="$DTRAIN"
ray_init
t_all=$SECONDS
ray_hosts_up 1 n1
gate1="$T/trial1_may_end"
bg_on n0 "$T/search.out" timeout 300 "$SEARCH" --storage "$T/tune" --engine ray --ray-address "$RAY_GCS" \
  --trials 5 --nproc 1 --iterations 2 --sleep 1 --max-concurrent 3 --hold "1:$gate1"
search=$BG_PID
search_says "^tune: [0-9]* trial(s) at a time on engine ray" 120 "sizing its trials"
grep -q "^tune: 1 trial(s) at a time on engine ray (1 free of 1 slots; 1 process(es) each)$" "$T/search.out" ||
  fail "the Tuner did not start with 1 trial at a time from n1's 1 CPU: $(cat "$T/search.out")"
# The first trial's worker runs (it holds n1's CPU) before the room appears.
deadline=$((SECONDS + 60))
until compgen -G "$T/tune/*/*_00000_*/origin_*" >/dev/null; do
  kill -0 "$search" 2>/dev/null || fail "the search ended before its first trial started: $(cat "$T/search.out")"
  ((SECONDS < deadline)) || fail "the first trial did not start within 60 s: $(cat "$T/search.out")"
  sleep 0.2
done
# The room appears while the first trial runs: a worker node of 4 CPUs on n2.
ray_node_up n2 4
echo "n2's node joined the cluster $((SECONDS - t_all)) s in"
search_says "^tune: now " 60 "asking the cluster again (while the first trial is held)"
room_finish ray
# Nothing of the search left on any host within 30 s (ray_down then checks every process).
OURS="^($DTRAIN|$SEARCH)( |\$)|dtrain/ray\.py( |\$)"
deadline=$((SECONDS + 30))
for h in n0 n1 n2; do
  while [[ -n "$(host_procs $h "$OURS")" ]]; do
    ((SECONDS < deadline)) || fail "tune on ray: processes left on $h 30 s after the search ended: $(host_procs $h "$OURS")"
    sleep 0.3
  done
done
pass "Tuner on Ray: 1 trial at a time on n1's 1 CPU, 3 at a time (max_concurrent_trials) once n2's 4 CPUs joined mid-search, before any trial ended; nothing left ($((SECONDS - t_all)) s)"
