"""Ray Tune's GPUs per trial, for tests/tune/gpus_test.cpp to compare with dtrain's on the same
searches.

Usage: ray_gpus_peer.py CASES.json OUT.json

CASES.json: {"cases": [{"name", "cpus": the node's (ray.init(num_cpus)), "gpus": its
(ray.init(num_gpus)), "driver_devices": CUDA_VISIBLE_DEVICES when Ray starts (null: unset),
"override_on_zero": RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO's value when Ray starts (null or absent:
unset), "resources": tune.with_resources' dict, "trials": how many, "want": trials expected at
once},
...], "sync": a directory}. Cases with the same node run in one local Ray instance, started
anew for the next node. Each case is one Tuner.fit() of `trials` trials of gpu_trainable
(a grid over "i"); every trial writes SYNC/NAME/seen-I-0.json: {"cvd": its
CUDA_VISIBLE_DEVICES (null: unset), "ray_ids": ray.get_gpu_ids(), "start", "end"}: wall
clock, the end taken after it left the live trials. A trial waits (30 s at most) until `want`
trials are live at once or every trial has started, so the most at once is what the
resources allow whatever the start-up times. OUT.json: {NAME: [the seen files, by I]}.
"""
import json
import os
import sys
import tempfile
import time

import ray
from ray import tune


def gpu_trainable(config):
    start = time.time()
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [str(i) for i in ray.get_gpu_ids()]
    d, i = config["dir"], config["i"]
    open(os.path.join(d, "started-%d" % i), "w").close()
    live = os.path.join(d, "live-%d" % i)
    open(live, "w").close()
    deadline = time.time() + 30
    while time.time() < deadline:
        names = os.listdir(d)
        if (sum(n.startswith("live-") for n in names) >= config["want"]
                or sum(n.startswith("started-") for n in names) == config["trials"]):
            break
        time.sleep(0.02)
    time.sleep(0.2)
    os.remove(live)
    seen = {"cvd": cvd, "ray_ids": sorted(ids), "start": start, "end": time.time()}
    with open(os.path.join(d, "seen-%d-0.json" % i), "w") as f:
        json.dump(seen, f)
    tune.report({"done_i": i})


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = {}
    node = None
    for case in spec["cases"]:
        override = case.get("override_on_zero")
        this = (case["cpus"], case["gpus"], case["driver_devices"], override)
        if this != node:
            if node is not None:
                ray.shutdown()
            if case["driver_devices"] is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = case["driver_devices"]
            # Ray's workers read it from the environment they inherit (its raylet's).
            if override is not None:
                os.environ["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = override
            else:
                os.environ.pop("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", None)
            ray.init(num_cpus=case["cpus"], num_gpus=case["gpus"], include_dashboard=False,
                     log_to_driver=False)
            node = this
        d = os.path.join(spec["sync"], case["name"])
        os.makedirs(d)
        with tempfile.TemporaryDirectory() as storage:
            tune.Tuner(
                tune.with_resources(gpu_trainable, case["resources"]),
                param_space={"i": tune.grid_search(list(range(case["trials"]))), "dir": d,
                             "want": case["want"], "trials": case["trials"]},
                run_config=tune.RunConfig(storage_path=storage, name=case["name"], verbose=0),
            ).fit()
        seen = []
        for i in range(case["trials"]):
            with open(os.path.join(d, "seen-%d-0.json" % i)) as f:
                seen.append(json.load(f))
        out[case["name"]] = seen
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
