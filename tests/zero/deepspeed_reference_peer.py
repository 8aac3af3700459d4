"""DeepSpeed's own LR schedulers and optimizers over given steps: the peer of
tests/zero/deepspeed_reference_test.cpp (DeepSpeed 0.19.8 from the venv, on CPU).

Usage: deepspeed_reference_peer.py CASES.json OUT.json

Every case holds a DeepSpeed config. The optimizer is built by DeepSpeed's own engine code
(DeepSpeedEngine._configure_basic_optimizer on the parsed DeepSpeedConfig: FusedAdam for Adam
and AdamW, torch.optim.SGD for SGD, torch.optim.Adagrad for Adagrad; with offload_optimizer its
CPU optimizers, DeepSpeedCPUAdam and DeepSpeedCPUAdagrad), the scheduler as the engine builds it
(lr_schedules.<type>(optimizer, **params)), and each step runs as the engine's
_take_model_step does: optimizer.step(), then scheduler.step().

  {"kind": "scheduler", "config": {...}, "steps": S}
      -> [[lr, beta1, beta2, momentum] the optimizer holds for update k, k = 1..S (0.0 where
          its group has no betas or momentum)]; the scheduler's type is looked up as
          DeepSpeed's engine does: its lr_schedules first, then torch.optim.lr_scheduler
  {"kind": "scheduler_state", "config": {...}, "steps": S}
      -> {"state": the scheduler's state_dict() after S steps (a Counter as a dict), "group":
          the optimizer's param group without its params} or {"error": ...}
  {"kind": "optimizer", "config": {...}, "init": [...], "grads": [[...] per step]}
      -> [[the parameter after update k] k = 1..S]
  {"kind": "loss_scaler", "config": {"fp16": {...}}, "overflows": [true/false per step]}
      -> [the scale after each update, ..., "raise" where DeepSpeed raises (and stops)]
  {"kind": "buffers", "config": {...}}
      -> {"buffers": {name: dtype after deepspeed.initialize}, "parameters": [dtypes],
          "losses": [3 training steps'], "step": "ok" or the error that stopped them}
  {"kind": "scaler_object", "path": optimizer file, "config": {...}}
      -> {"type", "keys", "values" of the loss scaler object in the file; "fresh_*" of the one
          DeepSpeed makes for the config; "update": "ok" or the error of update_scale on it}
  {"kind": "config", "path": FILE or "config": {...}, "world_sizes": [N, ...]}
      -> {"worlds": {"N": DeepSpeedConfig's resolved values (a file read as DeepSpeed reads
                          it: hjson, duplicate keys refused) for a data-parallel world of N
                          ranks, or {"error": message}},
          "engine": what deepspeed.initialize makes of the config (one rank over Gloo in this
                    process, the batch keys replaced by the micro batch and accumulation steps
                    resolved at the first accepted N): {"optimizer": the optimizer's values as
                    built (param_groups[0], decoupled weight decay), "lrs": [the scheduler's lr
                    for the first 6 updates]}, or {"error": message} where the engine refuses
                    it, or {"platform": message} where only this CPU build is the reason (fp16
                    and FusedLamb have no CPU kernels here)}
  {"kind": "hjson", "text": TEXT}
      -> {"json": the config DeepSpeed reads from a file holding TEXT (hjson.load with its
          duplicate-key hook), as json.dumps writes it (ints and floats apart)} or {"error": ...}
  {"kind": "progress", "config": {...}, "steps": S, "bad_steps": [k, ...], "client": {...}}
  {"kind": "module_strict", "config": {...}, "widths": [...], "strict": B, "module_only": B}
      a Linear chain 4-3-2 trains 2 steps and saves; a chain of `widths` loads that checkpoint
      with load_module_strict / load_module_only, then trains 2 steps: whether the load passed
      (or DeepSpeed's error), the losses, the parameters after
      -> {"lines": the progress lines DeepSpeed's logger emits over S training steps of one rank
          ("[Rank 0] step=..., skipped=..., lr=..., mom=...") and its throughput timer's lines
          ("epoch=0/micro_step=M/global_step=G, RunningAvgSamplesPerSec=..."), in order, "step":
          "ok" or the error that stopped them} or {"init": the error of deepspeed.initialize};
          "client" (optional): {"type": a torch.optim class, "lr", "betas", "momentum"} passed
          as deepspeed.initialize's optimizer instead of the config's; with "final": true the
          weights start at fixed values, the inputs follow torch.manual_seed(1), and "final"
          holds the parameters after the steps
One process runs every case: importing DeepSpeed is the slow part.
"""
import functools
import json
import logging
import math
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


