"""Ray Tune's own ResultGrid.get_best_result over recorded results: the peer of dtrain's
ResultGrid::best_result (tests/tune/best_result_parity_test.cpp).

Usage: ray_best_result_peer.py CASES.json OUT.json

For each case, every trial is a real ray.tune.experiment.Trial (stub: no trainable, no Ray
cluster) fed its results in order through Trial.update_last_result, as Ray's TuneController does
with every result it takes; so its metric_analysis is Ray's own. Then for every scope (and a
bad one) and mode, ResultGrid.get_best_result (the real method, over an ExperimentAnalysis
holding those trials; only _trial_to_result is replaced to give the trial's id) picks the best
trial: its id, or "ERROR" where Ray raises; "unfiltered" is its choice with
filter_nan_and_inf=False. Each trial's score is
metric_analysis[metric][scope] ([mode] for "all"), null where it has none. The cases file and
the answer are JSON as Python's json module writes it (NaN, Infinity).
"""
import copy
import json
import logging
import sys

from ray.tune import ResultGrid
from ray.tune.analysis import ExperimentAnalysis
from ray.tune.experiment import Trial

SCOPES = ["last", "all", "avg", "last-5-avg", "last-10-avg", "last-3-avg"]


def run_case(case):
    trials = []
    for t in case["trials"]:
        trial = Trial("__fake", config={}, stub=True, trial_id=t["id"])
        for result in t["reports"]:
            trial.update_last_result(copy.deepcopy(result))
        trials.append(trial)
    analysis = ExperimentAnalysis.__new__(ExperimentAnalysis)
    analysis.trials = trials
    analysis.default_metric = case["metric"]
    analysis.default_mode = "max"
    grid = ResultGrid.__new__(ResultGrid)
    grid._experiment_analysis = analysis
    grid._trial_to_result = lambda trial: trial.trial_id
    out = {}
    for scope in SCOPES:
        for mode in ("min", "max"):
            try:
                best = grid.get_best_result(case["metric"], mode, scope)
            except Exception:  # ValueError (scope), RuntimeError (no best trial)
                best = "ERROR"
            try:
                unfiltered = grid.get_best_result(case["metric"], mode, scope,
                                                  filter_nan_and_inf=False)
            except Exception:
                unfiltered = "ERROR"
            scores = []
            for trial in trials:
                stats = trial.metric_analysis.get(case["metric"])
                key = mode if scope == "all" else scope
                scores.append(None if stats is None or key not in stats else stats[key])
            out[scope + "/" + mode] = {"best": best, "unfiltered": unfiltered, "scores": scores}
    return out


def main():
    logging.getLogger("ray").setLevel(logging.ERROR)  # "Could not find best trial" warnings
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    answers = {case["name"]: run_case(case) for case in cases}
    with open(sys.argv[2], "w") as f:
        json.dump(answers, f)


if __name__ == "__main__":
    main()
