"""DeepSpeed itself as the peer of `zero_bench rss`: each rank's peak RSS over the training steps
of the same model (LAYERS x Linear(WIDTH, WIDTH), default 83.9M fp32 parameters), batch 8, loss
out.pow(2).mean(), Adam lr 1e-4, DeepSpeed's defaults for everything but the stage (and
`torch_adam`, as DeepSpeed's fused Adam needs CUDA). Measured as zero_bench measures it: after
deepspeed.initialize each rank resets its high-water mark (`echo 5 > /proc/self/clear_refs`),
trains STEPS steps and reads VmHWM. One stage per launch, so every figure is a fresh process:

    torchrun --nproc-per-node 2 bench/zero_deepspeed_rss.py --stage 3 [--zero '{"...": 0}'] [--save DIR]

--save DIR: after the steps, DeepSpeed's save_checkpoint(DIR, tag "resume"), which
`zero_bench rss-worker ... --resume DIR --load-only` then loads (the peak RSS of dtrain reading
DeepSpeed's own files).

Rank 0 prints one JSON line: {"bench": "zero_rss", "impl": "deepspeed-<version>", "world",
"stage", "rss_before_model_bytes", "rss_after_init_bytes", "peak_rss_bytes": [per rank],
"max_peak_rss_bytes"}. bench/zero_rss_vs_deepspeed.py runs it beside zero_bench."""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, required=True)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--zero", default="", help="JSON merged into zero_optimization")
    ap.add_argument("--save", help="save DeepSpeed's checkpoint here (tag resume) after the steps")
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    before_model = status_bytes("VmRSS")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(a.width, a.width) for _ in range(a.layers)])
    zero = {"stage": a.stage}
    if a.zero:
        zero.update(json.loads(a.zero))
    config = {"train_micro_batch_size_per_gpu": a.batch,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_optimization": zero, "steps_per_print": 1000000}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(a.batch, a.width)
    torch.distributed.barrier()
    after_init = status_bytes("VmRSS")
    reset_peak()
    for _ in range(a.steps):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    peak = status_bytes("VmHWM")
    if a.save:
        engine.save_checkpoint(a.save, tag="resume")
    mine = torch.tensor([float(before_model), float(after_init), float(peak)], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    torch.distributed.all_gather(every, mine)
    if rank == 0:
        print(json.dumps({"bench": "zero_rss", "impl": "deepspeed-" + deepspeed.__version__, "world": world,
                          "stage": a.stage, "zero": zero,
                          "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters()),
                          "rss_before_model_bytes": [int(v[0]) for v in every],
                          "rss_after_init_bytes": [int(v[1]) for v in every],
                          "peak_rss_bytes": [int(v[2]) for v in every],
                          "max_peak_rss_bytes": int(max(v[2] for v in every))}), flush=True)
    torch.distributed.barrier()
    # Out without the interpreter's teardown: there DeepSpeed 0.19.8's stage 3 on the CPU
    # accelerator sometimes ends in "terminate called without an active exception" (SIGABRT,
    # seen at 2 and 4 ranks, always after the figures), which would fail a finished measurement.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
