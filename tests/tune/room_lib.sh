# What tune.spark_room and tune.ray_room share: a search (tune_cluster_search, started by the
# test as $search writing $T/search.out) of 5 trials of 1 process, max_concurrent_trials 3,
# whose first trial waits for the file $gate1 (--hold 1:$gate1) while room appears on n2.
# Sourced after the engine's lib.sh (fail, $T, $PY).
#   search_says PATTERN SECONDS WHAT  waits (at most SECONDS) for a line matching PATTERN in the
#                                     search's output while it runs
#   room_finish ENGINE                waits until two more trials' workers run beside the held
#                                     first one, lets it end, and checks the search: 5 trials
#                                     ended, some on n2, the first change "now 3 ... of 5 slots"
#                                     while the first trial ran, two trials started before it
#                                     ended, 3 at once and never 4. Sets $out (the output).
search_says() {
  local deadline=$((SECONDS + $2))
  until grep -q "$1" "$T/search.out"; do
    kill -0 "$search" 2>/dev/null || fail "the search ended before $3: $(cat "$T/search.out")"
    ((SECONDS < deadline)) || fail "the search did not get to $3 within $2 s: $(cat "$T/search.out")"
    sleep 0.2
  done
}

room_finish() {
  local engine="$1" deadline rc
  # Two more trials start while the first one is still held: their workers run (each writes
  # TRIAL_DIR/origin_HOST_PID as it starts; the spans below check it from their own clocks).
  started_beside() {
    find "$T/tune" -path '*_0000[1-4]_*/origin_*' 2>/dev/null | sed 's,/origin_[^/]*$,,' | sort -u | wc -l
  }
  deadline=$((SECONDS + 60))
  until (($(started_beside) >= 2)); do
    kill -0 "$search" 2>/dev/null || fail "the search ended before two trials started beside the held first one: $(cat "$T/search.out")"
    ((SECONDS < deadline)) || fail "no two trials started beside the held first one within 60 s: $(cat "$T/search.out")"
    sleep 0.2
  done
  touch "$gate1"
  wait "$search"
  rc=$?
  out="$(cat "$T/search.out")"
  ((rc == 0)) || fail "tune on $engine: exit $rc: $out"
  [[ $(grep -c "^trial [0-9a-f]\{5\}_0000[0-4] x=[1-5] status=TERMINATED failures=0 iterations=2 world=1 hosts=n[12]$" <<<"$out") -eq 5 ]] ||
    fail "tune on $engine: expected 5 terminated trials of 1 rank with 2 reports each: $out"
  grep -q "^trial .* hosts=n2$" <<<"$out" || fail "tune on $engine: no trial ran on n2, the host that joined: $out"
  # The first change: to 3, capped by max_concurrent_trials (n2's 4 slots and n1's 1 make 5).
  grep -m1 "^tune: now " <<<"$out" |
    grep -Eq "^tune: now 3 trial\(s\) at a time on engine $engine \([0-9] free of 5 slots, 1 trial\(s\) of this search running; 1 process\(es\) each, max_concurrent_trials 3\)$" ||
    fail "tune on $engine: the Tuner did not grow to 3 trials at a time (5 slots, capped) while the first trial ran: $out"
  # [start, end] of each trial from its own processes' clocks: two started before the first
  # ended, 3 at once, never 4.
  "$PY" - "$out" <<'PY' || fail "tune on $engine: no two trials started while the first one ran: $out"
import re, sys
spans = {i: (float(a), float(b)) for i, a, b in
         re.findall(r"^span (\S+) start=([0-9.]+) end=([0-9.]+)", sys.argv[1], re.M)}
first = spans.pop(next(i for i in spans if i.endswith("_00000")))
early = [i for i, (a, _) in spans.items() if a < first[1]]
sys.exit(0 if len(early) >= 2 else "started before the first trial ended: %s" % early)
PY
  "$PY" "$(dirname "${BASH_SOURCE[0]}")/trials_at_once.py" "$out" 3 5 ||
    fail "tune on $engine: trials did not run 3 at a time: $out"
  grep "^tune: .*trial(s) at a time" <<<"$out"
}
