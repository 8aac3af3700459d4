#!/usr/bin/env python3
"""All-reduce benchmark: dtrain::all_reduce (C++) against torch.distributed.all_reduce.

All run on 2 processes (--nproc) of this machine, float32, sum, for sizes 1 KiB .. 64 MiB
(x4 each step): dtrain on its shared-memory backend ("shm", what "auto" picks when all ranks
are local) and on Gloo over loopback ("gloo"), and torch.distributed on Gloo over loopback:

  dtrain run --nproc-per-node 2 BUILD_DIR/bench/allreduce_bench --backend shm
  dtrain run --nproc-per-node 2 BUILD_DIR/bench/allreduce_bench --backend gloo
  torchrun --nproc_per_node 2 --redirects 9:1 --tee 9:1 --monitor_interval 0.1
           --master_port <free port> bench/allreduce_bench.py --worker

Both workers use the same rule: iterations = min(1000, max(5, 256 MiB / bytes)), warm-up =
max(2, iterations / 10), then the timed iterations in 5 blocks, each started by a barrier;
a block's time per op is the slowest rank's. Each launcher runs --rounds times, alternating
(shm, gloo, torch, shm, ...). The table shows, per size, the best block over all rounds
(on a shared machine a load spike spoils a block, not the figure; the medians are in the
--json output), and ratios = dtrain time / torch time (below 1: dtrain faster).
algbw = bytes / time. dtrain-gloo and torch run the same Gloo code, so their ratio is near 1
(what differs is the per-call overhead: C++ wrapper against Python binding); dtrain-shm's
ratio is what the shared-memory transport gains.

The torchrun flags: Debian's torchrun (torch 1.13, Python 3.11) crashes with its default
--redirects 0, so a redirect/tee for a local rank that does not exist (9) is given; its
default --monitor_interval (5 s) would only add idle time at the end.

The torch worker needs /usr/bin/python3 with torch (python3-torch): a missing torch or
torchrun is an error (exit 1), never a skip.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# Timed iterations are split into blocks, each started by a barrier (as in the C++ worker).
BLOCKS = 5


def iterations(nbytes: int) -> tuple[int, int]:
    iters = min(1000, max(5, (256 << 20) // nbytes))
    return iters, max(2, iters // 10)


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, b = [], min_bytes
    while b <= max_bytes:
        out.append(b)
        b *= factor
    return out


# --- the torch.distributed worker (runs under torchrun) ----------------------------------

def worker(a: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in sizes(a.min_bytes, a.max_bytes, a.factor):
        t = torch.zeros(nbytes // 4, dtype=torch.float32)
        iters, warmup = iterations(nbytes)
        if a.iters:
            iters, warmup = a.iters, max(2, a.iters // 10)
        per_block = max(1, iters // BLOCKS)
        for _ in range(warmup):
            dist.all_reduce(t)
        block_seconds = []
        for _ in range(BLOCKS):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(per_block):
                dist.all_reduce(t)
            seconds = (time.perf_counter() - t0) / per_block
            slowest = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            block_seconds.append(slowest.item())
        block_seconds.sort()
        best, median = block_seconds[0], block_seconds[len(block_seconds) // 2]
        if rank == 0:
            algbw = nbytes / best / 1e9
            print(json.dumps({"impl": "torch", "world": world, "bytes": nbytes, "iters": per_block * BLOCKS,
                              "time_us": round(best * 1e6, 3), "median_us": round(median * 1e6, 3),
                              "algbw_gbps": round(algbw, 4),
                              "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# --- the driver ------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_json_lines(text: str, impl: str) -> dict[int, dict]:
    """Rows by size from a launcher's output (lines may carry a rank prefix)."""
    rows = {}
    for line in text.splitlines():
        i = line.find('{"impl"')
        if i < 0:
            continue
        row = json.loads(line[i:])
        if row.get("impl") == impl:
            rows[row["bytes"]] = row
    return rows


def run(cmd: list[str], timeout: float, what: str) -> str:
    env = dict(os.environ)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"allreduce_bench: {what} did not finish in {timeout:.0f} s: {' '.join(cmd)}")
    except FileNotFoundError as e:
        raise SystemExit(f"allreduce_bench: cannot run {what}: {e}")
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"allreduce_bench: {what} exited {p.returncode}: {' '.join(cmd)}")
    return p.stdout


