#!/usr/bin/env python3
"""The GPU machine's benchmarks (issue #26), each against its PyTorch peer measured in the same
run, interleaved. scripts/gpu_check.sh runs it there; it needs a CUDA build of dtrain
(--build-dir) and the python3 that holds PyTorch (with torchrun beside it).

  train        one process on one GPU: the example's MLP (batch 64, 1024) and CNN (64, 1024);
               dtrain's C++ (bench/gpu_train_bench.cpp: libtorch's Adam, ATen's fused Adam, and
               the fused step captured as a CUDA graph) vs the same model in PyTorch eager mode
               (bench/gpu_train_peer.py), and PyTorch's own CUDA-graph step beside it
  ddp_one_gpu  DDP with 2 ranks on the one GPU: examples/fashion_mnist --device cuda under
               `dtrain run` (CUDA tensors through the shared-memory backend) vs PyTorch DDP
               with gloo on CUDA tensors under torchrun (bench/pytorch_fashion_mnist.py)
  zero_offload ZeRO-3 with optimizer and parameter offload to the CPU vs stage 0 (all on the
               GPU), 2 ranks on the one GPU, 8 x Linear(2048, 2048): samples/s and peak GPU
               memory (tests/gpu/gpu_worker.cpp's zero mode)
  launch       16 workers: dtrain run of a C++ worker vs torchrun of a Python no-op
  cpu_scaling  the MLP at 1, 8, 2, 4, 16 processes on the CPU (8, the target's row, right after
               the baseline, so a tight budget skips others first): dtrain (shared memory) vs
               PyTorch DDP (gloo), samples/s and scaling efficiency, beside the machine's
               ceiling (as many single-process runs at once, no communication), rank 0's
               shared-memory counters per collective (DTRAIN_SHM_STATS: time, waiting for
               peers in all and in the first barrier, futex sleeps, the hand-off to the
               backend's thread and back); at 8, dtrain and the ceiling again with each
               process bound to a CPU of its own (0-7, then 0, 2, ..., 14); with
               --cpu-wait-variants, at 2, 4 and 8,
               dtrain with other waits (WAIT_VARIANTS below) beside the default; and both
               sides again with Adam fused (the example's --optimizer fused-adam, PyTorch's Adam(fused=True))

--budget-s S keeps the whole run within S seconds (gpu_check.sh's 8 minutes): a benchmark, or a
row of cpu_scaling, that would not fit in what is left is skipped and listed under "skipped"
in the JSON and on the console, never silently.

Prints every figure and ratio, and writes them (with the machine) as JSON to --json. Never
fails on timing; exits 1 when a run fails.

    python3 bench/gpu_bench.py --build-dir build-gpu --json out.json [--only train,launch]
"""
import argparse
import collections
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_output import last_json

HERE = os.path.dirname(os.path.abspath(__file__))


def machine():
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except OSError:  # a machine without the driver's tools (the CPU benchmark alone)
        gpu = "none"
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    topo = {k.strip(): v.strip() for k, v in (l.split(":", 1) for l in lscpu.splitlines() if ":" in l)
            if k.strip() in ("Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA node(s)", "L3 cache")}
    # Which logical CPUs share a core (the kernel's view; a VM may hide its host's threads).
    siblings = sorted({open(f"/sys/devices/system/cpu/cpu{i}/topology/thread_siblings_list").read().strip()
                       for i in range(os.cpu_count() or 0)
                       if os.path.exists(f"/sys/devices/system/cpu/cpu{i}/topology/thread_siblings_list")})
    return {"gpu": gpu, "cpu": cpu, "cores": os.cpu_count(), "topology": topo, "thread_siblings": siblings,
            "host": platform.node(), "load": os.getloadavg()[0]}


def run(cmd, env=None, timeout=600, with_stderr=False):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return (r.stdout + "\n" + r.stderr if with_stderr else r.stdout), wall


