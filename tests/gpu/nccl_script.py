# An unchanged PyTorch 2.x NCCL script, as users write them, run by the gpu tests under
# `dtrain run`: init_process_group("nccl") from the launcher's environment, one GPU per local
# rank, an all_reduce and a barrier.
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((8,), float(rank + 1), device="cuda")
dist.all_reduce(t)
assert torch.equal(t.cpu(), torch.full((8,), world * (world + 1) / 2)), t
dist.barrier()
print(f"nccl script rank {rank} of {world} ok on cuda:{local_rank}", flush=True)
dist.destroy_process_group()