def human(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def fmt_time(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"),
                    help="build tree holding tools/dtrain and bench/allreduce_bench (default: %(default)s)")
    ap.add_argument("--dtrain", help="the dtrain binary (default: BUILD_DIR/tools/dtrain)")
    ap.add_argument("--bench", help="the C++ worker (default: BUILD_DIR/bench/allreduce_bench)")
    ap.add_argument("--torchrun", default="/usr/bin/torchrun")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the interpreter with torch that torchrun's workers use (default: %(default)s)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=0, help="fixed iterations per size (default: by size)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per launcher, alternating (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--json", metavar="FILE", help="also write every row as JSON to FILE")
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    dtrain = a.dtrain or os.path.join(a.build_dir, "tools", "dtrain")
    bench = a.bench or os.path.join(a.build_dir, "bench", "allreduce_bench")
    for path in (dtrain, bench, a.torchrun, a.python):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"allreduce_bench: {path} is missing or not executable")
    check = subprocess.run([a.python, "-c", "import torch.distributed as d; assert d.is_available()"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"allreduce_bench: {a.python} has no usable torch.distributed:\n{check.stderr}")

    size_args = ["--min-bytes", str(a.min_bytes), "--max-bytes", str(a.max_bytes), "--factor", str(a.factor)]
    if a.iters:
        size_args += ["--iters", str(a.iters)]
    dtrain_cmd = [dtrain, "run", "--nproc-per-node", str(a.nproc), bench] + size_args
    impls = ("dtrain-shm", "dtrain-gloo", "torch")
    rows: dict[str, dict[int, list[dict]]] = {impl: {} for impl in impls}
    for rnd in range(a.rounds):
        torch_cmd = [a.torchrun, "--nproc_per_node", str(a.nproc), "--redirects", "9:1", "--tee", "9:1",
                     "--monitor_interval", "0.1", "--master_port", str(free_port()),
                     os.path.abspath(__file__), "--worker"] + size_args
        for impl, cmd in (("dtrain-shm", dtrain_cmd + ["--backend", "shm"]),
                          ("dtrain-gloo", dtrain_cmd + ["--backend", "gloo"]), ("torch", torch_cmd)):
            t0 = time.monotonic()
            got = parse_json_lines(run(cmd, a.timeout, impl), impl)
            expected = sizes(a.min_bytes, a.max_bytes, a.factor)
            missing = [b for b in expected if b not in got]
            if missing:
                raise SystemExit(f"allreduce_bench: {impl} printed no result for sizes {missing}")
            for b, row in got.items():
                rows[impl].setdefault(b, []).append(row)
            print(f"round {rnd + 1}/{a.rounds}: {impl} done in {time.monotonic() - t0:.1f} s", file=sys.stderr)

    def best(impl: str, b: int) -> float:
        return min(r["time_us"] for r in rows[impl][b])

    def med(impl: str, b: int) -> float:
        return statistics.median(r["median_us"] for r in rows[impl][b])

    header = (f"{'size':>8} | {'dtrain shm':>10} | {'dtrain gloo':>11} | {'torch gloo':>10} | {'shm/torch':>9} | "
              f"{'gloo/torch':>10} | {'shm algbw':>11} | {'torch algbw':>11}")
    print(f"all_reduce sum, float32, {a.nproc} processes; time per op, best of "
          f"{5 * a.rounds} timed blocks ({a.rounds} runs x 5)")
    print(header)
    print("-" * len(header))
    table = []
    for b in sizes(a.min_bytes, a.max_bytes, a.factor):
        st, gt, tt = best("dtrain-shm", b), best("dtrain-gloo", b), best("torch", b)
        sbw, tbw = b / st / 1e3, b / tt / 1e3  # bytes/us -> GB/s
        table.append({"bytes": b, "shm_time_us": st, "gloo_time_us": gt, "torch_time_us": tt,
                      "shm_ratio": st / tt, "gloo_ratio": gt / tt,
                      "shm_median_us": med("dtrain-shm", b), "gloo_median_us": med("dtrain-gloo", b),
                      "torch_median_us": med("torch", b), "shm_algbw_gbps": sbw, "torch_algbw_gbps": tbw})
        print(f"{human(b):>8} | {fmt_time(st):>10} | {fmt_time(gt):>11} | {fmt_time(tt):>10} | {st / tt:9.2f} | "
              f"{gt / tt:10.2f} | {sbw:6.3f} GB/s | {tbw:6.3f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"nproc": a.nproc, "rounds": a.rounds, "table": table, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
