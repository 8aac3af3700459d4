# A PyTorch script for deepspeed_launcher_test: joins a Gloo group the way a DeepSpeed script's
# deepspeed.init_distributed() does under its launcher (env://: rank 0 hosts the store at
# MASTER_ADDR:MASTER_PORT), all-reduces rank + 1 and prints one line.
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)  # DeepSpeed's launcher passes it
args = parser.parse_args()
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
n = dist.get_world_size()
print("ds_allreduce rank=%d world=%d local_rank=%d sum=%g expected=%g"
      % (dist.get_rank(), n, args.local_rank, t.item(), n * (n + 1) / 2), flush=True)
dist.destroy_process_group()
