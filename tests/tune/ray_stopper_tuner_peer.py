"""Ray Tune's Tuner with stoppers, on the trainable tests/tune/tuner_test.cpp gives dtrain's.

Usage: ray_stopper_tuner_peer.py OUT.json

A local Ray instance of 1 CPU, so the trials (1 CPU each) run one at a time in their order, as
dtrain's with num_cpus = 1; every trial is created (PENDING) up front in both.
Two searches, the trainable reporting {"score": x} 2 times when x < 0.3, else 6 times:
  ends_trials: x in [0.5, 0.95, 0.2], stop=CombinedStopper(FunctionStopper(score >= 0.9),
               MaximumIterationStopper(3)); the function records every call it gets.
  stop_all:    x in [1.0, 2.0, 3.0], stop=ExperimentPlateauStopper("score", top=2, mode="max").
Writes, per search, each trial as [index, status, training_iteration, done] of its last
result (null, null without one), and the function's calls as [index, training_iteration,
done, score]; a trial's index is the number its id ends with.
"""
import json
import sys
import tempfile

import ray
from ray import tune
from ray.tune.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
)


def trainable(config):
    x = config["x"]
    for _ in range(2 if x < 0.3 else 6):
        tune.report({"score": x})


def index(trial_id):
    return int(trial_id.rsplit("_", 1)[-1])


def trials_of(grid):
    out = []
    for t in grid._experiment_analysis.trials:
        last = t.last_result or {}
        out.append(
            [index(t.trial_id), t.status, last.get("training_iteration"), last.get("done")]
        )
    return sorted(out)


def main():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    calls = []

    def score_at_least_09(trial_id, result):
        calls.append(
            [index(trial_id), result["training_iteration"], result["done"], result["score"]]
        )
        return result["score"] >= 0.9

    out = {}
    with tempfile.TemporaryDirectory() as d:

        def fit(name, xs, stop):
            return tune.Tuner(
                trainable,
                param_space={"x": tune.grid_search(xs)},
                tune_config=tune.TuneConfig(metric="score", mode="max"),
                run_config=tune.RunConfig(storage_path=d, name=name, verbose=0, stop=stop),
            ).fit()

        grid = fit(
            "ends_trials",
            [0.5, 0.95, 0.2],
            CombinedStopper(FunctionStopper(score_at_least_09), MaximumIterationStopper(3)),
        )
        out["ends_trials"] = {"trials": trials_of(grid), "calls": calls}
        grid = fit(
            "stop_all",
            [1.0, 2.0, 3.0],
            ExperimentPlateauStopper(metric="score", top=2, mode="max"),
        )
        out["stop_all"] = {"trials": trials_of(grid)}
    ray.shutdown()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
