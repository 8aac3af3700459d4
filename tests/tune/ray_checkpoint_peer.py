"""Ray Tune's CheckpointConfig on the cases tests/tune/tuner_test.cpp runs through dtrain's.

Usage: ray_checkpoint_peer.py CASES.json OUT.json

CASES.json: {"cases": [{"name", "config", "trials"}, ...], "queries": [[metric, mode], ...]}.
Each case is one Tuner.fit() on a local Ray instance of 1 CPU: one trial per list in
"trials", whose function reports each value of its list in turn with a checkpoint: {"score":
v, "acc": {"top1": v}}, v a number, "nan", or null (then the result is {"other": 1}: no score).
RunConfig(checkpoint_config=CheckpointConfig(**case["config"])). Writes the cases and, per
trial: the checkpoint directories left in the trial's directory, Result.best_checkpoints as
[directory, training_iteration], Result.checkpoint's directory, and get_best_checkpoint(metric,
mode)'s directory (or "error") for each of "queries".
"""
import json
import os
import shutil
import sys
import tempfile

import ray
from ray import tune


def value(v):
    return float("nan") if v == "nan" else v


def trainable(config):
    for i, v in enumerate(config["values"]):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "it"), "w") as f:
            f.write(str(i + 1))
        metrics = {"other": 1} if v is None else {"score": value(v), "acc": {"top1": value(v)}}
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        shutil.rmtree(d)  # Ray copied it into the trial's directory


def name_of(checkpoint):
    return os.path.basename(checkpoint.path.rstrip("/"))


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    out = {"results": {}}
    with tempfile.TemporaryDirectory() as d:
        for case in spec["cases"]:
            grid = tune.Tuner(
                trainable,
                param_space={"values": tune.grid_search(case["trials"])},
                tune_config=tune.TuneConfig(),
                run_config=tune.RunConfig(storage_path=d, name=case["name"], verbose=0,
                                          checkpoint_config=tune.CheckpointConfig(**case["config"])),
            ).fit()
            trials = []
            for result in sorted(grid, key=lambda r: r.metrics["trial_id"]):
                left = sorted(e for e in os.listdir(result.path) if e.startswith("checkpoint_"))
                best = [[name_of(c), m["training_iteration"]] for c, m in result.best_checkpoints]
                answers = []
                for metric, mode in spec["queries"]:
                    try:
                        answers.append(name_of(result.get_best_checkpoint(metric, mode)))
                    except Exception:  # noqa: BLE001 - that it raised is what is compared
                        answers.append("error")
                trials.append({"left": left, "best": best, "latest": name_of(result.checkpoint),
                               "answers": answers})
            out["results"][case["name"]] = trials
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
