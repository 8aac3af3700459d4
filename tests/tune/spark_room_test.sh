#!/usr/bin/env bash
# A Tune search on the spark engine grows into room that appears during it, up to
# max_concurrent_trials, without waiting for a trial to end. A real Spark standalone cluster of
# separate hosts (tests/spark/lib.sh: master on n0, where the driver runs; network namespaces,
# root) starts with one worker of 1 core on n1: the kept application has 1 task slot, and the
# Tuner starts with 1 trial at a time (5 trials of 1 process, max_concurrent_trials 3). While
# the first trial runs (held until two more started beside it), a worker of 4 cores registers
# on n2 and the application's executor there registers with its driver. With trials waiting,
# the Tuner asks the application again every 10 s (on a thread of its own: Spark's count takes
# seconds) and grows to 3 trials at a time, capped (the 5 slots would hold 4 or 5), while the
# first trial is still held: as Ray Tune starts a pending trial once its resources are there.
# The trials' own timestamps show two trials started before the first one ended, 3 at once and
# never 4, and trials ran on n2. Fails (never skips) when root, Java or pyspark is missing.
#   spark_room_test.sh DTRAIN TUNE_CLUSTER_SEARCH
source "$(dirname "$0")/../spark/lib.sh"
source "$(dirname "$0")/room_lib.sh"
DTRAIN="$(realpath "$1")" SEARCH="$(realpath "$2")"
for f in "$DTRAIN" "$SEARCH"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
export DTRAIN_LAUNCHER="$DTRAIN"
spark_init
t_all=$SECONDS
# The executors say when they registered with their driver (CoarseGrainedExecutorBackend's
# INFO line "Successfully registered with driver", in the worker's work dir).
printf 'logger.executor.name = org.apache.spark.executor.CoarseGrainedExecutorBackend\nlogger.executor.level = info\n' \
  >>"$SPARK_CONF_DIR/log4j2.properties"
spark_hosts_up 1 n1
gate1="$T/trial1_may_end"
bg_on n0 "$T/search.out" timeout 300 "$SEARCH" --storage "$T/tune" --engine spark --master "$SPARK_MASTER_URL" \
  --trials 5 --nproc 1 --iterations 2 --sleep 1 --max-concurrent 3 --hold "1:$gate1"
search=$BG_PID
search_says "^tune: [0-9]* trial(s) at a time on engine spark" 120 "sizing its trials"
grep -q "^tune: 1 trial(s) at a time on engine spark (1 free of 1 slots; 1 process(es) each)$" "$T/search.out" ||
  fail "the Tuner did not start with 1 trial at a time from n1's 1 task slot: $(cat "$T/search.out")"
# The room appears while the first trial runs: n2's worker, and the application's executor on it.
spark_worker_up n2 4
deadline=$((SECONDS + 60))
until grep -qs "Successfully registered with driver" "$T"/work/n2/app-*/*/stderr; do
  kill -0 "$search" 2>/dev/null || fail "the search ended before n2's executor joined it: $(cat "$T/search.out")"
  ((SECONDS < deadline)) || fail "no executor of the search's application registered on n2 within 60 s: $(ls -R "$T/work/n2"; cat "$T"/work/n2/app-*/*/stderr)"
  sleep 0.2
done
echo "n2's executor joined the application $((SECONDS - t_all)) s in"
search_says "^tune: now " 60 "asking the engine again (while the first trial is held)"
room_finish spark
spark_hosts_clear "tune on spark" "^($DTRAIN|$SEARCH)( |\$)|spark\.py" n0 n1 n2
pass "Tuner on Spark: 1 trial at a time on n1's 1 slot, 3 at a time (max_concurrent_trials) once n2's 4 cores joined mid-search, before any trial ended; nothing left ($((SECONDS - t_all)) s)"