SHM_STATS = re.compile(r"dtrain shm rank (\d+): (\d+) collectives, ([\d.]+) ms each \(of which ([\d.]+) ms waiting "
                       r"for peers in ([\d.]+) barriers, ([\d.]+) futex sleeps\), ([\d.]+) ms queued before each; "
                       r"first barriers ([\d.]+) ms waiting, ([\d.]+) sleeps; ([\d.]+) ms from completion to the "
                       r"waiter's return \((\d+) waits\), (\d+) run by their waiter")


def shm_stats(text):
    """Rank 0's shared-memory backend counters (DTRAIN_SHM_STATS=1), per collective: where a
    step's communication time goes (the reduction itself, waiting for peers, futex sleeps, the
    hand-off to the backend's thread); and every rank's waiting, which says whether one rank is
    the straggler (it waits least) or the skew moves around. None when the run printed none."""
    ranks = {}
    for m in SHM_STATS.finditer(text):
        r, n, each, wait, barriers, sleeps, queued, first_wait, first_sleeps, handback, waits, inline = m.groups()
        ranks.setdefault(int(r), {"collectives": int(n), "ms_each": float(each), "ms_waiting_for_peers": float(wait),
                                  "barriers": float(barriers), "futex_sleeps": float(sleeps),
                                  "ms_queued": float(queued), "ms_waiting_in_first_barrier": float(first_wait),
                                  "futex_sleeps_in_first_barrier": float(first_sleeps),
                                  "ms_handback": float(handback), "waits": int(waits),
                                  "run_by_their_waiter": int(inline)})
    if 0 not in ranks:
        return None
    out = dict(ranks[0])
    out["ms_waiting_per_rank"] = [ranks[r]["ms_waiting_for_peers"] for r in sorted(ranks)]
    out["futex_sleeps_per_rank"] = [ranks[r]["futex_sleeps"] for r in sorted(ranks)]
    out["ms_waiting_in_first_barrier_per_rank"] = [ranks[r]["ms_waiting_in_first_barrier"] for r in sorted(ranks)]
    out["ms_handback_per_rank"] = [ranks[r]["ms_handback"] for r in sorted(ranks)]
    return out


def describe_shm(st):
    return (f"per collective {st['ms_each']:.3f} ms, {st['ms_waiting_for_peers']:.3f} waiting "
            f"({st['ms_waiting_in_first_barrier']:.3f} in the first barrier), {st['futex_sleeps']:.2f} sleeps "
            f"({st['futex_sleeps_in_first_barrier']:.2f} in the first), {st['ms_queued']:.3f} queued, "
            f"{st['ms_handback']:.3f} handed back, {st['run_by_their_waiter']} of {st['collectives']} run by their "
            f"waiter")


# The shared-memory backend's waits beside its defaults (2, 4 and 8 processes). Where the ranks
# leave cores free (here: OMP_NUM_THREADS=1, up to 8 processes on 16 cores) its barriers spin 3 ms
# and a caller's wait 5 ms before they sleep, and a caller that waits for a collective the
# backend's thread has not started runs it itself (since 2026-11-28; at 8 processes 84.4k
# samples/s, "short_spins" 76.1k, "waits_as_before" 70.9k, H200 machine, one run each). The
# variants keep measuring what each part is worth. (Their rows replaced `--bind-cores-to-rank`,
# 1.00x/0.89x/1.00x at 2/4/8, and buckets outside the shared-memory pool, 1.03x/1.14x/1.06x with
# the pool, H200 machine 2026-11-28; and "no_wait_spin", 1.03x at 8.)
WAIT_VARIANTS = {
    "waits_as_before": {"DTRAIN_SHM_SPIN_US": "200", "DTRAIN_SHM_INNER_SPIN_US": "200", "DTRAIN_SHM_WAIT_SPIN_US": "0",
                        "DTRAIN_SHM_INLINE": "0"},
    "short_spins": {"DTRAIN_SHM_SPIN_US": "200", "DTRAIN_SHM_INNER_SPIN_US": "1000", "DTRAIN_SHM_WAIT_SPIN_US": "1000"},
    "no_inline": {"DTRAIN_SHM_INLINE": "0"},
}


