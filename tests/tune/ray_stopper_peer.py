"""Ray Tune's own stoppers over recorded result streams: the peer of dtrain::tune's stoppers.

Usage: ray_stopper_peer.py CASES.json OUT.json

Builds ray.tune.stopper's classes (the real ones, from the pip-installed Ray) as each case
describes them and feeds them the case's results in order, exactly as tests/tune/
stopper_parity_test.cpp feeds dtrain's: for every event `stopper(trial_id, result)`, then
`stopper.stop_all()`; each answer is recorded, "ERROR" where the call raised. A case may
instead only build a stopper ("construct": whether the constructor raises).

Functions for FunctionStopper are named in the case (the same rules on both sides); each call
also records the trial id and the result the function got, so both sides must pass the same.
"""
import json
import sys

from ray.tune.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    TimeoutStopper,
    TrialPlateauStopper,
)

SEEN = []


def make_function(spec):
    name = spec["fn"]

    def score_at_least(trial_id, result):
        SEEN.append([trial_id, result])
        return result.get("score", float("-inf")) >= spec["bound"]

    def every_kth_of_odd_trials(trial_id, result):
        SEEN.append([trial_id, result])
        odd = int(trial_id[1:]) % 2 == 1
        return odd and result["training_iteration"] % spec["k"] == 0

    return {"score_at_least": score_at_least, "every_kth_of_odd_trials": every_kth_of_odd_trials}[
        name
    ]


def make_stopper(spec):
    kind = spec["kind"]
    o = spec.get("options", {})
    if kind == "max_iter":
        return MaximumIterationStopper(max_iter=o["max_iter"])
    if kind == "trial_plateau":
        kw = {"metric": o["metric"]}
        for k in ("num_results", "grace_period"):
            if k in o:
                kw[k] = o[k]
        for k in ("std", "metric_threshold"):
            if k in o:
                kw[k] = float(o[k])
        if "mode" in o:
            kw["mode"] = o["mode"]
        return TrialPlateauStopper(**kw)
    if kind == "experiment_plateau":
        kw = {"metric": o["metric"]}
        for k in ("top", "patience", "mode"):
            if k in o:
                kw[k] = o[k]
        if "std" in o:
            kw["std"] = float(o["std"])
        return ExperimentPlateauStopper(**kw)
    if kind == "timeout":
        return TimeoutStopper(float(o["seconds"]))
    if kind == "function":
        return FunctionStopper(make_function(o))
    if kind == "combined":
        return CombinedStopper(*[make_stopper(s) for s in spec["stoppers"]])
    raise ValueError(f"unknown stopper kind {kind}")


def run_case(case):
    if "construct" in case:
        try:
            make_stopper(case["construct"])
            return {"raises": False}
        except ValueError:
            return {"raises": True}
    SEEN.clear()
    stopper = make_stopper(case["stopper"])
    decisions = []
    for ev in case["events"]:
        rec = {}
        try:
            rec["stop"] = bool(stopper(ev["trial"], dict(ev["result"])))
        except Exception:  # noqa: BLE001 - what dtrain reports as a UsageError
            rec["stop"] = "ERROR"
        rec["stop_all"] = bool(stopper.stop_all())
        decisions.append(rec)
    return {"decisions": decisions, "seen": SEEN[:]}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = {c["name"]: run_case(c) for c in cases}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
