#!/usr/bin/env python3
"""The torchrun side of bench/elastic_recovery_bench.py: the same training as
tests/elastic/elastic_train_worker.cpp (MLP 16-32-4 with dropout, Adam, DDP on Gloo, a
synthetic dataset, batch 8 per rank), with the resume code a torchrun user writes himself:
rank 0 saves model, optimizer, RNG, epoch and batch position every --commit-every steps
(torch.save to a temporary file, then os.replace), and a restarted attempt loads the newest
one and skips the batches of the epoch already done (DistributedSampler: same world size only).

It writes LOG_DIR/attempt<TORCHELASTIC_RESTART_COUNT>_rank<RANK>.log with the lines the C++
worker writes ("killing myself at T", "first_step S T") for the bench to read.
"""
import time

T0 = time.time()  # before importing torch

import argparse
import glob
import os
import re
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=240)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--commit-every", type=int, default=3)
    ap.add_argument("--kill-at-step", type=int, default=0)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--checkpoint-dir", required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = open(os.path.join(a.log_dir, f"attempt{restart}_rank{rank}.log"), "w", buffering=1)
    log.write(f"pid {os.getpid()}\nstarted_at {T0:.6f}\ninit_done {time.time():.6f}\n")

    torch.manual_seed(7)
    x_all = torch.randn(a.size, 16)
    y_all = x_all.matmul(torch.randn(16, 4)).argmax(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 4))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = DistributedSampler(range(a.size), num_replicas=world, rank=rank, shuffle=True, seed=3)

    # The user's resume code.
    step, epoch, batch_in_epoch = 0, 0, 0
    os.makedirs(a.checkpoint_dir, exist_ok=True)
    found = sorted(glob.glob(os.path.join(a.checkpoint_dir, "ckpt_*.pt")),
                   key=lambda p: int(re.search(r"ckpt_(\d+)\.pt$", p).group(1)))
    if restart > 0 and found:
        ck = torch.load(found[-1], weights_only=False)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
        step, epoch, batch_in_epoch = ck["step"], ck["epoch"], ck["batch_in_epoch"]
    log.write(f"resume {step} {world}\n")

    def save(ep: int, b: int) -> None:
        if rank != 0:
            return
        path = os.path.join(a.checkpoint_dir, f"ckpt_{step}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                    "step": step, "epoch": ep, "batch_in_epoch": b}, path + ".tmp")
        os.replace(path + ".tmp", path)

    first_logged = False
    steps_per_epoch = (len(sampler) + a.batch - 1) // a.batch
    while epoch < a.epochs:
        sampler.set_epoch(epoch)
        indices = list(sampler)
        for b in range(batch_in_epoch, steps_per_epoch):
            idx = torch.tensor(indices[b * a.batch:(b + 1) * a.batch])
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x_all[idx]), y_all[idx])
            loss.backward()
            optimizer.step()
            step += 1
            if a.kill_at_step and restart == 0 and rank == a.kill_rank and step == a.kill_at_step:
                log.write(f"killing myself at {time.time():.6f}\n")
                log.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            if step % a.commit_every == 0:
                save(epoch, b + 1)
            if rank == 0 and not first_logged:
                log.write(f"first_step {step} {time.time():.6f}\n")
                first_logged = True
            if a.step_sleep:
                time.sleep(a.step_sleep)
        epoch, batch_in_epoch = epoch + 1, 0
        save(epoch, 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
