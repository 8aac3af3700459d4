# An ordinary PyTorch DDP script, unchanged from what one would run under torchrun:
# init_process_group("gloo") from the launcher's environment, a few SGD steps on
# rank-dependent data, then every rank prints a digest of its parameters.
import hashlib
import json
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)  # different data on every rank
    for _ in range(10):
        x = torch.randn(8, 16, generator=gen)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    print(json.dumps({"rank": rank, "world_size": world, "digest": digest,
                      "local_rank": int(os.environ["LOCAL_RANK"])}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
