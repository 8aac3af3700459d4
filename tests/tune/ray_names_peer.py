"""Ray Tune's trial ids, trial directory names and checkpoint directories, for
tests/tune/tuner_test.cpp (TrialIdsDirectoriesAndCheckpointsAreNamedAsRays) to compare with
dtrain's on the same search.

Usage: ray_names_peer.py CASES.json OUT.json

One Tuner.fit() on a local Ray instance of 1 CPU (trials run one at a time) with the search
space below (grid and random values, nested keys, a float, strings with characters Ray cleans,
a constant "env", which Ray puts into the trial's name, and a string long enough that Ray
truncates the name) and num_samples=2: 4 trials. The trainable (named tree_trainable, as the
test names dtrain's) reports 2 results, each with a checkpoint directory holding one file
"state". A trial_name_creator names the trials of width 32 "w32/<trial id>" and returns "" for
the others (Ray's own name then); checkpoint_at_end=False is set (what Ray takes for a function
trainable). Writes {"tree": every path under the experiment directory (relative, a directory
with a trailing "/"), sorted; "trials": [{"trial_id", "dir": the trial directory's name,
"config", "name": str(trial) when it started, "metrics_keys": Result.metrics' keys in order,
"experiment_tag": Result.metrics["experiment_tag"]}] in the order of the trials' ids;
"format_vars": Ray's format_vars of each of CASES.json's "format_vars" cases, a list of
[path, value] (the resolved variables); "refused": for CheckpointConfig(checkpoint_frequency=2)
and CheckpointConfig(checkpoint_at_end=True) on the same function trainable, the type of what
Tuner.fit raised ("" if nothing)}.
"""
import json
import os
import shutil
import sys
import tempfile

import ray
from ray import tune
from ray.tune.search.variant_generator import format_vars

LONG = "long-" + "0123456789" * 15


def space():
    return {
        "env": "ALE/Pong:v5",
        "model": {"width": tune.grid_search([16, 32]), "act": "relu"},
        "lr": tune.grid_search([0.12345]),
        "opt": {"name": tune.grid_search(["sgd/momentum 0.9"])},
        "seed": tune.randint(100000, 1000000),  # 6 digits: the cut falls at one place
        "dropout": tune.uniform(0.1, 0.2),
        "kind": tune.choice(["mlp"]),
        "text": tune.grid_search([LONG]),
    }


def tree_trainable(config):
    for it in range(2):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "state"), "w") as f:
            f.write(str(it + 1))
        tune.report({"score": config["model"]["width"] * (it + 1)},
                    checkpoint=tune.Checkpoint.from_directory(d))
        shutil.rmtree(d)  # Ray copied it into the trial's directory


def name_creator(trial):
    # str(trial) here is still Ray's own name; "" falls back to it.
    return f"w32/{trial.trial_id}" if trial.config["model"]["width"] == 32 else ""


class Names(tune.Callback):
    def __init__(self):
        self.names = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.names[trial.trial_id] = str(trial)


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = {"format_vars": [format_vars({("config",) + tuple(path): value for path, value in case})
                           for case in cases["format_vars"]]}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as d:
        names = Names()
        grid = tune.Tuner(
            tree_trainable,
            param_space=space(),
            tune_config=tune.TuneConfig(num_samples=2, trial_name_creator=name_creator),
            run_config=tune.RunConfig(
                storage_path=d, name="names", verbose=0, callbacks=[names],
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False)),
        ).fit()
        root = os.path.join(d, "names")
        tree = []
        for where, dirs, files in os.walk(root):
            rel = os.path.relpath(where, root)
            for name in dirs:
                tree.append(os.path.normpath(os.path.join(rel, name)) + "/")
            for name in files:
                tree.append(os.path.normpath(os.path.join(rel, name)))
        out["tree"] = sorted(tree)
        trials = []
        for result in grid:
            trials.append({"trial_id": result.metrics["trial_id"],
                           "dir": os.path.basename(result.path.rstrip("/")),
                           "config": result.config,
                           "name": names.names[result.metrics["trial_id"]],
                           "metrics_keys": list(result.metrics.keys()),
                           "experiment_tag": result.metrics["experiment_tag"]})
        out["trials"] = sorted(trials, key=lambda t: t["trial_id"])
        out["refused"] = {}
        for key, value in (("checkpoint_frequency", 2), ("checkpoint_at_end", True)):
            try:
                tune.Tuner(tree_trainable, param_space={"model": {"width": 16}},
                           run_config=tune.RunConfig(
                               storage_path=d, name="refused_" + key, verbose=0,
                               checkpoint_config=tune.CheckpointConfig(**{key: value}))).fit()
                out["refused"][key] = ""
            except Exception as e:  # noqa: BLE001 - the type is what is compared
                out["refused"][key] = type(e).__name__
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
