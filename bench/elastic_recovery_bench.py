#!/usr/bin/env python3
"""Recovery benchmark (issue #15): time from a SIGKILLed worker to training resumed.

The same job - 2 workers, DDP over an MLP with dropout, Adam, 2 epochs of a synthetic
dataset, a commit every 3 steps; rank 1 SIGKILLs itself after step 20 (mid-epoch) on the
first attempt - runs under

  dtrain run --nproc-per-node 2 --max-restarts 1 --monitor-interval 0.1 \\
      BUILD/tests/elastic_train_worker ...      (dtrain::ElasticState resumes it, no user code;
                                                 once with disk commits, once with --in-memory)
  torchrun --nproc-per-node 2 --max-restarts 1 --monitor-interval 0.1 \\
      bench/elastic_recovery_peer.py ...        (PyTorch 2.x, the user's own resume code)

and each worker logs wall-clock times: the dying rank just before kill(2), rank 0 after the
first step of the restarted attempt. Recovery = the difference (detection, stopping the
survivors, restart, rendezvous, loading the checkpoint, the first step). One run each, on
this machine; prints both, the ratio and the machine. Fails only when a job fails or the
times are missing, never because of a time.

  python3 bench/elastic_recovery_bench.py [--build build-torch2] [--torchrun PATH] [--rounds N]
"""
import argparse
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def machine() -> str:
    cores = os.cpu_count()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    distro = "Linux"
    try:
        with open("/etc/os-release") as f:
            distro = re.search(r'PRETTY_NAME="([^"]+)"', f.read()).group(1)
    except (OSError, AttributeError):
        pass
    return f"{cores}-core {distro} {platform.machine()}, load average {load:.1f}"


def recovery(log_dir: str):
    """(kill -> first step of the restarted attempt, kill -> its rank 0 started, -> its group up)."""
    kill_t = first_t = start_t = init_t = None
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name)) as f:
            text = f.read()
        m = re.search(r"killing myself at ([0-9.]+)", text)
        if m and name.startswith("attempt0_"):
            kill_t = float(m.group(1))
        m = re.search(r"first_step \d+ ([0-9.]+)", text)
        if m and name == "attempt1_rank0.log":
            first_t = float(m.group(1))
        if name == "attempt1_rank0.log":
            start_t = float(re.search(r"started_at ([0-9.]+)", text).group(1))
            init_t = float(re.search(r"init_done ([0-9.]+)", text).group(1))
    if kill_t is None or first_t is None:
        raise RuntimeError(f"the logs in {log_dir} lack the kill or the resumed step: {os.listdir(log_dir)}")
    return first_t - kill_t, start_t - kill_t, init_t - kill_t


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int):
    """pid's children, grandchildren, ... (from /proc), so a hung job is killed whole."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def run(cmd, log_dir, ckpt_dir):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = cmd[:2] + ["--master-port", str(free_port())] + cmd[2:] if "run" in cmd[:2] else \
        cmd[:1] + ["--master-port", str(free_port())] + cmd[1:]
    # A launcher that hangs is killed with everything under it (a plain timeout would kill
    # the launcher only and leave its workers running).
    p = subprocess.Popen(cmd + ["--log-dir", log_dir, "--checkpoint-dir", ckpt_dir, "--kill-at-step", "20",
                                "--kill-rank", "1", "--step-sleep", "0.05"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for pid in descendants(p.pid) + [p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = p.communicate()
        raise RuntimeError(f"{' '.join(cmd)} hung for 120 s (killed with its workers):\n{out[-3000:]}")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with {p.returncode}:\n{out[-3000:]}")
    return recovery(log_dir)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    venv = os.environ.get("DTRAIN_VENV", os.path.join(os.path.expanduser("~"), ".cache", "dtrain", "venv"))
    ap.add_argument("--torchrun", default=os.path.join(venv, "bin", "torchrun"))
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    dtrain = os.path.join(a.build, "tools", "dtrain")
    worker = os.path.join(a.build, "tests", "elastic_train_worker")
    for path in (dtrain, worker, a.torchrun):
        if not os.path.exists(path):
            print(f"elastic_recovery_bench: {path} is missing (build the targets dtrain_cli and "
                  f"elastic_train_worker; --torchrun names PyTorch 2.x's torchrun)", file=sys.stderr)
            return 1
    common = ["--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1"]
    jobs = {
        "dtrain elastic (ElasticState)": [dtrain, "run"] + common + [worker],
        "dtrain elastic, in-memory commits": [dtrain, "run"] + common + [worker, "--in-memory"],
        "torchrun 2.x + user resume code": [a.torchrun] + common + [os.path.join(HERE, "elastic_recovery_peer.py")],
    }
    times = {name: [] for name in jobs}
    parts = {name: [] for name in jobs}
    for _ in range(a.rounds):
        for name, cmd in jobs.items():
            for attempt in (1, 2):  # a job that fails or hangs (not a slow one) is run once more
                tmp = tempfile.mkdtemp(prefix="dtrain-recovery-")
                try:
                    os.makedirs(os.path.join(tmp, "logs"))
                    total, started, init = run(cmd, os.path.join(tmp, "logs"), os.path.join(tmp, "ckpt"))
                    times[name].append(total)
                    parts[name].append((started, init))
                    break
                except RuntimeError as e:
                    if attempt == 2:
                        raise
                    print(f"note: {name}: the job failed, running it again: {str(e).splitlines()[0]}\n"
                          f"  {[l for l in str(e).splitlines() if 'Error' in l][:2]}", file=sys.stderr)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    print(f"machine: {machine()}")
    for name, ts in times.items():
        started, init = parts[name][-1]
        print(f"{name:34s} recovery {statistics.median(ts):6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in ts)}; "
              f"last run: new rank 0 in main/script at +{started:.2f} s, its group up at +{init:.2f} s)")
    d, m, t = (statistics.median(v) for v in times.values())
    print(f"ratio dtrain / torchrun: {d / t:.2f}x (disk commits), {m / t:.2f}x (in-memory commits); target <= 0.5x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
