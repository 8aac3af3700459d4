# The peer of examples/fashion_mnist in PyTorch: the same MLP (784-512-256-10), Adam lr 1e-3,
# batch 64 per rank, DistributedSampler, DDP over gloo, the same in-memory data and the same
# timing (training loop only, global samples/s). Run it under torchrun; train() alone runs in a
# process group someone else made (bench/ray_train_peer.py: Ray Train's workers).
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data.distributed import DistributedSampler


def load(path_images, path_labels):
    with gzip.open(path_images) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(path_labels) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(images.astype(np.float32)) / 255 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    # cuda: every rank on GPU LOCAL_RANK modulo the GPUs (several ranks may share one), DDP still
    # over gloo - PyTorch's way when NCCL cannot (ranks sharing a GPU).
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    # fused-adam: torch.optim.Adam(fused=True), PyTorch's own fused kernel (the example's
    # --optimizer fused-adam is dtrain::FusedAdam, which calls the same kernel on libtorch 2.x).
    p.add_argument("--optimizer", default="adam", choices=["adam", "fused-adam"])
    return p.parse_args(argv)


def train(a):
    """Trains in the default process group; returns rank 0's result (None on other ranks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load(f"{a.data_dir}/train-images-idx3-ubyte.gz", f"{a.data_dir}/train-labels-idx1-ubyte.gz")
    dev = torch.device("cpu")
    if a.device == "cuda":
        import os
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        x, y = x.to(dev), y.to(dev)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10)).to(dev)
    # As the C++ example: the gradients live in DDP's buckets (no copy back after the all-reduce).
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, fused=(a.optimizer == "fused-adam") or None)
    sampler = DistributedSampler(range(len(y)), shuffle=True, seed=0)
    loss_fn = nn.CrossEntropyLoss()
    steps, seen, seconds = 0, 0, 0.0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler), device=dev)
        t0 = time.perf_counter()
        for b in range(0, len(idx), a.batch_size):
            i = idx[b:b + a.batch_size]
            opt.zero_grad()
            loss_fn(ddp(x[i]), y[i]).backward()
            opt.step()
            steps += 1
            seen += len(i)
            if a.max_steps and steps >= a.max_steps:
                break
        if dev.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        if a.max_steps and steps >= a.max_steps:
            break
    if rank == 0:
        return {"world_size": world, "steps": steps, "samples_per_s": seen * world / seconds, "seconds": seconds}
    return None


def main():
    a = parse()
    dist.init_process_group("gloo")
    r = train(a)
    if r is not None:
        print(json.dumps(r), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
