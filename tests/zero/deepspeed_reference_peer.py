"""DeepSpeed's own LR schedulers and optimizers over given steps: the peer of
tests/zero/deepspeed_reference_test.cpp (DeepSpeed 0.19.8 from the venv, on CPU).

Usage: deepspeed_reference_peer.py CASES.json OUT.json

Every case holds a DeepSpeed config. The optimizer is built by DeepSpeed's own engine code
(DeepSpeedEngine._configure_basic_optimizer on the parsed DeepSpeedConfig: FusedAdam for Adam
and AdamW, torch.optim.SGD for SGD), the scheduler as the engine builds it
(lr_schedules.<type>(optimizer, **params)), and each step runs as the engine's
_take_model_step does: optimizer.step(), then scheduler.step().

  {"kind": "scheduler", "config": {...}, "steps": S}
      -> [[lr, beta1, beta2] the optimizer holds for update k, k = 1..S]
  {"kind": "optimizer", "config": {...}, "init": [...], "grads": [[...] per step]}
      -> [[the parameter after update k] k = 1..S]
  {"kind": "config", "path": FILE, "world_size": N}
      -> DeepSpeedConfig(FILE)'s resolved values as DeepSpeed parses it (hjson, duplicate keys
         refused) for a data-parallel world of N ranks, or {"error": message}
One process runs every case: importing DeepSpeed is the slow part.
"""
import functools
import json
import logging
import os
import sys
import types

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
from deepspeed.runtime import lr_schedules  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from deepspeed.utils import logger  # noqa: E402

logger.setLevel(logging.ERROR)


def build(config, params):
    """The optimizer and scheduler DeepSpeed's engine makes for `config` (no ZeRO offload)."""
    ds = DeepSpeedConfig(dict(config, train_micro_batch_size_per_gpu=1))
    stub = types.SimpleNamespace(
        optimizer_params=lambda: ds.optimizer_params,
        optimizer_name=lambda: ds.optimizer_name,
        zero_use_cpu_optimizer=lambda: False,
        bf16_optimizer_states=lambda: False,
        zenflow=False,
        has_moe_layers=False)
    stub.get_optimizer_configuration = functools.partial(DeepSpeedEngine.get_optimizer_configuration, stub)
    optimizer = DeepSpeedEngine._configure_basic_optimizer(stub, params)
    scheduler = None
    if ds.scheduler_name is not None:
        scheduler = getattr(lr_schedules, ds.scheduler_name)(optimizer, **ds.scheduler_params)
    return optimizer, scheduler


def run_scheduler(case):
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build(case["config"], [p])
    out = []
    for _ in range(case["steps"]):
        group = optimizer.param_groups[0]
        betas = group.get("betas", (0.0, 0.0))
        out.append([float(group["lr"]), float(betas[0]), float(betas[1])])
        scheduler.step()
    return out


def run_optimizer(case):
    p = torch.nn.Parameter(torch.tensor(case["init"], dtype=torch.float32))
    optimizer, scheduler = build(case["config"], [p])
    out = []
    for g in case["grads"]:
        p.grad = torch.tensor(g, dtype=torch.float32)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        out.append(p.detach().tolist())
    return out


def device(offload):
    """An offload section's device as a string ("none" when absent)."""
    if not offload:
        return "none"
    return str(getattr(offload.device, "value", offload.device))


def run_config(case):
    import deepspeed.comm as dist
    saved = dist.get_rank, dist.get_world_size
    dist.get_rank = lambda *a, **k: 0
    dist.get_world_size = lambda *a, **k: case["world_size"]
    try:
        c = DeepSpeedConfig(case["path"])
    except Exception as e:  # DeepSpeed's own refusal, whatever its type
        return {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    finally:
        dist.get_rank, dist.get_world_size = saved
    z = c.zero_config
    params = c.optimizer_params or {}
    out = {
        "train_batch_size": c.train_batch_size,
        "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "stage": int(z.stage),
        "fp16": bool(c.float16_config.enabled),
        "bf16": bool(c.bfloat16_config.enabled),
        "gradient_clipping": float(c.gradient_clipping),
        "offload_optimizer": device(z.offload_optimizer),
        "offload_param": device(z.offload_param),
        "reduce_bucket_size": int(z.reduce_bucket_size),
        "optimizer": c.optimizer_name,
        "scheduler": c.scheduler_name,
    }
    for k in ("lr", "eps", "weight_decay"):
        if isinstance(params.get(k), (int, float)):
            out["optimizer_" + k] = float(params[k])
    return out


def main():
    cases = json.load(open(sys.argv[1]))
    results = []
    for case in cases:
        run = {"scheduler": run_scheduler, "optimizer": run_optimizer, "config": run_config}[case["kind"]]
        results.append(run(case))
    json.dump(results, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
