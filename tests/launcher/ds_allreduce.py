# A PyTorch script for deepspeed_launcher_test: joins a Gloo group the way a DeepSpeed script's
# deepspeed.init_distributed() does under its launcher (env://: rank 0 hosts the store at
# MASTER_ADDR:MASTER_PORT), all-reduces rank + 1 and prints one line.
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)  # DeepSpeed's launcher passes it
args = parser.parse_args()
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
n = dist.get_world_size()
# One write(2) of the whole line: DeepSpeed's launcher gives its workers one unprefixed stdout,
# and print() under `python -u` writes the text and its newline apart, so two ranks' lines could
# interleave ("...expected=3ds_allreduce rank=1 ...", seen once).
line = ("ds_allreduce rank=%d world=%d local_rank=%d sum=%g expected=%g\n"
        % (dist.get_rank(), n, args.local_rank, t.item(), n * (n + 1) / 2))
os.write(1, line.encode())
dist.destroy_process_group()
