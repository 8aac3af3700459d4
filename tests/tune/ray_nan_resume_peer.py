"""Ray Tune's Tuner on the search tests/tune/nan_resume_program.cpp gives dtrain's.

Usage: ray_nan_resume_peer.py OUT.json

A local Ray instance of 1 CPU, so the trials (1 CPU each) run one at a time in their order, as
dtrain's with num_cpus = 1. x in grid [1, 2, 3], ASHA(max_t=4, grace_period=1,
reduction_factor=2) on "score" (max); a trial reports its curve:
  x = 1: 10, NaN, 1, 1      x = 2: 10, 1, 1, inf      x = 3: NaN, 5, 5, 5
Writes what the dtrain program prints: {"trials": [[index, status, iterations, [scores]]],
"best_last": x, "best_all": x} (get_best_result with scope "last" and "all"), a non-finite
score as "nan" / "inf" / "-inf"; and "state_tokens": how Ray's own experiment state file
(experiment_state-*.json) spells the non-finite values it holds, with "state_last_scores": the
trials' last_result["score"] as json.load reads that file back (what Tuner.restore starts from).
"""
import glob
import json
import math
import os
import re
import sys
import tempfile

import ray
from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler

CURVES = {
    1: [10.0, math.nan, 1.0, 1.0],
    2: [10.0, 1.0, 1.0, math.inf],
    3: [math.nan, 5.0, 5.0, 5.0],
}


def trainable(config):
    for score in CURVES[config["x"]]:
        tune.report({"score": score})


def number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def index(trial_id):
    return int(trial_id.rsplit("_", 1)[-1])


def main():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        grid = tune.Tuner(
            trainable,
            param_space={"x": tune.grid_search([1, 2, 3])},
            tune_config=tune.TuneConfig(
                metric="score",
                mode="max",
                scheduler=AsyncHyperBandScheduler(max_t=4, grace_period=1, reduction_factor=2),
            ),
            run_config=tune.RunConfig(storage_path=d, name="nan", verbose=0),
        ).fit()
        trials = []
        for t in grid._experiment_analysis.trials:
            history = grid[index(t.trial_id)].metrics_dataframe
            scores = [number(float(s)) for s in history["score"]]
            trials.append([index(t.trial_id), t.status, t.last_result["training_iteration"], scores])
        out["trials"] = sorted(trials)
        out["best_last"] = grid.get_best_result(scope="last").config["x"]
        out["best_all"] = grid.get_best_result(scope="all").config["x"]
        (state_path,) = glob.glob(os.path.join(d, "nan", "experiment_state-*.json"))
        with open(state_path) as f:
            text = f.read()
        out["state_tokens"] = sorted(set(re.findall(r"-?Infinity|NaN", text)))
        state = json.loads(text)
        last = {}
        for trial_json, run_metadata in state["trial_data"]:
            trial_id = json.loads(trial_json)["trial_id"]
            last[index(trial_id)] = number(json.loads(run_metadata)["last_result"]["score"])
        out["state_last_scores"] = [last[i] for i in sorted(last)]
    ray.shutdown()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
