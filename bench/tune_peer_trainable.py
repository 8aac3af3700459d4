# The PyTorch peer of examples/tune's trainable, run under torchrun by bench/tune_ray_peer.py
# (Ray Tune's trial): the same MLP (784-h-h-10), Adam, global batch split over the ranks,
# DistributedSampler(shuffle, seed 0), DDP over gloo, the same training subset and
# validation set. Rank 0 prints one JSON line per epoch: {"epoch", "accuracy"}.
import argparse
import gzip
import json

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data.distributed import DistributedSampler


def load(data_dir, split, n):
    # Only the first n records are decompressed, as the C++ trainable does.
    with gzip.open(f"{data_dir}/{split}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(16 + n * 28 * 28), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(f"{data_dir}/{split}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(8 + n), np.uint8, offset=8)[:n]
    x = (torch.from_numpy(images.astype(np.float32)) / 255 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--train-subset", type=int, default=6000)
    p.add_argument("--val-subset", type=int, default=5000)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    x, y = load(a.data_dir, "train", a.train_subset)
    vx, vy = load(a.data_dir, "t10k", a.val_subset)
    torch.manual_seed(0)
    h = a.hidden
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sampler = DistributedSampler(range(len(y)), shuffle=True, seed=0)
    per_rank = max(1, a.batch_size // world)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        model.train()
        for b in range(0, len(idx), per_rank):
            i = idx[b:b + per_rank]
            opt.zero_grad()
            loss_fn(ddp(x[i]), y[i]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = (model(vx).argmax(1) == vy).double().mean().item()
        if dist.get_rank() == 0:
            print(json.dumps({"epoch": epoch + 1, "accuracy": acc}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