def timeline_breakdown(path, min_bytes=1 << 20):
    """Where an all-reduce's waiting comes from, from a merged DTRAIN_TIMELINE trace: per step, the
    ranks' skew when they enter the all-reduce (the last rank's arrival minus the first's), how
    late each rank leaves the first barrier after the last arrival (wake-up), and each rank's
    time between two all-reduces (its compute: data, forward, backward, optimizer) - mean, and
    the mean over steps of the slowest rank's."""
    d = json.load(open(path))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    by_rank = collections.defaultdict(lambda: {"ar": [], "wait": []})
    for e in ev:
        if e.get("ph") != "X":
            continue
        if e["name"] == "shm all_reduce" and e.get("args", {}).get("bytes", 0) >= min_bytes:
            by_rank[e["pid"]]["ar"].append(e)
        elif e["name"] == "wait for peers":
            by_rank[e["pid"]]["wait"].append(e)
    ranks = sorted(by_rank)
    if len(ranks) < 2:
        return None
    steps = min(len(by_rank[r]["ar"]) for r in ranks)
    if steps < 3:
        return None
    arrive, leave_first, end = {}, {}, {}
    for r in ranks:
        ars = sorted(by_rank[r]["ar"], key=lambda e: e["ts"])[:steps]
        waits = sorted(by_rank[r]["wait"], key=lambda e: e["ts"])
        arrive[r], leave_first[r], end[r] = [], [], []
        i = 0
        for a in ars:
            while i < len(waits) and waits[i]["ts"] < a["ts"]:
                i += 1
            w = waits[i] if i < len(waits) and waits[i]["ts"] <= a["ts"] + a["dur"] else None
            arrive[r].append(w["ts"] if w else a["ts"])
            leave_first[r].append(w["ts"] + w["dur"] if w else a["ts"])
            end[r].append(a["ts"] + a["dur"])
    skew, lag, compute, slowest, last_rank = [], [], [], [], collections.Counter()
    for k in range(1, steps):  # the first all-reduce follows set-up, not a step
        arr = {r: arrive[r][k] for r in ranks}
        last = max(arr.values())
        skew.append(last - min(arr.values()))
        last_rank[max(arr, key=arr.get)] += 1
        lag.append(max(leave_first[r][k] - last for r in ranks))
        c = [arrive[r][k] - end[r][k - 1] for r in ranks]
        compute.append(statistics.mean(c))
        slowest.append(max(c))
    us = lambda v: statistics.mean(v) / 1000.0  # trace times are microseconds: report ms
    return {"steps": steps - 1, "ms_arrival_skew": us(skew), "ms_wake_lag_worst_rank": us(lag),
            "ms_compute_mean": us(compute), "ms_compute_slowest_rank": us(slowest),
            "ms_compute_stdev_over_steps": statistics.pstdev(compute) / 1000.0,
            "last_to_arrive_by_rank": {str(r): last_rank[r] for r in ranks}}