def basic_optimizer(ds, params):
    """The optimizer DeepSpeed's engine builds from DeepSpeedConfig `ds` (its CPU optimizer with
    offload_optimizer, as the engine's zero_use_cpu_optimizer decides)."""
    cpu = DeepSpeedEngine.zero_use_cpu_optimizer(types.SimpleNamespace(_config=ds))
    stub = types.SimpleNamespace(
        optimizer_params=lambda: ds.optimizer_params,
        optimizer_name=lambda: ds.optimizer_name,
        zero_use_cpu_optimizer=lambda: cpu,
        bf16_optimizer_states=lambda: False,
        zenflow=False,
        has_moe_layers=False)
    stub.get_optimizer_configuration = functools.partial(DeepSpeedEngine.get_optimizer_configuration, stub)
    return DeepSpeedEngine._configure_basic_optimizer(stub, params)


def scheduler_class(name):
    """The class DeepSpeed's engine builds for the scheduler `name` (_scheduler_from_config):
    its own lr_schedules first (OneCycle, WarmupLR, ...), then torch.optim.lr_scheduler."""
    if hasattr(lr_schedules, name):
        return getattr(lr_schedules, name)
    return getattr(torch.optim.lr_scheduler, name)


def build(config, params):
    """The optimizer and scheduler DeepSpeed's engine makes for `config`."""
    ds = DeepSpeedConfig(dict(config, train_micro_batch_size_per_gpu=1))
    optimizer = basic_optimizer(ds, params)
    scheduler = None
    if ds.scheduler_name is not None:
        scheduler = scheduler_class(ds.scheduler_name)(optimizer, **ds.scheduler_params)
    return optimizer, scheduler


def run_scheduler(case):
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build(case["config"], [p])
    out = []
    for _ in range(case["steps"]):
        group = optimizer.param_groups[0]
        betas = group.get("betas", (0.0, 0.0))
        out.append([float(group["lr"]), float(betas[0]), float(betas[1]),
                    float(group.get("momentum", 0.0))])
        scheduler.step()
    return out


def plain(v):
    """A state_dict value as JSON (a Counter or other dict as a dict with str keys)."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, torch.Tensor):
        return v.tolist()
    return v


def run_scheduler_state(case):
    p = torch.nn.Parameter(torch.zeros(1))
    try:
        optimizer, scheduler = build(case["config"], [p])
        for _ in range(case["steps"]):
            optimizer.step()
            scheduler.step()
    except Exception as e:
        return {"error": error_text(e)}
    group = {k: plain(v) for k, v in optimizer.param_groups[0].items() if k != "params"}
    return {"state": plain(scheduler.state_dict()), "group": group}


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


def run_loss_scaler(case):
    """DeepSpeed's dynamic loss scaler as its ZeRO optimizer makes it (CreateLossScaler from the
    parsed fp16 section), over a sequence of overflow flags: the scale after each update, and
    "raise" where DeepSpeed raises (an overflow at the minimum scale), which ends the sequence.
    At stage 0 the engine's FP16_Optimizer scales instead (its own _update_scale)."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    init_distributed()  # update_scale logs through deepspeed.comm's rank
    fp16 = DeepSpeedConfig(dict(case["config"], train_micro_batch_size_per_gpu=1)).float16_config
    if case["config"]["zero_optimization"]["stage"] == 0:
        return run_fp16_optimizer_scaler(case, fp16)
    scaler = CreateLossScaler(dtype=torch.half, static_loss_scale=fp16.loss_scale,
                              dynamic_scaling=fp16.loss_scale == 0,
                              dynamic_loss_args=fp16.dynamic_loss_scale_args())
    out = []
    for overflow in case["overflows"]:
        try:
            scaler.update_scale(overflow)
        except Exception as e:  # DeepSpeed raises a bare Exception at the minimum
            if "already at minimum" not in str(e):
                raise
            out.append("raise")
            break
        out.append(float(scaler.cur_scale))
    return out


