#!/usr/bin/env bash
# A Tune search over ssh keeps a warm fork server on every host (src/tune/warm_hosts.h): two
# hosts (network namespaces n1, n2 with their sshd; tests/cluster/lib.sh), the driver on n1,
# host list n1:2,n2:2, 4 trials x 2 processes (one on each host), 2 at a time (the hosts' 4
# slots). Checks:
#   - one warm server per host, started once for the search; every worker of every trial was
#     forked from its own host's server (its grandparent, through the launch server);
#   - trial x=2's rank on n2 SIGKILLs itself once: only that trial fails, and it is retried
#     from its checkpoint and finishes; the trial beside it is not disturbed;
#   - trials run two at a time (their own clocks), all-reduce across both hosts;
#   - after the search nothing is left on either host: no server, keeper, agent or worker, no
#     socket directory; nor after a driver SIGKILLed while 2 trials run.
# Then the same search cold (DTRAIN_TUNE_WARM_FORKSERVER=0) and warm once more, and the mean
# time from each trial's start to its first report of each, printed (never asserted).
#   ssh_warm_test.sh DTRAIN TUNE_CLUSTER_SEARCH
source "$(dirname "$0")/../cluster/lib.sh"
DTRAIN="$(realpath "$1")" SEARCH="$(realpath "$2")"
for f in "$DTRAIN" "$SEARCH"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
export DTRAIN_LAUNCHER="$DTRAIN"
cluster_init
start=$SECONDS
hosts_up
sshd_up
echo "hosts and sshd up in $((SECONDS - start)) s"
SSH=(--ssh-port "$SSH_PORT" --ssh-identity "$SSH_KEY" --ssh-arg -F --ssh-arg "$SSH_CONFIG")
PY="${DTRAIN_VENV_PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

search() {  # search STORAGE [ENV=VALUE...]: runs the search on n1, prints its output
  local storage="$1"
  shift
  on n1 env "$@" timeout 240 "$SEARCH" --storage "$storage" --engine ssh --hosts n1:2,n2:2 "${SSH[@]}" \
    --trials 4 --nproc 2 --iterations 3 --sleep 0.3 --kill-trial 2 2>&1
}

no_warm_dirs() { ! compgen -G "/tmp/dtrain-warmhost-*" >/dev/null; }

t=$SECONDS
out="$(search "$T/warm")" || fail "warm search: exit $?: $out"
for x in 1 3 4; do
  grep -q "^trial [0-9a-f]\{5\}_0000$((x - 1)) x=$x status=TERMINATED failures=0 iterations=3 world=2 hosts=n1,n2$" <<<"$out" ||
    fail "warm search: trial x=$x: $out"
done
grep -q "^trial [0-9a-f]\{5\}_00001 x=2 status=TERMINATED failures=1 iterations=3 world=2 hosts=n1,n2$" <<<"$out" ||
  fail "warm search: trial x=2 (its rank on n2 SIGKILLed once, retried from its checkpoint): $out"
[[ "$(cut -d' ' -f1 "$T"/warm/tune/*_00001_*/killed_once 2>/dev/null)" == n2 ]] || fail "warm search: the killed rank did not run on n2"
grep -q "^tune: 2 trial(s) at a time on engine ssh (4 free of 4 slots; 2 process(es) each)$" <<<"$out" ||
  fail "warm search: expected 2 trials at a time from the hosts' 4 slots: $out"
declare -A WARM
for h in n1 n2; do
  WARM[$h]="$(sed -n "s|^tune: warm fork server on $h (/tmp/dtrain-warmhost-[^ ]*-$h/s pid \([0-9]*\))\$|\1|p" <<<"$out")"
  [[ -n "${WARM[$h]}" ]] || fail "warm search: no warm fork server on $h: $out"
