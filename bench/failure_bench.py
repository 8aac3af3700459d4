#!/usr/bin/env python3
"""Failure-detection benchmark: time from a worker's death to the launcher's exit.

A job of --nproc (default 2) workers that print "pid=N" and sleep 60 s runs under

  dtrain run --nproc-per-node 2 WORKER --pid --sleep 60          (dtrain's default
                                                                  --monitor-interval, 0.1 s)
  torchrun --nproc_per_node 2 --redirects 9:1 --tee 9:1 --master_port <free>
           --no_python WORKER --pid --sleep 60                    (default --monitor_interval, 5 s)
  the same torchrun with --monitor_interval 0.1

The script reads the workers' pids from the launcher's output as it streams, waits a delay,
SIGKILLs one worker itself and measures from just before kill(2) to the launcher's exit
(seen through a pidfd, so the measurement does not poll). It also records the launcher's exit
code and whether the other worker outlived the launcher (it is then killed and reported).

The delay between "all workers are up" and the kill matters for a launcher that polls:
torchrun sleeps --monitor_interval between checks, so a death is noticed after 0..interval
seconds depending on where in that sleep it falls. By default each round draws one delay
uniformly from --delay (default 0.5:5.5, i.e. a full 5 s period) with a fixed --seed, and
uses it for every launcher in that round, so the comparison is paired. --delay 1 gives a
fixed delay.

WORKER (--worker) defaults to BUILD_DIR/tests/test_worker, else /tmp/tw, else a generated
shell script (`echo pid=$$; exec sleep 60`), which behaves the same for both launchers.

A run fails (exit status 1) when the pids do not appear, the launcher does not exit within
--timeout after the kill, or it exits 0; never because of timings.
Standard library only (torchrun brings its own Python).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import re
import select
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


# The launcher gets its own process group (so a timeout can signal all of it) but stays in our
# session: with sched_autogroup, a new session would also be a new scheduling group and the job
# would not get the CPU share (or nice level) of whoever runs the benchmark.
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_torchrun() -> str:
    if os.path.exists("/usr/bin/torchrun"):
        return "/usr/bin/torchrun"
    return "/usr/bin/python3 -m torch.distributed.run"


def wait_for_file(path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not os.access(path, os.X_OK):
        if time.monotonic() >= deadline:
            raise SystemExit(f"failure_bench: {path} does not exist or is not executable")
        time.sleep(0.5)


def alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


class Config:
    def __init__(self, name: str, launcher: str, monitor: str | None):
        self.name = name
        self.launcher = launcher
        self.monitor = monitor  # None: the launcher's default
        self.latency: list[float] = []
        self.codes: list[int] = []
        self.survivors = 0
        self.failures: list[str] = []

    def command(self, a: argparse.Namespace) -> list[str]:
        wargs = ["--pid", "--sleep", str(a.sleep)] if a.worker_style == "test_worker" else []
        if self.launcher == "dtrain":
            cmd = [a.dtrain, "run", "--nproc-per-node", str(a.nproc)]
            if self.monitor:
                cmd += ["--monitor-interval", self.monitor]
            return cmd + [a.worker] + wargs
        cmd = shlex.split(a.torchrun) + ["--nproc_per_node", str(a.nproc), "--redirects", "9:1",
                                         "--tee", "9:1", "--master_port", str(free_port())]
        if self.monitor:
            cmd += ["--monitor_interval", self.monitor]
        return cmd + ["--no_python", a.worker] + wargs


def pump(stream, q: queue.Queue | None, keep: list[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        keep.append(line)
        del keep[:-40]
        if q is not None:
            q.put(line)
    stream.close()


def run_once(cfg: Config, a: argparse.Namespace, delay: float, record: bool) -> None:
    wait_for_file(a.worker, 60)
    if cfg.launcher == "dtrain":
        wait_for_file(a.dtrain, 60)
    cmd = cfg.command(a)
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **OWN_GROUP)
    pidfd = os.pidfd_open(p.pid)
    lines: queue.Queue = queue.Queue()
    out_tail: list[str] = []
    err_tail: list[str] = []
    threads = [threading.Thread(target=pump, args=(p.stdout, lines, out_tail), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, None, err_tail), daemon=True)]
    for t in threads:
        t.start()
    pids: list[int] = []
    problem = None
    latency = None
    victim = None
    try:
        deadline = time.monotonic() + a.startup_timeout
        while len(pids) < a.nproc:
            left = deadline - time.monotonic()
            if left <= 0 or p.poll() is not None:
                problem = f"saw {len(pids)} of {a.nproc} worker pids (launcher exit code {p.returncode})"
                break
            try:
                line = lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            m = re.search(r"pid=(\d+)", line)
            if m:
                pids.append(int(m.group(1)))
        if problem is None:
            time.sleep(delay)
            victim = pids[0]
            if p.poll() is not None:
                problem = f"the launcher exited ({p.returncode}) before the kill"
            else:
                t0 = time.perf_counter()
                os.kill(victim, signal.SIGKILL)
                ready, _, _ = select.select([pidfd], [], [], a.timeout)
                t1 = time.perf_counter()
                if ready:
                    latency = t1 - t0
                else:
                    problem = f"the launcher did not exit within {a.timeout} s of the kill"
    finally:
        if p.poll() is None:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    pass
        code = p.wait()
        os.close(pidfd)
        survivors = [q for q in pids if q != victim and alive(q)]
        for q in survivors:
            try:
                os.kill(q, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for t in threads:
            t.join(timeout=5)
    if problem is None and code == 0:
        problem = "the launcher exited 0 after a worker was killed"
    if survivors:
        print(f"WARNING {cfg.name}: worker(s) {survivors} outlived the launcher (killed now)",
              file=sys.stderr, flush=True)
    if problem is not None:
        tail = lambda ls: "\n".join("    " + l for l in ls[-15:])
        print(f"FAILED {cfg.name}: {problem}\n  command: {shlex.join(cmd)}\n  stdout:\n{tail(out_tail)}"
              f"\n  stderr:\n{tail(err_tail)}", file=sys.stderr, flush=True)
        cfg.failures.append(problem)
        return
    if record:
        cfg.latency.append(latency)
        cfg.codes.append(code)
        cfg.survivors += len(survivors)
    if a.verbose:
        print(f"  {cfg.name:<26} delay {delay:5.2f} s  kill->exit {latency:7.3f} s  exit code {code}"
              f"{'' if record else '  (warm-up)'}", file=sys.stderr, flush=True)


def find_worker(build_dir: str) -> str | None:
    for path in (os.path.join(build_dir, "tests", "test_worker"), "/tmp/tw"):
        if os.access(path, os.X_OK):
            return path
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"),
                    help="build tree holding tools/dtrain (default: %(default)s)")
    ap.add_argument("--dtrain", help="the dtrain binary (default: BUILD_DIR/tools/dtrain)")
    ap.add_argument("--worker", help="a worker taking --pid --sleep S (test_worker), or 'sh' for a "
                                     "generated shell worker (default: BUILD_DIR/tests/test_worker, "
                                     "/tmp/tw, else sh)")
    ap.add_argument("--torchrun", default=default_torchrun(),
                    help="torchrun command, shell-split (default: %(default)s)")
    ap.add_argument("--nproc", type=int, default=2, help="workers per job (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per configuration (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: %(default)s)")
    ap.add_argument("--delay", default="0.5:5.5",
                    help="seconds from 'all pids seen' to the kill: S, or MIN:MAX drawn uniformly per "
                         "round (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="seed for the delays (default: %(default)s)")
    ap.add_argument("--sleep", type=float, default=60, help="how long the workers sleep (default: %(default)s)")
    ap.add_argument("--startup-timeout", type=float, default=60)
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for the launcher after the kill")
    ap.add_argument("--no-torchrun", action="store_true", help="skip torchrun")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every run")
    a = ap.parse_args()
    a.dtrain = a.dtrain or os.path.join(a.build_dir, "tools", "dtrain")
    tmp = tempfile.TemporaryDirectory(prefix="failure_bench-")
    if a.worker in (None, "sh"):
        found = find_worker(a.build_dir) if a.worker is None else None
        if found:
            a.worker = found
        else:
            a.worker = os.path.join(tmp.name, "sleeper")  # no .py: both launchers exec it directly
            with open(a.worker, "w") as f:
                f.write(f"#!/bin/sh\necho pid=$$\nexec sleep {a.sleep}\n")
            os.chmod(a.worker, 0o755)
            a.worker_style = "sh"
    if not hasattr(a, "worker_style"):
        a.worker_style = "test_worker"
    if ":" in a.delay:
        lo, hi = (float(x) for x in a.delay.split(":"))
    else:
        lo = hi = float(a.delay)
    rng = random.Random(a.seed)

    configs = [Config("dtrain", "dtrain", None)]
    if not a.no_torchrun:
        configs += [Config("torchrun (monitor 5 s)", "torchrun", None),
                    Config("torchrun --monitor 0.1", "torchrun", "0.1")]

    load_before = loadavg()
    print(f"failure_bench: {len(configs)} configurations x {a.repeat} runs (+{a.warmup} warm-up), "
          f"{a.nproc} workers ({a.worker}), kill delay {a.delay} s, load avg "
          f"{' '.join(map(str, load_before))}", file=sys.stderr, flush=True)
    delays = []
    for r in range(a.warmup + a.repeat):
        record = r >= a.warmup
        delay = rng.uniform(lo, hi)
        if record:
            delays.append(delay)
        k = r % len(configs)
        for cfg in configs[k:] + configs[:k]:
            run_once(cfg, a, delay, record)
    load_after = loadavg()

    med = lambda xs: statistics.median(xs) if xs else None
    f = lambda x, s: format(x, s) if x is not None else " " * (int(s.split(".")[0]) - 3) + "n/a"
    print(f"\nkill of one of {a.nproc} workers -> launcher exit, {a.repeat} runs each (seconds)")
    print(f"{'launcher':<24}{'median':>8}{'min':>8}{'max':>8}  exit codes  fails")
    for c in configs:
        codes = ",".join(sorted({str(x) for x in c.codes})) or "-"
        print(f"{c.name:<24}{f(med(c.latency), '8.3f')}{f(min(c.latency) if c.latency else None, '8.3f')}"
              f"{f(max(c.latency) if c.latency else None, '8.3f')}  {codes:<10}  {len(c.failures)}"
              + (f"  ({c.survivors} surviving worker(s)!)" if c.survivors else ""))
    ratios = {}
    d = med(configs[0].latency)
    if d:
        for c in configs[1:]:
            m = med(c.latency)
            if m is not None:
                ratios[c.name] = m / d
                print(f"{c.name} / dtrain: {m / d:.1f}x (median)")
    print(f"load avg before {' '.join(map(str, load_before))}, after {' '.join(map(str, load_after))}")

    if a.json:
        doc = {
            "benchmark": "failure",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                     "loadavg_before": load_before, "loadavg_after": load_after},
            "commands": {"dtrain": a.dtrain, "worker": a.worker, "torchrun": a.torchrun},
            "nproc": a.nproc, "repeat": a.repeat, "warmup": a.warmup, "kill_delays_s": delays,
            "configs": [{"name": c.name, "launcher": c.launcher, "monitor_interval": c.monitor,
                         "kill_to_exit_s": c.latency, "median_s": med(c.latency),
                         "min_s": min(c.latency) if c.latency else None,
                         "max_s": max(c.latency) if c.latency else None,
                         "exit_codes": c.codes, "surviving_workers": c.survivors,
                         "failures": c.failures} for c in configs],
            "over_dtrain": ratios,
        }
        with open(a.json, "w") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
    failed = sum(len(c.failures) for c in configs)
    if failed:
        print(f"failure_bench: {failed} run(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
