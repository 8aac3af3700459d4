#!/usr/bin/env python3
"""Training throughput: examples/fashion_mnist under `dtrain run` against the same model in
PyTorch's Python DDP under torchrun (bench/pytorch_fashion_mnist.py), at 1 and 2 processes,
one thread per process, measured in the same run. dtrain runs on its default backend
("auto": shared memory, all ranks being local) and, as a second row, on plain Gloo
(--backend gloo, what PyTorch uses). With --fused, both sides also run Adam fused (the example's
`--optimizer fused-adam`, dtrain::FusedAdam; PyTorch's `Adam(fused=True)`, torch >= 2.4, so the
2.11 peer only). Prints global samples/s (training loop only), the
dtrain/PyTorch ratio and each side's scaling efficiency (2-process throughput over twice the
1-process). Runs are interleaved, so drifting machine load hits every side alike. Never fails
on timing.

    /usr/bin/python3 bench/train_bench.py [--build-dir build] [--repeat 3] [--steps 400] [--json FILE]
    python3 bench/train_bench.py --build-dir build-torch2 --torchrun ~/.cache/dtrain/venv/bin/torchrun
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_output import last_json

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        sys.exit(f"benchmark run failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return last_json(r.stdout)["samples_per_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=400, help="optimizer steps per run (per rank)")
    p.add_argument("--torchrun", default="/usr/bin/torchrun",
                   help="the PyTorch side's torchrun (default Debian's, torch 1.13, the peer of the 1.13 build; "
                        "the venv's for the 2.11 build)")
    p.add_argument("--fused", action="store_true",
                   help="also dtrain-fused and pytorch-fused: Adam as one fused pass on both sides")
    p.add_argument("--json")
    a = p.parse_args()
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    example = os.path.join(a.build_dir, "examples", "fashion_mnist")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    train = [example, "--epochs", "1", "--max-steps", str(a.steps), "--no-eval", "--log-every", "0"]
    peer = [a.torchrun, "--nproc_per_node", "{n}", "--redirects", "9:1", "--tee", "9:1", "--monitor_interval", "0.1",
            os.path.join(HERE, "pytorch_fashion_mnist.py"), "--max-steps", str(a.steps)]
    commands = {  # side -> its command, {n} the process count
        "dtrain": [dtrain, "run", "--nproc-per-node", "{n}"] + train + ["--backend", "auto"],
        "dtrain-gloo": [dtrain, "run", "--nproc-per-node", "{n}"] + train + ["--backend", "gloo"],
        "pytorch": peer,
    }
    if a.fused:
        commands["dtrain-fused"] = commands["dtrain"] + ["--optimizer", "fused-adam"]
        commands["pytorch-fused"] = peer + ["--optimizer", "fused-adam"]
    sides = tuple(commands)
    results = {(side, n): [] for side in sides for n in (1, 2)}
    for _ in range(a.repeat):  # interleaved, so drifting machine load hits every side alike
        for n in (1, 2):
            for side, cmd in commands.items():
                results[(side, n)].append(run([c.replace("{n}", str(n)) for c in cmd], env))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"Fashion-MNIST MLP 784-512-256-10, Adam, batch 64/rank, 1 thread/process, {a.steps} steps, "
          f"median of {a.repeat}")
    print(f"{'':12} {'1 process':>12} {'2 processes':>12} {'scaling eff.':>13}")
    for side in sides:
        eff = med[(side, 2)] / (2 * med[(side, 1)])
        print(f"{side:12} {med[(side, 1)]:12.0f} {med[(side, 2)]:12.0f} {eff:13.2f}")
    pairs = [(side, "pytorch") for side in sides if side.startswith("dtrain")]
    if a.fused:
        pairs.append(("dtrain-fused", "pytorch-fused"))
    for side, peer_side in pairs:
        r1 = med[(side, 1)] / med[(peer_side, 1)]
        r2 = med[(side, 2)] / med[(peer_side, 2)]
        print(f"{'ratio':12} {r1:11.2f}x {r2:11.2f}x   ({side} / {peer_side})")
    # Per round (each round runs every side back to back): robust to load that drifts
    # between rounds, which moves the medians above.
    rounds = range(a.repeat)
    print(f"per-round medians: dtrain/PyTorch at 2 processes "
          f"{statistics.median(results[('dtrain', 2)][i] / results[('pytorch', 2)][i] for i in rounds):.2f}x, "
          f"scaling efficiency dtrain "
          f"{statistics.median(results[('dtrain', 2)][i] / (2 * results[('dtrain', 1)][i]) for i in rounds):.2f}, "
          f"PyTorch "
          f"{statistics.median(results[('pytorch', 2)][i] / (2 * results[('pytorch', 1)][i]) for i in rounds):.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[0]}_{k[1]}": v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
