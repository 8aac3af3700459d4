"""The peer of the Ray engine's worker environment: Ray Train's TorchTrainer (Ray 2.60) with
ScalingConfig(num_workers=N, placement_strategy=STRATEGY); each worker writes the variables it
got as one line to OUT_DIR/rank_<RANK>, the same line tests/ray/ray_test.sh's program prints
under dtrain. Exit 0 once fit() returns, 1 with its error.

  torchtrainer_env.py GCS_ADDRESS OUT_DIR [WORKERS] [STRATEGY]
"""

import os
import socket
import sys

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


def line():
    """`env RANK=.. WORLD_SIZE=.. LOCAL_RANK=.. LOCAL_WORLD_SIZE=.. NODE_RANK=.. host=..`."""
    return "env " + " ".join("%s=%s" % (k, os.environ.get(k, "")) for k in KEYS) + " host=" + socket.gethostname()


def worker(config):
    with open(os.path.join(config["out"], "rank_" + os.environ["RANK"]), "w") as f:
        f.write(line() + "\n")


def main(address, out, workers=2, strategy="PACK"):
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        TorchTrainer(worker, train_loop_config={"out": out},
                     scaling_config=ScalingConfig(num_workers=workers, placement_strategy=strategy),
                     torch_config=TorchConfig(backend="gloo"),
                     run_config=RunConfig(storage_path=os.path.join(out, "storage"), name="env")).fit()
    except Exception as e:
        print("fit failed: %r" % e, file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(a[0], a[1], int(a[2]) if len(a) > 2 else 2, a[3] if len(a) > 3 else "PACK"))
