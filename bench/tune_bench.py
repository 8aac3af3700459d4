"""dtrain::tune vs Ray Tune: scheduling overhead per trial, measured in the same run.

    python bench/tune_bench.py [--build build] [--trials 12] [--concurrent 2]

Both search a grid of `trials` trivial trials (one report, no work), `concurrent` at a time,
one CPU each: dtrain's build/bench/tune_overhead_bench (each trial a Distributor job: the
dtrain launcher and a worker process of the C++ binary) and Ray Tune's Tuner with a function
trainable in a local Ray instance (ray.init(num_cpus=concurrent), timed apart from fit()).
Prints one line per system and the ratio dtrain / Ray (target <= 0.2). Timing never fails.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MACHINE = "2-core Debian 12 VM, shared"


def ray_overhead(trials, concurrent):
    import ray
    from ray import tune

    t0 = time.perf_counter()
    ray.init(num_cpus=concurrent, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    init_s = time.perf_counter() - t0

    def trivial(config):
        tune.report({"score": float(config["i"])})

    with tempfile.TemporaryDirectory() as storage:
        tuner = tune.Tuner(
            tune.with_resources(trivial, {"cpu": 1}),
            param_space={"i": tune.grid_search(list(range(trials)))},
            tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=concurrent),
            run_config=tune.RunConfig(storage_path=storage, name="bench", verbose=0),
        )
        t0 = time.perf_counter()
        grid = tuner.fit()
        fit_s = time.perf_counter() - t0
    ray.shutdown()
    return {"trials": trials, "errors": grid.num_errors, "ray_init_seconds": init_s, "seconds": fit_s,
            "seconds_per_trial": fit_s / trials}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--concurrent", type=int, default=2)
    a = p.parse_args()
    exe = os.path.join(a.build, "bench", "tune_overhead_bench")
    out = subprocess.run([exe, str(a.trials), str(a.concurrent), "1"], check=True, capture_output=True, text=True)
    ours = json.loads(out.stdout.strip().splitlines()[-1])
    theirs = ray_overhead(a.trials, a.concurrent)
    import ray
    print(f"machine: {MACHINE}; {a.trials} trivial trials, {a.concurrent} at a time, 1 CPU each")
    print(f"dtrain::tune : {ours['seconds']:.2f} s, {ours['seconds_per_trial']:.3f} s/trial "
          f"(a bare Distributor job: {ours['bare_distributor_seconds_per_run']:.3f} s)")
    print(f"Ray Tune {ray.__version__}: {theirs['seconds']:.2f} s, {theirs['seconds_per_trial']:.3f} s/trial "
          f"(+ ray.init {theirs['ray_init_seconds']:.1f} s, not counted)")
    ratio = ours["seconds_per_trial"] / theirs["seconds_per_trial"]
    print(f"ratio dtrain / Ray per trial: {ratio:.2f} (target <= 0.2)")
    print(json.dumps({"machine": MACHINE, "dtrain": ours, "ray": theirs, "ratio": ratio}))


if __name__ == "__main__":
    sys.exit(main())
