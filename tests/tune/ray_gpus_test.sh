#!/usr/bin/env bash
# GPUs per trial on the ray engine: trial_resources.gpus becomes each process's GPU request
# (ClusterOptions::ray.num_gpus_per_process), Ray assigns the ids and the agent's workers see
# them in CUDA_VISIBLE_DEVICES. A real Ray cluster (tests/ray/lib.sh: the head on n0, 0 CPUs;
# one worker node on n1 of 4 CPUs declaring 2 GPUs, `ray start --num-gpus=2`, on this CPU-only
# machine; network namespaces, root). Search 1: 4 trials of 1 GPU - the Tuner sizes 2 at a time
# from Ray's free GPUs, each trial sees one id of 0 and 1, and trials that overlap never share
# one. Search 2: 4 trials of 0.5 GPU - 4 at a time, each sees one id, no id held by more than
# two at once. Fails (never skips) when root or ray is missing.
#   ray_gpus_test.sh DTRAIN TUNE_CLUSTER_SEARCH
source "$(dirname "$0")/../ray/lib.sh"
DTRAIN="$(realpath "$1")" SEARCH="$(realpath "$2")"
for f in "$DTRAIN" "$SEARCH"; do [[ -x "$f" ]] || fail "$f is not built: run scripts/setup.sh"; done
export DTRAIN_LAUNCHER="$DTRAIN"
ray_init
t_all=$SECONDS
RAY_NODE_GPUS=2 ray_hosts_up 4 n1
check() {  # OUT GPUS_PER_TRIAL AT_ONCE
  "$PY" - "$@" <<'PY'
import re, sys
out, g, want = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
spans = {i: (float(a), float(b)) for i, a, b in re.findall(r"^span (\S+) start=([0-9.]+) end=([0-9.]+)", out, re.M)}
cvd = dict(re.findall(r"^gpus (\S+) cvd=(\S*)$", out, re.M))
if len(spans) != 4 or sorted(cvd) != sorted(spans):
    sys.exit("expected 4 trials with their spans and CUDA_VISIBLE_DEVICES: %s %s" % (spans, cvd))
for i, c in cvd.items():
    if c not in ("0", "1"):
        sys.exit("trial %s saw CUDA_VISIBLE_DEVICES=%s, not one of Ray's 2 GPUs" % (i, c))
most = 0
for i, (a, _) in spans.items():
    live = [j for j, (s, e) in spans.items() if s <= a < e]
    most = max(most, len(live))
    for gid in ("0", "1"):
        if sum(g for j in live if cvd[j] == gid) > 1 + 1e-9:
            sys.exit("GPU %s held beyond its capacity at once by %s: %s" % (gid, live, cvd))
if most > want:
    sys.exit("%d trials at once, at most %d fit" % (most, want))
print("trials' GPUs: %s; at most %d at once" % (cvd, most))
PY
}
on n0 timeout 300 "$SEARCH" --storage "$T/tune1" --engine ray --ray-address "$RAY_GCS" \
  --trials 4 --nproc 1 --iterations 2 --sleep 1 --gpus 1 >"$T/search1.out" 2>&1 ||
  fail "search of 1 GPU per trial: exit $?: $(cat "$T/search1.out")"
out="$(cat "$T/search1.out")"
grep -q "^tune: 2 trial(s) at a time on engine ray (2 free of 2 slots; 1 process(es) each)$" <<<"$out" ||
  fail "the Tuner did not size 2 trials at a time from Ray's 2 GPUs: $out"
[[ $(grep -c "status=TERMINATED failures=0 iterations=2" <<<"$out") -eq 4 ]] || fail "4 trials did not end well: $out"
check "$out" 1 2 || fail "1 GPU per trial on Ray: $out"
on n0 timeout 300 "$SEARCH" --storage "$T/tune2" --engine ray --ray-address "$RAY_GCS" \
  --trials 4 --nproc 1 --iterations 2 --sleep 1 --gpus 0.5 >"$T/search2.out" 2>&1 ||
  fail "search of 0.5 GPU per trial: exit $?: $(cat "$T/search2.out")"
out="$(cat "$T/search2.out")"
grep -q "^tune: 4 trial(s) at a time on engine ray (4 free of 4 slots; 1 process(es) each)$" <<<"$out" ||
  fail "the Tuner did not size 4 trials at a time from Ray's 4 CPUs and 2 GPUs at 0.5: $out"
[[ $(grep -c "status=TERMINATED failures=0 iterations=2" <<<"$out") -eq 4 ]] || fail "4 trials did not end well: $out"
check "$out" 0.5 4 || fail "0.5 GPU per trial on Ray: $out"
pass "Tuner on Ray with 2 GPUs declared: 1 GPU per trial 2 at a time, 0.5 per trial 4 at a time, each trial's workers seeing the id Ray gave ($((SECONDS - t_all)) s)"