def bench_train(a, out):
    binary = os.path.join(a.build_dir, "bench", "gpu_train_bench")
    peer = os.path.join(HERE, "gpu_train_peer.py")
    rows = []
    # dtrain's C++: libtorch's Adam, ATen's fused Adam, and the fused step captured as a CUDA graph;
    # PyTorch: eager with its default Adam (the target's peer), eager with Adam(fused=True) (the
    # peer of dtrain's fused step: fusing is not mistaken for C++'s gain), and its own whole-step
    # CUDA graph (likewise for the graph). A variant that fails is reported, not fatal.
    variants = {"torch": [binary, "--optimizer", "torch"], "fused": [binary, "--optimizer", "fused"],
                "graph": [binary, "--optimizer", "fused", "--graph"], "eager": [a.python, peer],
                "py_fused": [a.python, peer, "--fused"], "py_graph": [a.python, peer, "--graph"]}
    configs = (("mlp", 64), ("mlp", 1024), ("cnn", 64), ("cnn", 1024))
    # The CNN at batch 1024 is bound by its kernels: both CUDA graphs gained nothing there
    # (1.04x and 0.99x on the H100, 2026-11-27); skipped to keep gpu_check within 8 minutes.
    skip = {("cnn", 1024): ("graph", "py_graph")}
    got = {c: {k: [] for k in variants} for c in configs}
    for _ in range(a.repeat):
        for k, cmd in variants.items():
            # Every configuration in one process per variant, in turn (one CUDA start-up each:
            # four fewer process starts per variant than one process per configuration).
            mine = [c for c in configs if k not in skip.get(c, ())]
            runs = ",".join(f"{m}:{b}:{300 if b == 64 else 100}" for m, b in mine)
            try:
                o, _ = run(cmd + ["--runs", runs])
                for line in o.splitlines():
                    if line.startswith("{"):
                        r = json.loads(line)
                        got[(r["model"], r["batch"])][k].append(r["samples_per_s"])
            except RuntimeError as e:
                if k not in ("graph", "py_fused", "py_graph"):
                    raise
                out.setdefault("errors", {})[f"train {k}"] = str(e)[-1500:]
                print(f"train {k}: FAILED: {str(e)[-800:]}", file=sys.stderr, flush=True)
    for model, batch in configs:
        med = {k: statistics.median(v) if v else None for k, v in got[(model, batch)].items()}

        def ratio(k, peer_key="eager"):
            return med[k] / med[peer_key] if med[k] and med[peer_key] else None

        row = {"model": model, "batch": batch, "dtrain_torch_adam": med["torch"], "dtrain_fused_adam": med["fused"],
               "dtrain_graph": med["graph"], "pytorch_eager": med["eager"], "pytorch_fused_adam": med["py_fused"],
               "pytorch_graph": med["py_graph"], "ratio_torch_adam": ratio("torch"), "ratio_fused_adam": ratio("fused"),
               "ratio_fused_vs_pytorch_fused": ratio("fused", "py_fused"),
               "ratio_graph": ratio("graph"), "ratio_graph_vs_pytorch_graph": ratio("graph", "py_graph")}
        rows.append(row)
        fmt = lambda v: "-" if v is None else f"{v:.0f}"
        fx = lambda v: "-" if v is None else f"{v:.2f}x"
        print(f"train {model} b{batch}: dtrain {fmt(med['torch'])} (libtorch Adam) / {fmt(med['fused'])} (fused Adam) / "
              f"{fmt(med['graph'])} (fused, CUDA graph) vs PyTorch eager {fmt(med['eager'])} samples/s -> "
              f"{fx(row['ratio_torch_adam'])} / {fx(row['ratio_fused_adam'])} / {fx(row['ratio_graph'])}; "
              f"PyTorch with Adam(fused=True) {fmt(med['py_fused'])} (dtrain's fused Adam "
              f"{fx(row['ratio_fused_vs_pytorch_fused'])}); PyTorch with its own CUDA graph {fmt(med['py_graph'])} (dtrain's graph {fx(row['ratio_graph_vs_pytorch_graph'])})",
              flush=True)
    out["train"] = rows


