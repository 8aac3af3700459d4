#!/usr/bin/env python3
"""The GPU machine's benchmarks (issue #26), each against its PyTorch peer measured in the same
run, interleaved. scripts/gpu_check.sh runs it there; it needs a CUDA build of dtrain
(--build-dir) and the python3 that holds PyTorch (with torchrun beside it).

  train        one process on one GPU: the example's MLP (batch 64, 1024) and CNN (64, 1024);
               dtrain's C++ (bench/gpu_train_bench.cpp, libtorch's Adam and ATen's fused Adam)
               vs the same model in PyTorch eager mode (bench/gpu_train_peer.py)
  ddp_one_gpu  DDP with 2 ranks on the one GPU: examples/fashion_mnist --device cuda under
               `dtrain run` (CUDA tensors through the shared-memory backend) vs PyTorch DDP
               with gloo on CUDA tensors under torchrun (bench/pytorch_fashion_mnist.py)
  zero_offload ZeRO-3 with optimizer and parameter offload to the CPU vs stage 0 (all on the
               GPU), 2 ranks on the one GPU, 8 x Linear(2048, 2048): samples/s and peak GPU
               memory (tests/gpu/gpu_worker.cpp's zero mode)
  launch       16 workers: dtrain run of a C++ worker vs torchrun of a Python no-op
  cpu_scaling  the MLP at 1, 2, 4, 8, 16 processes on the CPU: dtrain (shared memory) vs
               PyTorch DDP (gloo), samples/s and scaling efficiency

Prints every figure and ratio, and writes them (with the machine) as JSON to --json. Never
fails on timing; exits 1 when a run fails.

    python3 bench/gpu_bench.py --build-dir build-gpu --json out.json [--only train,launch]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench_output import last_json

HERE = os.path.dirname(os.path.abspath(__file__))


def machine():
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"gpu": gpu, "cpu": cpu, "cores": os.cpu_count(), "host": platform.node(),
            "load": os.getloadavg()[0]}


def run(cmd, env=None, timeout=600):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r.stdout, wall


def bench_train(a, out):
    binary = os.path.join(a.build_dir, "bench", "gpu_train_bench")
    peer = os.path.join(HERE, "gpu_train_peer.py")
    rows = []
    for model, batch in (("mlp", 64), ("mlp", 1024), ("cnn", 64), ("cnn", 1024)):
        steps = "300" if batch == 64 else "100"
        got = {"torch": [], "fused": [], "eager": []}
        for _ in range(a.repeat):
            for opt in ("torch", "fused"):
                o, _ = run([binary, "--model", model, "--batch", str(batch), "--steps", steps, "--optimizer", opt])
                got[opt].append(last_json(o)["samples_per_s"])
            o, _ = run([a.python, peer, "--model", model, "--batch", str(batch), "--steps", steps])
            got["eager"].append(last_json(o)["samples_per_s"])
        med = {k: statistics.median(v) for k, v in got.items()}
        row = {"model": model, "batch": batch, "dtrain_torch_adam": med["torch"], "dtrain_fused_adam": med["fused"],
               "pytorch_eager": med["eager"], "ratio_torch_adam": med["torch"] / med["eager"],
               "ratio_fused_adam": med["fused"] / med["eager"]}
        rows.append(row)
        print(f"train {model} b{batch}: dtrain {med['torch']:.0f} (libtorch Adam) / {med['fused']:.0f} (fused Adam) "
              f"vs PyTorch eager {med['eager']:.0f} samples/s -> {row['ratio_torch_adam']:.2f}x / "
              f"{row['ratio_fused_adam']:.2f}x", flush=True)
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
    got = {"dtrain_cpp": [], "torchrun_python_noop": []}
    for _ in range(a.repeat):
        _, w = run([dtrain, "run", "--nproc-per-node", "16", worker], env)
        got["dtrain_cpp"].append(w)
        _, w = run([a.torchrun, "--nproc-per-node", "16", "--monitor-interval", "0.1", noop.name], env)
        got["torchrun_python_noop"].append(w)
    os.unlink(noop.name)
    med = {k: statistics.median(v) for k, v in got.items()}
    out["launch16"] = dict(med, ratio=med["torchrun_python_noop"] / med["dtrain_cpp"])
    print(f"launch 16 workers: dtrain (C++ worker, all-reduce) {med['dtrain_cpp']:.2f} s vs torchrun (Python "
          f"no-op) {med['torchrun_python_noop']:.2f} s -> {out['launch16']['ratio']:.1f}x faster", flush=True)


def bench_cpu_scaling(a, out):
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    example = os.path.join(a.build_dir, "examples", "fashion_mnist")
    peer = os.path.join(HERE, "pytorch_fashion_mnist.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = {}
    for n in (1, 2, 4, 8, 16):
        d, p = [], []
        for _ in range(a.repeat):
            o, _ = run([dtrain, "run", "--nproc-per-node", str(n), example, "--epochs", "1", "--max-steps",
                        str(a.cpu_steps), "--no-eval", "--log-every", "0"], env)
            d.append(last_json(o)["samples_per_s"])
            o, _ = run([a.torchrun, "--nproc-per-node", str(n), "--monitor-interval", "0.1", peer, "--max-steps",
                        str(a.cpu_steps)], env)
            p.append(last_json(o)["samples_per_s"])
        rows[n] = {"dtrain": statistics.median(d), "pytorch": statistics.median(p)}
    for n, r in rows.items():
        r["ratio"] = r["dtrain"] / r["pytorch"]
        r["dtrain_efficiency"] = r["dtrain"] / (n * rows[1]["dtrain"])
        r["pytorch_efficiency"] = r["pytorch"] / (n * rows[1]["pytorch"])
        print(f"cpu {n:2d} procs: dtrain {r['dtrain']:.0f} (eff {r['dtrain_efficiency']:.2f}) vs PyTorch "
              f"{r['pytorch']:.0f} (eff {r['pytorch_efficiency']:.2f}) samples/s -> {r['ratio']:.2f}x", flush=True)
    out["cpu_scaling"] = {str(n): r for n, r in rows.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--torchrun", default=os.path.join(os.path.dirname(sys.executable), "torchrun"))
    p.add_argument("--json")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--ddp-steps", type=int, default=400)
    p.add_argument("--cpu-steps", type=int, default=150)
    p.add_argument("--zero-steps", type=int, default=12)
    p.add_argument("--only", default="train,ddp_one_gpu,zero_offload,launch,cpu_scaling")
    a = p.parse_args()
    out = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    failed = []
    for name in a.only.split(","):
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