def run_fp16_optimizer_scaler(case, fp16):
    """The loss scale of DeepSpeed's stage-0 FP16_Optimizer (runtime/fp16/fused_optimizer.py):
    its LossScaleConfig as the engine's _configure_fp16_optimizer makes it, updated by its own
    _update_scale after each step (skip = the step's overflow flag)."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    config = LossScaleConfig(low_precision_dtype=torch.float16, dynamic_loss_scale=fp16.loss_scale == 0,
                             static_loss_scale=fp16.loss_scale, dynamic_loss_args=fp16.dynamic_loss_scale_args(),
                             profile=LossScaleProfile.FUSED, initial_dynamic_scale=fp16.initial_dynamic_scale())
    optimizer = types.SimpleNamespace(loss_scale_config=config, verbose=False)
    out = []
    for overflow in case["overflows"]:
        FP16_Optimizer._update_scale(optimizer, overflow)
        out.append(float(config.cur_scale))
    return out


def run_buffers(case):
    """deepspeed.initialize (one rank) on a Linear-BatchNorm-Linear model: every buffer's dtype
    after it, the parameters' dtypes, and the losses of 3 training steps of the config's
    micro-batches each (engine forward, backward, step on a batch of 8 in the parameters' dtype)
    or the error that stops them; with gradient_clipping the global gradient norm of each step
    (the accumulated gradient, as the optimizer sees it)."""
    import deepspeed
    init_distributed()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    with torch.no_grad():  # libtorch's Linear initialises differently: values both sides compute
        for k, p in enumerate(model.parameters()):
            p.copy_((torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + k) * 0.5).view(p.shape))
    micro = case["config"].get("gradient_accumulation_steps", 1)
    config = dict(case["config"], train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=micro)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    torch.manual_seed(0)
    name = lambda dtype: str(dtype).replace("torch.", "")
    out = {"buffers": {n: name(b.dtype) for n, b in engine.module.named_buffers()},
           "parameters": sorted({name(p.dtype) for p in engine.module.parameters()}),
           "losses": [], "norms": [], "applied": []}
    try:
        for k in range(3 * micro):
            x = torch.randn(8, 4).to(next(engine.module.parameters()).dtype)
            if k == case.get("bad_step", -1):
                x[0, 0] = float("inf")
            loss = engine(x).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
            out["applied"].append(engine.was_step_applied())
            out["losses"].append(float(loss) if math.isfinite(float(loss)) else None)
            if (k + 1) % micro == 0:  # get_global_grad_norm() after each optimizer step
                norm = engine.get_global_grad_norm()
                norm = None if norm is None else float(norm)
                out["norms"].append(norm if norm is None or math.isfinite(norm) else str(norm))
        out["step"] = "ok"
    except Exception as e:
        out["step"] = error_text(e)
    if "bad_step" in case:
        out["skipped"] = engine.skipped_steps
        out["lr"] = float(engine.get_lr()[0])
    return out


def chain(widths):
    """Linear layers widths[0] -> widths[1] -> ..., with values both sides compute."""
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])])
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.copy_((torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + k) * 0.5).view(p.shape))
    return model


def run_module_strict(case):
    import shutil
    import tempfile
    import deepspeed
    init_distributed()
    config = dict(case["config"], train_micro_batch_size_per_gpu=8)

    def train(engine, seed):
        torch.manual_seed(seed)
        dtype = next(engine.module.parameters()).dtype
        losses = []
        for _ in range(2):
            loss = engine(torch.randn(8, 4).to(dtype)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        return losses

    first = chain([4, 3, 2])
    saved, *_ = deepspeed.initialize(model=first, model_parameters=first.parameters(), config=config)
    train(saved, 0)
    d = tempfile.mkdtemp()
    out = {}
    try:
        saved.save_checkpoint(d, tag="a")
        model = chain(case["widths"])
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        try:
            engine.load_checkpoint(d, tag="a", load_module_strict=case["strict"],
                                   load_module_only=case["module_only"])
        except Exception as e:
            out["load"] = error_text(e)
            return out
        out["load"] = "ok"
        out["losses"] = train(engine, 1)
        out["params"] = [p.detach().float().flatten().tolist() for p in engine.module.parameters()]
        return out
    finally:
        shutil.rmtree(d)


def run_hjson(case):
    """The config as DeepSpeedConfig reads a file: hjson.load with DeepSpeed's duplicate-key hook."""
    import tempfile
    import hjson
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(case["text"])
    try:
        with open(f.name, "r") as text:
            value = hjson.load(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)
        return {"json": json.dumps(value)}
    except Exception as e:
        return {"error": error_text(e)}
    finally:
        os.unlink(f.name)


def run_progress(case):
    """deepspeed.initialize (one rank) and S training steps: the progress lines its logger emits
    (at the level the config's log_level sets; this peer's default hides them, as DeepSpeed's
    default, warning, does)."""
    import deepspeed
    init_distributed()
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if ("step=" in message and "skipped=" in message) or message.startswith("epoch="):
                lines.append(message)

    keep = Keep(level=logging.DEBUG)
    logger.addHandler(keep)
    out = {}
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        if case.get("final"):
            with torch.no_grad():  # values both sides compute (libtorch's Linear initialises differently)
                for k, p in enumerate(model.parameters()):
                    p.copy_((torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + k) * 0.5).view(p.shape))
        client = None
        if "client" in case:
            spec = dict(case["client"])
            kind = getattr(torch.optim, spec.pop("type"))
            if "betas" in spec:
                spec["betas"] = tuple(spec["betas"])
            client = kind(model.parameters(), **spec)
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=client, config=case["config"])
        except Exception as e:
            return {"init": error_text(e)}
        if case.get("final"):
            torch.manual_seed(1)  # the C++ side's inputs
        try:
            for k in range(case["steps"]):
                x = torch.randn(2, 4)
                if k in case["bad_steps"]:
                    x[0, 0] = float("inf")
                engine.backward(engine(x).pow(2).mean())
                engine.step()
            out["step"] = "ok"
        except Exception as e:
            out["step"] = error_text(e)
        out["lines"] = lines
        if case.get("final"):
            out["final"] = [v for p in engine.module.parameters() for v in p.detach().double().flatten().tolist()]
        return out
    finally:
        logger.removeHandler(keep)
        logger.setLevel(logging.ERROR)  # a case's log_level must not reach the next case
        for handler in logger.handlers:
            handler.setLevel(logging.ERROR)


