"""Ray Tune's Tuner.restore after a SIGKILLed driver, and the order it names a trial and adds it
to the scheduler, for tests/tune/restore_test.cpp to compare with dtrain's
(tests/tune/restore_program.cpp runs the same searches).

Usage: ray_restore_peer.py OUT.json

1. The killed search: x in grid [0, 1, 2, 3], FIFO, 1 CPU per trial. The driver starts with
   ray.init(num_cpus=2), so trials 0 and 1 run at once; a trial reports score = 10 x + it for
   it = 1..4, a checkpoint with it = 1 only. While held (phase "hold"), trial 1 reports its first
   result only after trial 0 has reported twice, and both wait after their second result; the
   experiment state is saved at every step (TUNE_GLOBAL_CHECKPOINT_S=0). Once it holds both
   trials' second results, the driver's process group is SIGKILLed and a new driver with
   ray.init(num_cpus=1) restores the search (Tuner.restore). The stopper is
   CombinedStopper(Counting, MaximumIterationStopper(4), TimeoutStopper(300)); Counting counts
   every call and logs it. Logged after the restore: "start X FROM" when a trial starts (FROM:
   its checkpoint's iteration, 0 without one) and "stopper X IT N" at every call (N: the calls
   it has counted, the ones before the kill included when Ray kept it).
2. The naming search (in the restoring driver, the same Ray instance): x in grid [1, 2], PBT
   with hyperparam_mutations {"lr": [0.1, 0.2]} (not in the space: PBT's on_trial_add fills it
   in), a trial_name_creator and a trial_dirname_creator that say whether they saw "lr".

Writes {"starts": [[X, FROM]], "calls": [[X, IT, N]] (after the restore, in order),
"grid": [[X, STATUS, ITERATIONS, DONE]] (the restored ResultGrid's order), "budget":
{"killed": the TimeoutStopper's budget in the state at the kill, "end": at the end},
"names": [[INDEX, NAME, DIRNAME, LR]] (the naming search, LR: what the trial got)}.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HOLD_S = 60  # bounded: a driver the test fails to kill still ends


def log(line):
    with open(os.environ["RESTORE_LOG"], "a") as f:
        f.write(line + "\n")


def trainable(config):
    from ray import tune
    from ray.tune import Checkpoint

    x = config["x"]
    hold = os.environ.get("RESTORE_PHASE") == "hold"
    marker = os.environ["RESTORE_LOG"] + ".zero-reported-twice"
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with open(os.path.join(checkpoint.path, "it")) as f:
            start = int(f.read())
    log(f"start {x} {start}")
    for it in range(start + 1, 5):
        if hold and x == 1 and it == 1:
            deadline = time.time() + HOLD_S
            while not os.path.exists(marker) and time.time() < deadline:
                time.sleep(0.05)
        if it == 1:
            d = tempfile.mkdtemp()
            with open(os.path.join(d, "it"), "w") as f:
                f.write("1")
            tune.report({"score": 10 * x + it}, checkpoint=Checkpoint.from_directory(d))
        else:
            tune.report({"score": 10 * x + it})
        if hold and it == 2:
            if x == 0:
                open(marker, "w").close()
            time.sleep(HOLD_S)


def lr_trainable(config):
    from ray import tune

    tune.report({"score": config["x"], "lr": config["lr"]})


def index(trial_id):
    return int(trial_id.rsplit("_", 1)[-1])


def saw_lr(trial):
    return "%d_lr=%s" % (index(trial.trial_id), "yes" if "lr" in trial.config else "no")


def stopper_budget(state_dir):
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    # The restored run writes a file of its own beside the killed one's, named by its start
    # time: the newest is the greatest name, as Ray's _find_newest_experiment_checkpoint picks
    # (not the latest mtime: the restored run's final sync rewrites the killed one's file too).
    path = max(glob.glob(os.path.join(state_dir, "experiment_state-*.json")))
    with open(path) as f:
        state = _loads_with_cloudpickle(f.read())
    return state["runner_data"]["_stopper"]._stoppers[2]._budget


def driver(phase, storage):
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.stopper import (
        CombinedStopper,
        MaximumIterationStopper,
        Stopper,
        TimeoutStopper,
    )

    class Counting(Stopper):
        def __init__(self):
            self.n = 0

        def __call__(self, trial_id, result):
            self.n += 1
            log(f"stopper {index(trial_id)} {result['training_iteration']} {self.n}")
            return False

        def stop_all(self):
            return False

    env = {k: os.environ[k] for k in ("RESTORE_LOG",)}
    env["RESTORE_PHASE"] = phase
    os.environ["RESTORE_PHASE"] = phase
    ray.init(num_cpus=2 if phase == "hold" else 1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})
    if phase == "hold":
        tune.Tuner(
            trainable,
            param_space={"x": tune.grid_search([0, 1, 2, 3])},
            tune_config=tune.TuneConfig(metric="score", mode="max"),
            run_config=tune.RunConfig(
                storage_path=storage, name="killed", verbose=0,
                stop=CombinedStopper(Counting(), MaximumIterationStopper(4),
                                     TimeoutStopper(300))),
        ).fit()
        return
    grid = tune.Tuner.restore(os.path.join(storage, "killed"), trainable).fit()
    out = {"grid": [[r.config["x"], t.status, r.metrics["training_iteration"], r.metrics["done"]]
                    for r, t in zip(grid, grid._experiment_analysis.trials)]}
    named = tune.Tuner(
        lr_trainable,
        param_space={"x": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(
            metric="score", mode="max",
            scheduler=PopulationBasedTraining(perturbation_interval=1,
                                              hyperparam_mutations={"lr": [0.1, 0.2]}),
            trial_name_creator=lambda t: "n" + saw_lr(t),
            trial_dirname_creator=lambda t: "d" + saw_lr(t)),
        run_config=tune.RunConfig(storage_path=storage, name="named", verbose=0),
    ).fit()
    out["names"] = sorted(
        [index(t.trial_id), str(t), os.path.basename(t.local_path), t.last_result["lr"]]
        for t in named._experiment_analysis.trials)
    ray.shutdown()
    with open(os.path.join(storage, "resume.json"), "w") as f:
        json.dump(out, f)


def state_iterations(state_dir):
    out = {}
    for path in glob.glob(os.path.join(state_dir, "experiment_state-*.json"))[:1]:
        try:
            with open(path) as f:
                state = json.load(f)
        except ValueError:
            return {}  # being written
        for trial_json, run_metadata in state["trial_data"]:
            last = json.loads(run_metadata).get("last_result") or {}
            out[index(json.loads(trial_json)["trial_id"])] = last.get("training_iteration")
    return out


def main():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, RESTORE_LOG=os.path.join(d, "log"), TUNE_GLOBAL_CHECKPOINT_S="0")
        with open(os.path.join(d, "hold.out"), "w") as out:
            held = subprocess.Popen([sys.executable, __file__, "--driver", "hold", d], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        try:
            while True:
                its = state_iterations(os.path.join(d, "killed"))
                if its.get(0) == 2 and its.get(1) == 2:
                    break
                if held.poll() is not None or time.time() > deadline:
                    sys.exit("the held search did not save both trials' second results; its "
                             "output:\n" + open(os.path.join(d, "hold.out")).read()[-3000:])
                time.sleep(0.1)
        finally:
            # The driver and the Ray processes it started (its session's process group).
            os.killpg(held.pid, signal.SIGKILL)
            held.wait()
        budget_killed = stopper_budget(os.path.join(d, "killed"))
        with open(env["RESTORE_LOG"], "a") as f:
            f.write("restore\n")
        with open(os.path.join(d, "resume.out"), "w") as out:
            r = subprocess.run([sys.executable, __file__, "--driver", "resume", d], env=env,
                               stdout=out, stderr=subprocess.STDOUT, timeout=300)
        if r.returncode != 0:
            sys.exit("the restoring driver failed:\n" +
                     open(os.path.join(d, "resume.out")).read()[-3000:])
        with open(os.path.join(d, "resume.json")) as f:
            result = json.load(f)
        with open(env["RESTORE_LOG"]) as f:
            lines = f.read().split("restore\n", 1)[1].split("\n")
        result["starts"] = [[int(w) for w in l.split()[1:]] for l in lines if l.startswith("start")]
        result["calls"] = [[int(w) for w in l.split()[1:]] for l in lines
                           if l.startswith("stopper")]
        result["budget"] = {"killed": budget_killed,
                            "end": stopper_budget(os.path.join(d, "killed"))}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if sys.argv[1] == "--driver":
        driver(sys.argv[2], sys.argv[3])
    else:
        main()