done
# Every worker's grandparent is its host's warm server: 4 trials x 2 workers + the retried run's 2.
n=0
for f in "$T"/warm/tune/train_fn_*/origin_*; do
  h="$(basename "$f" | cut -d_ -f2)"
  [[ "$(cat "$f")" == "${WARM[$h]}" ]] || fail "warm search: worker $(basename "$f") was not forked from $h's warm server (pid ${WARM[$h]}): grandparent $(cat "$f")"
  n=$((n + 1))
done
((n == 10)) || fail "warm search: expected 10 workers (4 trials x 2, and the retried run's 2), found $n"
"$PY" "$(dirname "$0")/trials_at_once.py" "$out" 2 4 || fail "warm search: trials did not run two at a time: $out"
nothing_left "warm search" "$SEARCH"
no_warm_dirs || fail "warm search: socket directories left: $(ls -d /tmp/dtrain-warmhost-*)"
pass "Tuner over ssh: a warm fork server on n1 and n2 forked all 10 workers of 4 trials (2 at a time); the worker SIGKILLed on n2 failed only its trial, retried; nothing left ($((SECONDS - t)) s)"

# The driver SIGKILLed while 2 trials run: its ssh connections close, so every keeper ends its
# server, and the trials' agents and workers stop; nothing left, no socket directory.
t=$SECONDS
bg_on n1 "$T/killed.out" "$SEARCH" --storage "$T/killed" --engine ssh --hosts n1:2,n2:2 "${SSH[@]}" \
  --trials 4 --nproc 2 --iterations 40 --sleep 0.5
drv=$BG_PID
deadline=$((SECONDS + 120))
until [[ $(compgen -G "$T/killed/tune/train_fn_*/origin_n2_*" | wc -l) -ge 2 ]]; do
  ((SECONDS < deadline)) || { kill -KILL $drv; fail "killed driver: 2 trials' workers did not start on n2 within 120 s: $(cat "$T/killed.out")"; }
  kill -0 $drv 2>/dev/null || fail "killed driver: the search ended early: $(cat "$T/killed.out")"
  sleep 0.2
done
kill -KILL $drv
wait $drv 2>/dev/null
nothing_left "killed driver" "$SEARCH"
deadline=$((SECONDS + 15))
until no_warm_dirs; do
  ((SECONDS < deadline)) || fail "killed driver: socket directories left: $(ls -d /tmp/dtrain-warmhost-*)"
  sleep 0.2
done
pass "driver SIGKILLed with 2 trials running: no warm server, keeper, agent or worker left on n1, n2 ($((SECONDS - t)) s)"

# Per-trial start, cold then warm, same hosts and load (printed, not asserted).
first_reports() { sed -n 's/^span .* first_report_s=\([0-9.]*\)$/\1/p' <<<"$1" | tr '\n' ' '; }
cold="$(search "$T/cold" DTRAIN_TUNE_WARM_FORKSERVER=0)" || fail "cold search: exit $?: $cold"
grep -q "tune: warm fork server on" <<<"$cold" && fail "cold search: a warm server started with DTRAIN_TUNE_WARM_FORKSERVER=0"
warm="$(search "$T/warm2")" || fail "second warm search: exit $?: $warm"
nothing_left "cold and warm searches" "$SEARCH"
"$PY" - "$(first_reports "$cold")" "$(first_reports "$warm") $(first_reports "$out")" "$(cat /proc/loadavg)" <<'PY'
import sys
cold = [float(x) for x in sys.argv[1].split()]
warm = [float(x) for x in sys.argv[2].split()]
mean = lambda v: sum(v) / len(v)
print("trial start to first report over ssh (n1:2,n2:2, 2 trials at a time, load %s): cold %.2f s (%d trials), warm %.2f s (%d trials), warm/cold %.2f"
      % (" ".join(sys.argv[3].split()[:3]), mean(cold), len(cold), mean(warm), len(warm), mean(warm) / mean(cold)))
PY
echo "ssh warm tests took $((SECONDS - start)) s"