def run_scaler_object(case):
    """The loss scaler object in a dtrain optimizer file (SaveCheckpointOptions::
    deepspeed_loss_scaler) beside the one DeepSpeed's ZeRO optimizer makes for the same config
    (CreateLossScaler, the parameters' dtype), and whether DeepSpeed's update_scale runs on it."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    init_distributed()  # update_scale logs through deepspeed.comm's rank
    try:
        obj = torch.load(case["path"], weights_only=False)["optimizer_state_dict"]["loss_scaler"]
    except Exception as e:
        return {"error": error_text(e)}
    c = DeepSpeedConfig(dict(case["config"]))
    f = c.float16_config
    fresh = CreateLossScaler(dtype=torch.half if f.enabled else torch.float32, static_loss_scale=f.loss_scale,
                             dynamic_scaling=f.loss_scale == 0, dynamic_loss_args=f.dynamic_loss_scale_args())
    name = lambda o: type(o).__module__ + "." + type(o).__qualname__
    plain = lambda d: {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in d.items()}
    out = {"type": name(obj), "fresh_type": name(fresh), "keys": list(vars(obj)), "fresh_keys": list(vars(fresh)),
           "values": plain(vars(obj)), "fresh_values": plain(vars(fresh))}
    try:
        obj.update_scale(False)
        obj.update_scale(True)
        out["update"] = "ok"
    except Exception as e:
        out["update"] = error_text(e)
    return out


def device(offload):
    """An offload section's device as a string ("none" when absent)."""
    if not offload:
        return "none"
    return str(getattr(offload.device, "value", offload.device))


def error_text(e):
    return "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")


def parse_at(case, world_size):
    """DeepSpeedConfig at a data-parallel world of `world_size` ranks."""
    import deepspeed.comm as dist
    saved = dist.get_rank, dist.get_world_size
    dist.get_rank = lambda *a, **k: 0
    dist.get_world_size = lambda *a, **k: world_size
    try:
        return DeepSpeedConfig(case["path"] if "path" in case else dict(case["config"]))
    finally:
        dist.get_rank, dist.get_world_size = saved


