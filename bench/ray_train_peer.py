"""The Ray Train side of bench/ray_bench.sh: one driver connected to the Ray cluster (as a
notebook is, after ray.init), then the cases named on the command line, in order, each a
TorchTrainer(fn, scaling_config=ScalingConfig(num_workers=N), torch_config=TorchConfig(backend=
"gloo")).fit() timed from the call to its return. Prints one JSON line per case ("RTCASE {...}").

  ray_train_peer.py --address GCS [--workers 4] [--storage DIR] CASE...

Cases: trivial (a function: all-reduce of rank + 1 in the group Ray Train made, report rank 0's
(rank, sum, host)), epoch (bench/pytorch_fashion_mnist.py's train(), 1 epoch: the peer of the
example), exit7 (rank 3 exits with code 7 before the all-reduce, the others wait in it), kill9
(rank 2 SIGKILLs itself there), raise (rank 1 raises ValueError). Ray Train places one worker
per bundle of {"CPU": 1} (PACK, its default) and retries nothing (FailureConfig(max_failures=0)).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def trivial(config):
    import socket

    import torch
    import torch.distributed as dist
    import ray.train

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    ray.train.report({"rank": dist.get_rank(), "sum": t.item(), "host": socket.gethostname()})


def failing(config):
    import signal

    import torch
    import torch.distributed as dist
    import ray.train

    rank = dist.get_rank()
    mode = config["mode"]
    if mode == "exit7" and rank == 3:
        print("rank 3 exits with code 7 on purpose", file=sys.stderr, flush=True)
        os._exit(7)
    if mode == "kill9" and rank == 2:
        print("rank 2 SIGKILLs itself on purpose", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise" and rank == 1:
        raise ValueError("failing on purpose on rank 1")
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    ray.train.report({"sum": t.item()})


def epoch(config):
    import ray.train
    import pytorch_fashion_mnist as peer

    r = peer.train(peer.parse(["--epochs", "1"]))
    if r is not None:  # rank 0: its line reaches the driver through Ray's log forwarding
        print(json.dumps(r), flush=True)
    ray.train.report(r or {})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--storage", default="/tmp/ray_train_peer")
    p.add_argument("cases", nargs="+")
    a = p.parse_args()

    t0 = time.perf_counter()
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    sys.path.insert(0, HERE)
    import pytorch_fashion_mnist

    # The workers have no bench/ on their path: ship the module by value.
    ray.cloudpickle.register_pickle_by_value(pytorch_fashion_mnist)
    ray.init(address=a.address, logging_level="ERROR")
    print("RTCASE " + json.dumps({"case": "session", "seconds": time.perf_counter() - t0}), flush=True)
    fns = {"trivial": trivial, "epoch": epoch, "exit7": failing, "kill9": failing, "raise": failing}
    for n, case in enumerate(a.cases):
        if case not in fns:
            raise SystemExit("unknown case " + case)
        rec = {"case": case}
        t = time.perf_counter()
        try:
            trainer = TorchTrainer(
                fns[case], train_loop_config={"mode": case},
                scaling_config=ScalingConfig(num_workers=a.workers, use_gpu=False),
                torch_config=TorchConfig(backend="gloo"),
                run_config=RunConfig(name="peer-%d-%s" % (n, case), storage_path=a.storage,
                                     failure_config=FailureConfig(max_failures=0)))
            result = trainer.fit()
            rec["ok"] = result.error is None
            rec["result"] = result.metrics
            if result.error is not None:
                rec["error_type"] = type(result.error).__name__
                rec["error"] = str(result.error)
        except Exception as e:  # what Ray Train raises, as the user sees it
            rec["ok"] = False
            rec["error_type"] = type(e).__name__
            rec["error"] = str(e)
        rec["seconds"] = time.perf_counter() - t
        print("RTCASE " + json.dumps(rec, default=str), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
