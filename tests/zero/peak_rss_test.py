"""ZeRO holds its memory at the peak, at dtrain's default settings: each rank's peak RSS over the
training steps (VmHWM reset after initialize) of an 83.9M-parameter fp32 model with Adam, from
`zero_bench rss-worker` under `dtrain run`: stage 2 below stage 0, stage 3 at most 0.6x stage 0
at 2 ranks and at most 0.4x at 4 (issue 28's bounds). Memory, not time: the figures do not
depend on the machine's load.

    python3 peak_rss_test.py DTRAIN ZERO_BENCH
"""
import json
import os
import subprocess
import sys


def peak(dtrain, zero_bench, world, stage):
    cmd = [dtrain, "run", "--nproc-per-node", str(world), zero_bench, "rss-worker", "--stage", str(stage)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [l[l.index("{"):] for l in r.stdout.splitlines() if '"zero_rss"' in l]
    if r.returncode != 0 or not lines:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    j = json.loads(lines[-1])
    mib = [v / 2**20 for v in j["peak_rss_bytes"]]
    print(f"{world} ranks, stage {stage}: peak RSS per rank {', '.join(f'{v:.0f}' for v in mib)} MiB "
          f"(accounted {j['accounted_bytes'] / 2**20:.0f} MiB)", flush=True)
    return j["max_peak_rss_bytes"]


def main():
    dtrain, zero_bench = sys.argv[1], sys.argv[2]
    failures = []
    for world, bound in ((2, 0.6), (4, 0.4)):
        p0 = peak(dtrain, zero_bench, world, 0)
        p3 = peak(dtrain, zero_bench, world, 3)
        print(f"{world} ranks: stage 3 / stage 0 = {p3 / p0:.2f} (bound {bound})", flush=True)
        if p3 > bound * p0:
            failures.append(f"{world} ranks: stage 3 peaks at {p3 / p0:.2f}x stage 0 (bound {bound}x)")
        if world == 2:
            p2 = peak(dtrain, zero_bench, world, 2)
            print(f"2 ranks: stage 2 / stage 0 = {p2 / p0:.2f} (bound: below 1)", flush=True)
            if p2 >= p0:
                failures.append(f"2 ranks: stage 2 peaks at {p2 / p0:.2f}x stage 0 (must be below)")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("ok: stage 2 below stage 0, stage 3 within 0.6x (2 ranks) and 0.4x (4 ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
