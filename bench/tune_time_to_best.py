"""Wall time to the best accuracy: dtrain::tune against Ray Tune, the same ASHA search.

    python bench/tune_time_to_best.py [--build build] [--epochs 9] [--train-subset 6000] ...

The same search on both sides: learning rate x batch size x hidden width (tune_example's
grid), ASHA with the same max_t / grace_period / reduction_factor / brackets, trials of 2
processes, one trial at a time (2 CPUs), the same data subset, model and optimiser.
  - dtrain: build/examples/tune_example --mode asha (each trial a Distributor job: the dtrain
    launcher and 2 C++ worker processes).
  - Ray Tune (the venv's, scripts/requirements.txt): a function trainable that runs
    bench/tune_peer_trainable.py under torchrun --nproc-per-node 2 and reports each epoch's
    accuracy as rank 0 prints it; ray.init(num_cpus=2) is timed apart and not counted.
Time to target: from the start of the search until its first report of at least the target
accuracy, the lower of the two searches' best accuracies (the two sides' curves differ: libtorch
and PyTorch initialise the same model differently). Also printed: each side's time to its own
best and the whole search. Prints the ratio dtrain / Ray (target <= 0.5) and one JSON line.
Timing never fails.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MACHINE = "2-core Debian 12 VM, shared"
HERE = os.path.dirname(os.path.abspath(__file__))


def run_dtrain(a):
    storage = tempfile.mkdtemp(prefix="dtrain-tune-ttb-")
    cmd = [os.path.join(a.build, "examples", "tune_example"), "--mode", "asha", "--epochs", str(a.epochs),
           "--train-subset", str(a.train_subset), "--val-subset", str(a.val_subset), "--storage", storage,
           "--lrs", a.lrs, "--batch-sizes", a.batch_sizes, "--hiddens", a.hiddens,
           "--grace-period", str(a.grace_period), "--reduction-factor", str(a.reduction_factor),
           "--brackets", str(a.brackets)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    print(out.stdout)
    res = json.loads(out.stdout.strip().splitlines()[-1])["asha"]
    state = json.load(open(os.path.join(storage, "asha", "tuner_state.json")))
    res["reports"] = sorted((r["wall_clock"] - res["start_wall_clock"], r["accuracy"])
                            for t in state["trials"] for r in t["history"])
    return res


def _die_with_parent():
    import ctypes
    import signal
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: torchrun ends with its trial


def run_ray(a):
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = os.path.join(HERE, "tune_peer_trainable.py")

    def trainable(config):
        # Ray kills this trial's actor when ASHA stops it; torchrun (and its workers) go with it.
        cmd = [torchrun, "--standalone", "--nproc-per-node", "2", script, "--lr", str(config["lr"]),
               "--batch-size", str(config["batch_size"]), "--hidden", str(config["hidden"]),
               "--epochs", str(config["epochs"]), "--train-subset", str(config["train_subset"]),
               "--val-subset", str(config["val_subset"])]
        # One thread per worker, as torchrun (and dtrain's launcher) would set without Ray's
        # OMP_NUM_THREADS=<the trial's CPUs>.
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=_die_with_parent)
        try:
            for line in proc.stdout:
                if line.startswith("{"):
                    r = json.loads(line)
                    tune.report({"accuracy": r["accuracy"], "wall_clock": time.time()})
            if proc.wait() != 0:
                raise RuntimeError(f"torchrun exited with {proc.returncode}")
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)

    def grid(values, kind):
        return tune.grid_search([kind(v) for v in values.split(",")])

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    init_s = time.perf_counter() - t0
    space = {"lr": grid(a.lrs, float), "batch_size": grid(a.batch_sizes, int), "hidden": grid(a.hiddens, int),
             "epochs": a.epochs, "train_subset": a.train_subset, "val_subset": a.val_subset}
    sched = ASHAScheduler(time_attr="training_iteration", max_t=a.epochs, grace_period=a.grace_period,
                          reduction_factor=a.reduction_factor, brackets=a.brackets)
    with tempfile.TemporaryDirectory() as storage:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 2}),
            param_space=space,
            tune_config=tune.TuneConfig(metric="accuracy", mode="max", scheduler=sched, max_concurrent_trials=1),
            run_config=tune.RunConfig(storage_path=storage, name="ttb", verbose=0),
        )
        t0_wall = time.time()
        t0 = time.perf_counter()
        results = tuner.fit()
        seconds = time.perf_counter() - t0
        best, epochs, reports = 0.0, 0, []
        for r in results:
            df = r.metrics_dataframe
            if df is None or len(df) == 0:
                continue
            epochs += len(df)
            for acc, wall in zip(df["accuracy"], df["wall_clock"]):
                reports.append((float(wall) - t0_wall, float(acc)))
                best = max(best, acc)
        reports.sort()
        to_best = min(s for s, acc in reports if acc >= best)
    ray.shutdown()
    return {"best_accuracy": best, "epochs": epochs, "seconds": seconds, "seconds_to_best": to_best,
            "ray_init_seconds": init_s, "trials": len(results), "errors": results.num_errors, "reports": reports}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--train-subset", type=int, default=6000)
    p.add_argument("--val-subset", type=int, default=5000)
    p.add_argument("--lrs", default="3e-3,1e-3,3e-4")
    p.add_argument("--batch-sizes", default="64,128,256")
    p.add_argument("--hiddens", default="32,64,256")
    p.add_argument("--grace-period", type=int, default=1)
    p.add_argument("--reduction-factor", type=int, default=4)
    p.add_argument("--brackets", type=int, default=1)
    a = p.parse_args()
    ours = run_dtrain(a)
    theirs = run_ray(a)
    import ray
    print(f"machine: {MACHINE}; ASHA (max_t {a.epochs}, grace {a.grace_period}, rf {a.reduction_factor}, "
          f"brackets {a.brackets}) over lr {a.lrs} x batch {a.batch_sizes} x hidden {a.hiddens}, "
          "2-process trials, one at a time")
    print(f"dtrain::tune : best {ours['best_accuracy']:.4f} after {ours['seconds_to_best']:.1f} s "
          f"(search {ours['seconds']:.1f} s, {ours['epochs']} epochs)")
    print(f"Ray Tune {ray.__version__} + PyTorch: best {theirs['best_accuracy']:.4f} after "
          f"{theirs['seconds_to_best']:.1f} s (search {theirs['seconds']:.1f} s, {theirs['epochs']} epochs; "
          f"+ ray.init {theirs['ray_init_seconds']:.1f} s, not counted)")
    target = min(ours["best_accuracy"], theirs["best_accuracy"])
    ours["seconds_to_target"] = min(s for s, acc in ours["reports"] if acc >= target)
    theirs["seconds_to_target"] = min(s for s, acc in theirs["reports"] if acc >= target)
    ratio = ours["seconds_to_target"] / theirs["seconds_to_target"]
    print(f"time to the target accuracy {target:.4f}: dtrain {ours['seconds_to_target']:.1f} s, "
          f"Ray {theirs['seconds_to_target']:.1f} s; ratio dtrain / Ray {ratio:.2f} (target <= 0.5)")
    print(f"whole search: ratio {ours['seconds'] / theirs['seconds']:.2f}; time to own best: "
          f"ratio {ours['seconds_to_best'] / theirs['seconds_to_best']:.2f}")
    print(json.dumps({"machine": MACHINE, "target_accuracy": target, "dtrain": ours, "ray": theirs,
                      "ratio_time_to_target": ratio}))


if __name__ == "__main__":
    sys.exit(main())