def bench_ddp_one_gpu(a, out):
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    example = os.path.join(a.build_dir, "examples", "fashion_mnist")
    peer = os.path.join(HERE, "pytorch_fashion_mnist.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    got = {"dtrain": [], "pytorch_gloo_cuda": []}
    for _ in range(a.repeat):
        o, _ = run([dtrain, "run", "--nproc-per-node", "2", example, "--device", "cuda", "--epochs", "1",
                    "--max-steps", str(a.ddp_steps), "--no-eval", "--log-every", "0"], env)
        got["dtrain"].append(last_json(o)["samples_per_s"])
        o, _ = run([a.torchrun, "--nproc-per-node", "2", "--monitor-interval", "0.1", peer, "--device", "cuda",
                    "--max-steps", str(a.ddp_steps)], env)
        got["pytorch_gloo_cuda"].append(last_json(o)["samples_per_s"])
    med = {k: statistics.median(v) for k, v in got.items()}
    out["ddp_one_gpu"] = dict(med, ratio=med["dtrain"] / med["pytorch_gloo_cuda"], ranks=2, steps=a.ddp_steps)
    print(f"ddp 2 ranks on one GPU: dtrain {med['dtrain']:.0f} vs PyTorch gloo-on-CUDA "
          f"{med['pytorch_gloo_cuda']:.0f} samples/s -> {out['ddp_one_gpu']['ratio']:.2f}x", flush=True)


def bench_zero_offload(a, out):
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    worker = os.path.join(a.build_dir, "tests", "gpu_worker")
    env = dict(os.environ, OMP_NUM_THREADS="4")
    got = {0: [], 3: []}
    peak = {}
    for _ in range(a.repeat):
        for stage in (0, 3):
            o, _ = run([dtrain, "run", "--nproc-per-node", "2", worker, "zero", "cuda", "0", str(stage),
                        str(a.zero_steps)], env)
            r = last_json(o)
            got[stage].append(r["samples_per_s"])
            peak[stage] = max(peak.get(stage, 0.0), r["peak_gpu_mb"])
    med = {k: statistics.median(v) for k, v in got.items()}
    # A worker that reports no GPU memory (0 MB) gives no memory ratio rather than a crash.
    mem_ratio = peak[3] / peak[0] if peak[0] > 0 else None
    out["zero_offload"] = {"stage0_samples_per_s": med[0], "stage3_offload_samples_per_s": med[3],
                           "stage0_peak_gpu_mb": peak[0], "stage3_offload_peak_gpu_mb": peak[3],
                           "speed_ratio": med[3] / med[0], "memory_ratio": mem_ratio,
                           "ranks": 2, "steps": a.zero_steps}
    print(f"zero-3 offload vs stage 0 (2 ranks, one GPU): {med[3]:.0f} vs {med[0]:.0f} samples/s "
          f"({med[3] / med[0]:.2f}x), peak GPU memory {peak[3]:.0f} vs {peak[0]:.0f} MB "
          f"({'n/a' if mem_ratio is None else f'{mem_ratio:.2f}x'})", flush=True)


def bench_launch(a, out):
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    worker = os.path.join(a.build_dir, "examples", "hello_worker")
    noop = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    noop.write("pass\n")
    noop.close()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The same C++ workers with no GPU visible: what probing the GPU at init_process_group costs
    # 16 processes (the "auto" backend loads the CUDA plugin and asks each rank's GPU).
    no_gpu = dict(env, CUDA_VISIBLE_DEVICES="")
    got = {"dtrain_cpp": [], "torchrun_python_noop": [], "dtrain_cpp_no_gpu_visible": []}
    for i in range(max(a.repeat, 3)):  # a second each: three rounds, the median
        _, w = run([dtrain, "run", "--nproc-per-node", "16", worker], env)
        got["dtrain_cpp"].append(w)
        _, w = run([a.torchrun, "--nproc-per-node", "16", "--monitor-interval", "0.1", noop.name], env)
        got["torchrun_python_noop"].append(w)
        if i == 0:  # a diagnosis, not a target: once
            _, w = run([dtrain, "run", "--nproc-per-node", "16", worker], no_gpu)
            got["dtrain_cpp_no_gpu_visible"].append(w)
    os.unlink(noop.name)
    med = {k: statistics.median(v) for k, v in got.items()}
    out["launch16"] = dict(med, ratio=med["torchrun_python_noop"] / med["dtrain_cpp"], rounds=got)
    print(f"launch 16 workers: dtrain (C++ worker, all-reduce) {med['dtrain_cpp']:.2f} s vs torchrun (Python "
          f"no-op) {med['torchrun_python_noop']:.2f} s -> {out['launch16']['ratio']:.1f}x faster; dtrain with no "
          f"GPU visible {med['dtrain_cpp_no_gpu_visible']:.2f} s (median of {len(got['dtrain_cpp'])} rounds)", flush=True)


def time_left(a):
    return None if a.deadline is None else a.deadline - time.monotonic()


def skip(out, what, why):
    out.setdefault("skipped", {})[what] = why
    print(f"{what}: SKIPPED ({why})", flush=True)


def bench_cpu_scaling(a, out):
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    example = os.path.join(a.build_dir, "examples", "fashion_mnist")
    peer = os.path.join(HERE, "pytorch_fashion_mnist.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    train = [example, "--epochs", "1", "--max-steps", str(a.cpu_steps), "--no-eval", "--log-every", "0"]
    # Adam fused on both sides (dtrain::FusedAdam; PyTorch's Adam(fused=True)): on the CPU
    # libtorch's Adam is most of this MLP's step, so the fused rows say what each side reaches.
    fused = ["--optimizer", "fused-adam"]

    def apart(n, cpus=None):
        # The machine's own ceiling: n single-process trainings at once, no communication at all
        # (what cores, caches and memory bandwidth allow n processes; sums their samples/s);
        # `cpus`: process i bound to CPU cpus[i].
        pin = lambda i: [] if cpus is None else ["--bind-cores-to-rank", "--bind-core-list", str(cpus[i])]
        procs = [subprocess.Popen([dtrain, "run", "--nproc-per-node", "1", "--master-port", str(29700 + i)] + pin(i)
                                  + train, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for i in range(n)]
        total = 0.0
        try:
            for p in procs:
                o, _ = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise RuntimeError(f"apart run exited {p.returncode}\n{o[-2000:]}")
                total += last_json(o)["samples_per_s"]
        finally:
            for p in procs:  # none left running when one failed or timed out
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return total

    rows = {}
    last_round_s, last_n = 0.0, 0
    for n in map(int, a.cpu_procs.split(",")):
        left = time_left(a)
        # A round of a row takes about as long as one of the row before, and longer with more
        # processes on the same cores (8 after 1: 1.6x, H200 machine 2026-11-30).
        rounds = max(3, a.repeat) if n == 1 else a.repeat
        need = last_round_s * rounds * (1.6 if n > last_n else 1.0)
        if left is not None and left < need:
            skip(out, f"cpu_scaling {n} procs", f"{left:.0f} s left of the budget, a round of the {last_n}-process "
                 f"row took {last_round_s:.0f} s")
            continue
        row_start = time.monotonic()
        d, p, c, stats, timeline, pinned = [], [], [], None, None, {}
        df, pf = [], []
        var_runs = {name: [] for name in WAIT_VARIANTS}
        var_stats = {}
        # The one-process row is every efficiency's baseline, and one run of it moved by a quarter
        # between two runs of the same command (14.5k, 11.4k; H200 machine 2026-11-28): 3 rounds.
        for _ in range(rounds):
            o, _ = run([dtrain, "run", "--nproc-per-node", str(n)] + train, dict(env, DTRAIN_SHM_STATS="1"),
                       with_stderr=True)
            d.append(last_json(o)["samples_per_s"])
            stats = shm_stats(o) or stats
            o, _ = run([a.torchrun, "--nproc-per-node", str(n), "--monitor-interval", "0.1", peer, "--max-steps",
                        str(a.cpu_steps)], env)
            p.append(last_json(o)["samples_per_s"])
            c.append(apart(n))
            o, _ = run([dtrain, "run", "--nproc-per-node", str(n)] + train + fused, env)
            df.append(last_json(o)["samples_per_s"])
            o, _ = run([a.torchrun, "--nproc-per-node", str(n), "--monitor-interval", "0.1", peer, "--max-steps",
                        str(a.cpu_steps)] + fused, env)
            pf.append(last_json(o)["samples_per_s"])
            if a.cpu_wait_variants and n in (2, 4, 8):
                for name, extra_env in WAIT_VARIANTS.items():
                    o, _ = run([dtrain, "run", "--nproc-per-node", str(n)] + train,
                               dict(env, DTRAIN_SHM_STATS="1", **extra_env), with_stderr=True)
                    var_runs[name].append(last_json(o)["samples_per_s"])
                    var_stats[name] = shm_stats(o) or var_stats.get(name)
            if n == 8 and not pinned and (os.cpu_count() or 0) >= 16:
                # Where the 8 processes run: the ceiling at 8 was 0.70 of eight times one process
                # where 4 reached 0.92 (H200 machine, 2026-11-30): each process bound to its own
                # CPU, the first eight and every other one, dtrain and the ceiling alike (the VM
                # shows no threads sharing a core; its host may).
                for label, cpus in (("cpus 0-7", list(range(8))), ("even cpus 0-14", list(range(0, 16, 2)))):
                    o, _ = run([dtrain, "run", "--nproc-per-node", "8", "--bind-cores-to-rank", "--bind-core-list",
                                ",".join(map(str, cpus))] + train, env)
                    pinned[label] = {"dtrain": last_json(o)["samples_per_s"], "apart": apart(8, cpus)}
            if n == 8 and a.json and not timeline:
                # One more run with a trace of every rank's steps (slower: a diagnosis of where
                # the waiting comes from, not a figure of speed).
                path = os.path.join(os.path.dirname(os.path.abspath(a.json)), f"timeline_cpu_{n}procs.json")
                run([dtrain, "run", "--nproc-per-node", str(n)] + train, dict(env, DTRAIN_TIMELINE=path))
                timeline = timeline_breakdown(path)
                os.unlink(path)  # the device tool did not bring it back (2026-11-28); its split is kept
        rows[n] = {"dtrain": statistics.median(d), "pytorch": statistics.median(p), "apart": statistics.median(c),
                   "dtrain_fused": statistics.median(df), "pytorch_fused": statistics.median(pf),
                   "rounds": {"dtrain": d, "pytorch": p, "apart": c, "dtrain_fused": df, "pytorch_fused": pf}}
        if any(var_runs.values()):
            rows[n]["variants"] = {name: {"samples_per_s": statistics.median(v), "env": WAIT_VARIANTS[name],
                                          "shm_rank0": var_stats.get(name)}
                                   for name, v in var_runs.items() if v}
        if stats:
            rows[n]["dtrain_shm_rank0"] = stats
        if timeline:
            rows[n]["timeline"] = timeline
        if pinned:
            rows[n]["pinned"] = pinned
        last_round_s, last_n = (time.monotonic() - row_start) / rounds, n
    # The one-process baseline of dtrain's and the ceiling's efficiency: every run of the row's
    # two forms of the same command (one process, no communication), averaged - one run of ~0.7 s
    # moved by a third between two on the H100 machine (11.0k vs 17.5k samples/s, 2026-11-27).
    ones = rows[1]["rounds"]["dtrain"] + rows[1]["rounds"]["apart"]
    base = statistics.mean(ones)
    out["cpu_one_process_baseline"] = {"runs": ones, "mean": base}
    print(f"cpu one-process baseline of the efficiencies: {base:.0f} samples/s (the one-process runs: "
          f"{', '.join(f'{v:.0f}' for v in ones)})", flush=True)
    rows = dict(sorted(rows.items()))
    for n, r in rows.items():
        r["ratio"] = r["dtrain"] / r["pytorch"]
        r["dtrain_efficiency"] = r["dtrain"] / (n * base)
        r["pytorch_efficiency"] = r["pytorch"] / (n * rows[1]["pytorch"])
        r["apart_efficiency"] = r["apart"] / (n * base)
        r["dtrain_of_apart"] = r["dtrain"] / r["apart"]
        # Fused Adam: against PyTorch's default Adam (the peer) and its fused one, and the
        # efficiency against the fused one-process runs (a faster step: its own baseline).
        r["fused_ratio"] = r["dtrain_fused"] / r["pytorch"]
        r["fused_ratio_vs_pytorch_fused"] = r["dtrain_fused"] / r["pytorch_fused"]
        r["dtrain_fused_efficiency"] = r["dtrain_fused"] / (n * statistics.mean(rows[1]["rounds"]["dtrain_fused"]))
        r["pytorch_fused_efficiency"] = r["pytorch_fused"] / (n * rows[1]["pytorch_fused"])
        extra = ""
        st = r.get("dtrain_shm_rank0")
        if st:
            per_rank = st.get("ms_waiting_per_rank") or []
            extra += f"; {describe_shm(st)}" + (
                f"; waiting by rank {min(per_rank):.2f}-{max(per_rank):.2f} ms, least rank "
                f"{per_rank.index(min(per_rank))}" if len(per_rank) > 1 else "")
        for name, v in r.get("variants", {}).items():
            v["ratio_default_to_this"] = r["dtrain"] / v["samples_per_s"]
            extra += (f"; {name} {v['samples_per_s']:.0f} (default {v['ratio_default_to_this']:.2f}x of it"
                      + (f"; {describe_shm(v['shm_rank0'])}" if v.get("shm_rank0") else "") + ")")
        t = r.get("timeline")
        if t:
            extra += (f"; traced ({t['steps']} steps): ranks' skew entering the all-reduce {t['ms_arrival_skew']:.3f} ms, "
                      f"worst wake-up after the last arrival {t['ms_wake_lag_worst_rank']:.3f} ms, time between "
                      f"all-reduces {t['ms_compute_mean']:.3f} ms mean / {t['ms_compute_slowest_rank']:.3f} ms the "
                      f"slowest rank's, last to arrive by rank {t['last_to_arrive_by_rank']}")
        print(f"cpu {n:2d} procs: dtrain {r['dtrain']:.0f} (eff {r['dtrain_efficiency']:.2f}{extra}) vs PyTorch "
              f"{r['pytorch']:.0f} (eff {r['pytorch_efficiency']:.2f}) samples/s -> {r['ratio']:.2f}x; "
              f"{n} processes apart (no communication) {r['apart']:.0f} (eff {r['apart_efficiency']:.2f}): "
              f"dtrain is {r['dtrain_of_apart']:.2f} of the machine's ceiling", flush=True)
        for label, v in r.get("pinned", {}).items():
            v["dtrain_efficiency"], v["apart_efficiency"] = v["dtrain"] / (n * base), v["apart"] / (n * base)
            print(f"cpu {n:2d} procs, one per CPU ({label}): dtrain {v['dtrain']:.0f} (eff {v['dtrain_efficiency']:.2f}, "
                  f"{v['dtrain'] / r['pytorch']:.2f}x PyTorch), {n} apart {v['apart']:.0f} (eff "
                  f"{v['apart_efficiency']:.2f})", flush=True)
        print(f"cpu {n:2d} procs, Adam fused on both sides: dtrain {r['dtrain_fused']:.0f} "
              f"(eff {r['dtrain_fused_efficiency']:.2f}) vs PyTorch fused {r['pytorch_fused']:.0f} "
              f"(eff {r['pytorch_fused_efficiency']:.2f}) -> {r['fused_ratio_vs_pytorch_fused']:.2f}x; "
              f"vs PyTorch's default Adam {r['fused_ratio']:.2f}x", flush=True)
    out["cpu_scaling"] = {str(n): r for n, r in rows.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--torchrun", default=os.path.join(os.path.dirname(sys.executable), "torchrun"))
    p.add_argument("--json")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--ddp-steps", type=int, default=400)
    p.add_argument("--cpu-steps", type=int, default=120)
    p.add_argument("--cpu-procs", default="1,8,2,4,16", help="process counts of cpu_scaling (1 first)")
    p.add_argument("--cpu-wait-variants", action="store_true",
                   help="cpu_scaling also runs dtrain with the shared-memory backend's other waits (WAIT_VARIANTS)")
    p.add_argument("--zero-steps", type=int, default=12)
    p.add_argument("--only", default="train,ddp_one_gpu,zero_offload,launch,cpu_scaling")
    p.add_argument("--budget-s", type=float, help="skip what would not fit in this many seconds (see above)")
    a = p.parse_args()
    a.deadline = None if a.budget_s is None else time.monotonic() + a.budget_s
    out = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    failed = []
    for name in a.only.split(","):
        left = time_left(a)
        if left is not None and left < 10:
            skip(out, name, f"{left:.0f} s left of the budget")
            continue
        t0 = time.perf_counter()
        try:
            globals()["bench_" + name](a, out)
        except Exception as e:  # one failing benchmark must not hide the others' figures
            failed.append(name)
            out.setdefault("errors", {})[name] = str(e)[-3000:]
            print(f"{name}: FAILED: {str(e)[-1500:]}", file=sys.stderr, flush=True)
        out.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
