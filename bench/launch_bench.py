#!/usr/bin/env python3
"""Launch-cost benchmark: the same C++ worker under `dtrain run` and under torchrun.

For N in --nprocs (default 1,2,4) the worker (examples/hello_worker: join a Gloo group via
env://, all-reduce one number, barrier, exit) runs under

  dtrain run --nproc-per-node N WORKER
  dtrain run --nproc-per-node N --start-method spawn WORKER      (N >= 2; --no-spawn skips it)
  torchrun --nproc_per_node N --monitor_interval 0.1 --redirects 9:1 --tee 9:1
           --master_port <free port> --no_python WORKER

dtrain's default start method at N >= 2 for this worker (it links libtorch) is the fork server:
the worker program is started once, its shared libraries load and initialise once, and the N
workers are forked from it just before main(). "spawn" starts each worker afresh, as torchrun
does; it shows what the fork server saves.

and, with --deepspeed CMD (DeepSpeed's `deepspeed` launcher, e.g. the venv's bin/deepspeed),
DeepSpeed's launcher against `dtrain deepspeed` on the same worker:

  dtrain deepspeed --num_gpus N --master_port <free port> --no_python WORKER
  dtrain deepspeed --start-method spawn ...                      (N >= 2; --no-spawn skips it)
  CMD --num_gpus N --master_port <free port> --no_python WORKER

`dtrain deepspeed` forks a libtorch program's workers from the fork server as `dtrain run`
does (each gets its own --local_rank=N, which the worker ignores); with spawn each worker is
started through dtrain's deepspeed-exec shim and loads its libraries itself, as under
DeepSpeed (whose launcher also imports deepspeed and torch, twice, before any worker starts).

plus the worker alone, without any launcher (RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port>, OMP_NUM_THREADS=1 as dtrain sets it).

Notes on the torchrun flags: Debian's torchrun (torch 1.13, Python 3.11) crashes with its
default --redirects 0, so a redirect/tee for a local rank that does not exist (9) is given,
which changes nothing for ranks 0..N-1. Its --monitor_interval default (5 s) is how often it
polls its workers; it would add up to 5 s to every job, so 0.1 s (dtrain's default) is
passed. A free --master_port is passed so that concurrent jobs on 29500 do not interfere.

Every configuration runs --repeat times (default 5), interleaved (each round runs every
configuration once, in an order rotated by one per round), after --warmup untimed rounds.
Wall time is measured around the launcher process (fork/exec to exit, its output captured
through pipes); CPU time is the user+sys time of the whole reaped process tree; "other" is the
CPU time the rest of the machine used meanwhile (from /proc/stat), which shows when a run was
disturbed. On a shared machine, --wait-idle S waits (up to S seconds) for an idle moment before
each run.

A run fails when it exits non-zero, times out, or does not print the expected
"hello from rank" lines; the script then exits 1 (never because of timings).

Standard library only; it does not need torch itself (torchrun brings its own Python).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
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
    """A binary may be briefly missing while someone relinks it."""
    deadline = time.monotonic() + seconds
    while not os.access(path, os.X_OK):
        if time.monotonic() >= deadline:
            raise SystemExit(f"launch_bench: {path} does not exist or is not executable")
        time.sleep(0.5)


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def wait_idle(limit: float, window: float = 0.5, busy_fraction: float = 0.05) -> bool:
    """Waits (at most `limit` seconds) for a `window` in which the machine is nearly idle."""
    deadline = time.monotonic() + limit
    ncpu = os.cpu_count() or 1
    while time.monotonic() < deadline:
        b0 = busy_cpu_seconds()
        time.sleep(window)
        if (busy_cpu_seconds() - b0) / (ncpu * window) < busy_fraction:
            return True
    return False


def loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


class Config:
    def __init__(self, name: str, launcher: str, nproc: int):
        self.name = name
        self.launcher = launcher  # "alone", "dtrain" or "torchrun"
        self.nproc = nproc
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.other: list[float] = []
        self.failures: list[str] = []

    def command(self, a: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        if self.launcher == "alone":
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            env.setdefault("OMP_NUM_THREADS", "1")  # what dtrain gives its workers
            env.update(a.worker_env)
            return [a.worker] + a.worker_args, env
        # The launchers set the contract themselves; a parent's must not leak in.
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE"):
            env.pop(k, None)
        if self.launcher in ("dtrain-ds", "dtrain-ds-spawn", "deepspeed"):
            env.update(a.worker_env)  # DeepSpeed's launcher passes its environment on, as dtrain's
            flags = ["--num_gpus", str(self.nproc), "--master_port", str(free_port()), "--no_python"]
            if self.launcher == "deepspeed":
                return shlex.split(a.deepspeed) + flags + [a.worker] + a.worker_args, env
            if self.launcher == "dtrain-ds-spawn":
                flags = ["--start-method", "spawn"] + flags
            return [a.dtrain, "deepspeed"] + flags + [a.worker] + a.worker_args, env
        if self.launcher in ("dtrain", "dtrain-spawn"):
            extra = [f"--env={k}={v}" for k, v in a.worker_env.items()]
            if self.launcher == "dtrain-spawn":
                extra.append("--start-method=spawn")
            return [a.dtrain, "run", "--nproc-per-node", str(self.nproc)] + extra + [a.worker] + a.worker_args, env
        env.update(a.worker_env)  # torchrun passes its environment on (its own Python sees it too)
        cmd = shlex.split(a.torchrun) + [
            "--nproc_per_node", str(self.nproc), "--monitor_interval", "0.1",
            "--redirects", "9:1", "--tee", "9:1", "--master_port", str(free_port()),
            "--no_python", a.worker] + a.worker_args
        return cmd, env


def run_once(cfg: Config, a: argparse.Namespace, record: bool) -> None:
    for path in (a.worker, a.dtrain):
        wait_for_file(path, 60)
    if a.wait_idle > 0:
        wait_idle(a.wait_idle)
    cmd, env = cfg.command(a)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0 = busy_cpu_seconds()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **OWN_GROUP)
    try:
        out, err = p.communicate(timeout=a.timeout)
        wall = time.perf_counter() - t0
        problem = None
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = p.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                out, err = b"", b""
        wall = time.perf_counter() - t0
        problem = f"timed out after {a.timeout} s"
    busy1 = busy_cpu_seconds()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    other = max(0.0, (busy1 - busy0) - cpu)  # CPU time the rest of the machine used meanwhile
    text = out.decode(errors="replace")
    if problem is None and p.returncode != 0:
        problem = f"exit code {p.returncode}"
    if problem is None and a.expect:
        found = len(re.findall(a.expect, text))
        if found != cfg.nproc:
            problem = f"expected {cfg.nproc} line(s) matching {a.expect!r} in stdout, got {found}"
    if problem is not None:
        tail = lambda b: "\n".join("    " + l for l in b.decode(errors="replace").splitlines()[-15:])
        msg = f"{cfg.name}: {problem}\n  command: {shlex.join(cmd)}\n  stdout:\n{tail(out)}\n  stderr:\n{tail(err)}"
        print("FAILED " + msg, file=sys.stderr, flush=True)
        cfg.failures.append(problem)
        return
    if record:
        cfg.times.append(wall)
        cfg.cpu.append(cpu)
        cfg.other.append(other)
    if a.verbose:
        print(f"  {cfg.name:<14} {wall:7.3f} s  cpu {cpu:6.3f} s  other {other:6.3f} s"
              f"{'' if record else '  (warm-up)'}",
              file=sys.stderr, flush=True)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str = "7.3f") -> str:
    return format(x, spec) if x is not None else "    n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"),
                    help="build tree holding tools/dtrain and examples/hello_worker (default: %(default)s)")
    ap.add_argument("--dtrain", help="the dtrain binary (default: BUILD_DIR/tools/dtrain)")
    ap.add_argument("--worker", help="the C++ worker (default: BUILD_DIR/examples/hello_worker)")
    ap.add_argument("--worker-args", default="", help="arguments for the worker (one shell-quoted string)")
    ap.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for every worker (repeatable): dtrain gets --env=KEY=VALUE, "
                         "torchrun and the lone worker get it in their environment")
    ap.add_argument("--torchrun", default=default_torchrun(),
                    help="torchrun command, shell-split (default: %(default)s)")
    ap.add_argument("--nprocs", default="1,2,4", help="comma-separated worker counts (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per configuration (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds before a run counts as failed")
    ap.add_argument("--expect", default=r"hello from rank \d+ of \d+",
                    help="regex each worker prints once to stdout ('' to skip the check)")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="S",
                    help="before each run, wait up to S seconds for the machine to be idle (default: "
                         "0, don't wait); use it on a shared machine")
    ap.add_argument("--no-torchrun", action="store_true", help="skip torchrun")
    ap.add_argument("--no-spawn", action="store_true",
                    help="skip `dtrain run --start-method spawn` (each worker loads its libraries itself; "
                         "measured by default at N >= 2, where dtrain's default forks workers from a fork server)")
    ap.add_argument("--deepspeed", metavar="CMD",
                    help="DeepSpeed's launcher, shell-split (e.g. VENV/bin/deepspeed): also compare "
                         "it with `dtrain deepspeed` (off by default; DeepSpeed's launcher imports "
                         "torch, seconds per run)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every run")
    a = ap.parse_args()
    a.dtrain = a.dtrain or os.path.join(a.build_dir, "tools", "dtrain")
    a.worker = a.worker or os.path.join(a.build_dir, "examples", "hello_worker")
    a.worker_args = shlex.split(a.worker_args)
    try:
        a.worker_env = dict(kv.split("=", 1) for kv in a.worker_env)
    except ValueError:
        ap.error("--worker-env takes KEY=VALUE")
    nprocs = [int(x) for x in a.nprocs.split(",") if x.strip()]

    configs = [Config("worker alone", "alone", 1)]
    for n in nprocs:
        configs.append(Config(f"dtrain N={n}", "dtrain", n))
        if n > 1 and not a.no_spawn:
            configs.append(Config(f"dtrain spawn N={n}", "dtrain-spawn", n))
        if not a.no_torchrun:
            configs.append(Config(f"torchrun N={n}", "torchrun", n))
        if a.deepspeed:
            configs.append(Config(f"dtrain ds N={n}", "dtrain-ds", n))
            if n > 1 and not a.no_spawn:
                configs.append(Config(f"ds spawn N={n}", "dtrain-ds-spawn", n))
            configs.append(Config(f"deepspeed N={n}", "deepspeed", n))

    load_before = loadavg()
    print(f"launch_bench: {len(configs)} configurations x {a.repeat} runs (+{a.warmup} warm-up), "
          f"{os.cpu_count()} CPUs, load avg {' '.join(map(str, load_before))}", file=sys.stderr, flush=True)
    # Interleaved: every round runs each configuration once, the order rotated by one per round
    # so that no configuration always follows the same one.
    for r in range(a.warmup + a.repeat):
        record = r >= a.warmup
        k = r % len(configs)
        for cfg in configs[k:] + configs[:k]:
            run_once(cfg, a, record)
    load_after = loadavg()

    # Table
    print(f"\nwall time of one job, {a.repeat} runs each (seconds); worker: {a.worker}")
    print(f"{'configuration':<16}{'median':>8}{'min':>8}{'max':>8}{'cpu med':>9}{'other':>8}  fails")
    for c in configs:
        print(f"{c.name:<16}{fmt(median(c.times), '8.3f')}{fmt(min(c.times) if c.times else None, '8.3f')}"
              f"{fmt(max(c.times) if c.times else None, '8.3f')}{fmt(median(c.cpu), '9.3f')}"
              f"{fmt(median(c.other), '8.3f')}  {len(c.failures)}")
    print("(cpu: user+sys seconds of the job's processes; other: CPU seconds the rest of the machine "
          "used meanwhile, median;\n ~0 on an idle machine, large when the job competed with other load)")
    by = {(c.launcher, c.nproc): c for c in configs}
    ratios, spawn_ratios = {}, {}
    if not a.no_torchrun:
        print(f"\n{'N':>3}{'dtrain':>9}{'spawn':>9}{'torchrun':>10}{'torchrun/dtrain':>17}{'torchrun/spawn':>16}")
        for n in nprocs:
            d, t = median(by[("dtrain", n)].times), median(by[("torchrun", n)].times)
            sp = median(by[("dtrain-spawn", n)].times) if ("dtrain-spawn", n) in by else None
            ratio = t / d if d and t else None
            ratios[str(n)] = ratio
            sratio = t / sp if sp and t else None
            if sratio:
                spawn_ratios[str(n)] = sratio
            times = lambda x, spec: fmt(x, spec) + ("x" if x else " ")
            print(f"{n:>3}{fmt(d, '9.3f')}{fmt(sp, '9.3f')}{fmt(t, '10.3f')}{times(ratio, '16.2f')}"
                  f"{times(sratio, '15.2f')}")
        print("(dtrain: the default start method - a fork server at N >= 2 for this libtorch worker; "
              "spawn: --start-method spawn)")
    ds_ratios, ds_spawn_ratios = {}, {}
    if a.deepspeed:
        print(f"\n{'N':>3}{'dtrain ds':>11}{'ds spawn':>10}{'deepspeed':>11}{'deepspeed/dtrain':>18}"
              f"{'deepspeed/spawn':>17}{'spawn/dtrain':>14}")
        for n in nprocs:
            d, t = median(by[("dtrain-ds", n)].times), median(by[("deepspeed", n)].times)
            sp = median(by[("dtrain-ds-spawn", n)].times) if ("dtrain-ds-spawn", n) in by else None
            ratio = t / d if d and t else None
            ds_ratios[str(n)] = ratio
            sratio = t / sp if sp and t else None
            if sratio:
                ds_spawn_ratios[str(n)] = sratio
            gain = sp / d if sp and d else None
            times = lambda x, spec: fmt(x, spec) + ("x" if x else " ")
            print(f"{n:>3}{fmt(d, '11.3f')}{fmt(sp, '10.3f')}{fmt(t, '11.3f')}{times(ratio, '17.2f')}"
                  f"{times(sratio, '16.2f')}{times(gain, '13.2f')}")
        print("(dtrain ds: `dtrain deepspeed` - the fork server at N >= 2 for this libtorch worker; "
              "ds spawn: with --start-method spawn;\n deepspeed: DeepSpeed's own launcher)")
    overhead = None
    alone, d1 = by[("alone", 1)], by.get(("dtrain", 1))
    if d1 and alone.times and d1.times:
        diff = median(d1.times) - median(alone.times)
        paired = median([x - y for x, y in zip(d1.times, alone.times)])
        overhead = {"median_difference_s": diff, "paired_median_difference_s": paired}
        print(f"\ndtrain overhead over the worker alone at N=1: {diff * 1000:+.0f} ms "
              f"(median - median; median of per-round differences {paired * 1000:+.0f} ms)")
    print(f"load avg before {' '.join(map(str, load_before))}, after {' '.join(map(str, load_after))}")

    if a.json:
        doc = {
            "benchmark": "launch",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                     "loadavg_before": load_before, "loadavg_after": load_after},
            "commands": {"dtrain": a.dtrain, "worker": a.worker, "torchrun": a.torchrun,
                         "deepspeed": a.deepspeed,
                         "worker_env": a.worker_env},
            "repeat": a.repeat, "warmup": a.warmup, "wait_idle_s": a.wait_idle,
            "configs": [{"name": c.name, "launcher": c.launcher, "nproc": c.nproc,
                         "wall_s": c.times, "cpu_s": c.cpu, "other_cpu_s": c.other,
                         "median_s": median(c.times), "min_s": min(c.times) if c.times else None,
                         "cpu_median_s": median(c.cpu), "failures": c.failures} for c in configs],
            "torchrun_over_dtrain": ratios,
            "torchrun_over_dtrain_spawn": spawn_ratios,
            "deepspeed_over_dtrain_deepspeed": ds_ratios,
            "deepspeed_over_dtrain_deepspeed_spawn": ds_spawn_ratios,
            "dtrain_overhead_n1": overhead,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    failed = sum(len(c.failures) for c in configs)
    if failed:
        print(f"launch_bench: {failed} run(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
