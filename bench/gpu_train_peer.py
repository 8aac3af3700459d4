"""The Python peer of bench/gpu_train_bench.cpp: the same models, optimizer, batch and timing
in PyTorch eager mode on one GPU (torch.optim.Adam with its defaults: the foreach
implementation on CUDA). Prints one JSON line.

--fused: Adam(fused=True), PyTorch's one-kernel step (the peer of gpu_train_bench --optimizer fused).

--graph: the whole step captured with torch.cuda.graph and replayed ("whole network capture" in
PyTorch's CUDA-graph notes), Adam(fused=True, capturable=True) - the Python side of
gpu_train_bench --graph.

    python3 bench/gpu_train_peer.py --model mlp --batch 64 --steps 300 [--fused | --graph]
    python3 bench/gpu_train_peer.py --runs mlp:64:300,cnn:1024:100 [--graph]   (in turn, one line each)
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def make(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def run_one(kind, batch, steps, warmup, graph, fused):
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = make(kind).to(dev)
    x = torch.randn(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    if graph:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True, capturable=True)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused or None)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            loss_fn(model(x), y).backward()
            opt.step()
        step = g.replay

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    print(json.dumps({"side": "pytorch-eager", "model": kind, "batch": batch, "optimizer": "torch.optim.Adam" + ("(fused, capturable)" if graph else "(fused)" if fused else ""), "graph": graph,
                      "steps": steps, "seconds": secs, "samples_per_s": batch * steps / secs}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--runs", help="MODEL:BATCH:STEPS,... run in turn in this process")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--graph", action="store_true")
    mode.add_argument("--fused", action="store_true")
    a = p.parse_args()
    runs = [(a.model, a.batch, a.steps)]
    if a.runs:
        try:
            runs = [(m, int(b), int(s)) for m, b, s in (item.split(":") for item in a.runs.split(","))]
        except ValueError:
            p.error(f"--runs {a.runs!r}: each entry is MODEL:BATCH:STEPS")
    for kind, batch, steps in runs:
        run_one(kind, batch, steps, a.warmup, a.graph, a.fused)


if __name__ == "__main__":
    main()
