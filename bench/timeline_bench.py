#!/usr/bin/env python3
"""Timeline overhead: examples/fashion_mnist (MLP, 2 processes under `dtrain run`) with the
timeline off and on (DTRAIN_TIMELINE=FILE), interleaved in the same run so machine load hits
both alike. Prints global samples/s (training loop only) per side and the on/off ratio of
step time (the issue's target: on costs < 3%). Whole-run timings on a shared machine are
noisy, so it also states the overhead the other way: the spans one step records (counted in
the merged trace) times the cost of one span (bench/timeline_span_bench, Google Benchmark),
over the step time. Never fails on timing.

    python3 bench/timeline_bench.py [--build-dir build] [--repeat 5] [--steps 300] [--batch-size 64]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile

from bench_output import last_json

HERE = os.path.dirname(os.path.abspath(__file__))


def run(build, steps, batch, timeline):
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory() as d:
        if timeline:
            env["DTRAIN_TIMELINE"] = os.path.join(d, "timeline.json")
        cmd = [os.path.join(build, "tools", "dtrain"), "run", "--nproc-per-node", "2",
               os.path.join(build, "examples", "fashion_mnist"), "--epochs", "1", "--max-steps", str(steps),
               "--batch-size", str(batch), "--no-eval", "--log-every", "0"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({r.returncode}):\n{r.stderr}")
        spans = None
        if timeline:
            if not os.path.exists(env["DTRAIN_TIMELINE"]):
                raise RuntimeError("no merged timeline was written")
            with open(env["DTRAIN_TIMELINE"]) as f:
                events = json.load(f)["traceEvents"]
            spans = sum(1 for e in events if e.get("ph") == "X" and e.get("pid") == 0)
        return last_json(r.stdout)["samples_per_s"], spans


def span_cost_ns(build):
    """Nanoseconds of one span with recording off and on (Google Benchmark's CPU time)."""
    r = subprocess.run([os.path.join(build, "bench", "timeline_span_bench"), "--benchmark_format=json"],
                       capture_output=True, text=True, timeout=300, check=True)
    cost = {b["name"].split("/")[0]: b["cpu_time"] for b in json.loads(r.stdout)["benchmarks"]}
    return cost["BM_SpanOff"], cost["BM_SpanOn"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    off, on, spans = [], [], []
    for i in range(a.repeat):
        for timeline, out in ((False, off), (True, on)) if i % 2 == 0 else ((True, on), (False, off)):
            rate, n = run(a.build_dir, a.steps, a.batch_size, timeline)
            out.append(rate)
            if n is not None:
                spans.append(n)
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores; "
          f"fashion_mnist MLP, 2 processes, batch {a.batch_size}/rank, {a.steps} steps, {a.repeat} runs each (median)")
    print(f"timeline off: {m_off:8.0f} samples/s   runs: {', '.join(f'{x:.0f}' for x in off)}")
    print(f"timeline on : {m_on:8.0f} samples/s   runs: {', '.join(f'{x:.0f}' for x in on)}")
    print(f"step time on/off: {m_off / m_on:.3f} (overhead {100 * (m_off / m_on - 1):+.1f}%; target < 3%)")
    off_ns, on_ns = span_cost_ns(a.build_dir)
    per_step = statistics.median(spans) / a.steps  # rank 0's spans (all its threads) per step
    step_ns = 1e9 * 2 * a.batch_size / m_off        # 2 processes, each a batch per step
    print(f"one span: {off_ns:.1f} ns off, {on_ns:.1f} ns on; rank 0 records {per_step:.1f} spans per step "
          f"of {step_ns / 1e6:.3f} ms")
    print(f"overhead from span cost: on {100 * per_step * on_ns / step_ns:.3f}% of step time, "
          f"off {100 * per_step * off_ns / step_ns:.4f}% (target: on < 3%, off not measurable)")


if __name__ == "__main__":
    main()