def resolved(c):
    z = c.zero_config
    f = c.float16_config
    out = {
        "train_batch_size": c.train_batch_size,
        "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "stage": int(z.stage),
        "fp16": bool(f.enabled),
        "bf16": bool(c.bfloat16_config.enabled),
        "gradient_clipping": c.gradient_clipping,
        "offload_optimizer": device(z.offload_optimizer),
        "offload_param": device(z.offload_param),
        "offload_optimizer_pin_memory": z.offload_optimizer.pin_memory if z.offload_optimizer else None,
        "offload_param_pin_memory": z.offload_param.pin_memory if z.offload_param else None,
        "reduce_bucket_size": int(z.reduce_bucket_size),
        "throughput_timer": bool(c.timers_config.enabled),
        "loss_scale": float(f.loss_scale),
        "initial_scale_power": int(f.initial_scale_power),
        "loss_scale_window": int(f.loss_scale_window),
        "hysteresis": int(f.hysteresis),
        "consecutive_hysteresis": bool(f.consecutive_hysteresis),
        "min_loss_scale": float(f.min_loss_scale),
        "optimizer": c.optimizer_name,
        "scheduler": c.scheduler_name,
        "communication_data_type": (None if c.communication_data_type is None else
                                    str(c.communication_data_type).replace("torch.", "")),
    }
    return out


_distributed = []


def init_distributed():
    """A Gloo group of one in this process, made once."""
    import socket
    import deepspeed
    if not _distributed:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        deepspeed.init_distributed(dist_backend="gloo")
        _distributed.append(True)


def initialize(config):
    """deepspeed.initialize on one rank (a Gloo group of one in this process)."""
    import deepspeed
    init_distributed()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)


# deepspeed.initialize's refusals that come from this CPU build, not from the config.
PLATFORM = ("is not supported on your device", "not been implemented on CPU backend")


def engine_view(case, c):
    """The optimizer and scheduler DeepSpeed's engine builds, and whether it accepts the config."""
    out = {}
    try:
        p = torch.nn.Parameter(torch.zeros(3))
        if c.optimizer_name is not None:
            optimizer = basic_optimizer(c, [p])
            group = optimizer.param_groups[0]
            values = {k: group[k] for k in ("lr", "eps", "weight_decay", "momentum", "dampening", "nesterov",
                                            "bias_correction", "lr_decay", "initial_accumulator_value")
                      if k in group}
            if "betas" in group:
                values["betas"] = list(group["betas"])
            values["decoupled"] = bool(getattr(optimizer, "adam_w_mode", isinstance(optimizer, torch.optim.AdamW)))
            out["optimizer"] = values
        else:
            optimizer = torch.optim.SGD([p], lr=0.5)  # a client optimizer's lr: 0.5
        if c.scheduler_name is not None:
            engine = types.SimpleNamespace(scheduler_name=lambda: c.scheduler_name,
                                           scheduler_params=lambda: c.scheduler_params)
            scheduler = DeepSpeedEngine._scheduler_from_config(engine, optimizer)
            lrs = []
            for _ in range(6):
                lrs.append(float(optimizer.param_groups[0]["lr"]))
                scheduler.step()
            out["lrs"] = lrs
    except Exception as e:  # building the optimizer: FusedLamb has no CPU kernel here
        text = error_text(e)
        return {("platform" if any(p in text for p in PLATFORM) else "error"): text}
    config = dict(c._param_dict)  # as DeepSpeed read it (hjson)
    for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        config.pop(k, None)
    config["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu
    config["gradient_accumulation_steps"] = c.gradient_accumulation_steps
    try:
        initialize(config)
    except Exception as e:
        text = error_text(e)
        return {("platform" if any(p in text for p in PLATFORM) else "error"): text}
    return out


def run_config(case):
    worlds, accepted = {}, None
    for n in case["world_sizes"]:
        try:
            c = parse_at(case, n)
            worlds[str(n)] = resolved(c)
            accepted = accepted or c
        except Exception as e:  # DeepSpeed's own refusal, whatever its type
            worlds[str(n)] = {"error": error_text(e)}
    out = {"worlds": worlds}
    if accepted is not None:
        out["engine"] = engine_view(case, accepted)
    return out


def main():
    cases = json.load(open(sys.argv[1]))
    results = []
    for case in cases:
        run = {"scheduler": run_scheduler, "scheduler_state": run_scheduler_state,
               "optimizer": run_optimizer, "config": run_config,
               "loss_scaler": run_loss_scaler, "buffers": run_buffers,
               "scaler_object": run_scaler_object, "hjson": run_hjson,
               "progress": run_progress, "module_strict": run_module_strict}[case["kind"]]
        results.append(run(case))
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
    # Without the interpreter's teardown: DeepSpeed's engines and the Gloo group may abort in it
    # ("terminate called without an active exception"), after the results are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
