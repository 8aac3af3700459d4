"""DeepSpeed itself as the peer of bench/zero_bench.cpp's throughput mode: the same MLP
(1024-2048-2048-1024-10, ~8.4M parameters), batch 64 per rank, Adam, fp32, stages 0-3 on CPU.
Run it under torchrun (DeepSpeed's CPU accelerator, Gloo when oneCCL is absent):

    torchrun --nproc-per-node 2 bench/zero_deepspeed_peer.py [--steps 20] [--rounds 3]

Rank 0 prints one JSON line per stage, like zero_bench's (samples/s, best round)."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", default="0,1,2,3")
    args = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    batch = 64
    x = torch.randn(batch, 1024)
    y = torch.randint(0, 10, (batch,))
    best = {}
    for _ in range(args.rounds):
        for stage in [int(s) for s in args.stages.split(",")]:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                                  nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10))
            config = {"train_micro_batch_size_per_gpu": batch,
                      "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
                      "zero_optimization": {"stage": stage, "reduce_bucket_size": 25000000},
                      "steps_per_print": 1000000}
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            secs = 0.0
            for s in range(-2, args.steps):
                if s == 0:
                    torch.distributed.barrier()
                t = time.perf_counter()
                loss = nn.functional.cross_entropy(engine(x), y)
                engine.backward(loss)
                engine.step()
                if s >= 0:
                    secs += time.perf_counter() - t
            t = torch.tensor([secs], dtype=torch.float64)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            sps = args.steps * batch * world / t.item()
            best[stage] = max(best.get(stage, 0.0), sps)
            del engine
    if rank == 0:
        for stage, sps in sorted(best.items()):
            print(json.dumps({"bench": "zero_throughput", "impl": "deepspeed-" + deepspeed.__version__,
                              "world": world, "variant": "stage%d" % stage, "samples_per_s": round(sps, 1)}))
    torch.distributed.destroy_process_group()
    # The interpreter's exit tears Gloo's threads down in its order and a rank can abort there:
    # every figure is printed, so skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
