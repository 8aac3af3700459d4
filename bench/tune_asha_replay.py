"""Ray Tune's own ASHA over the learning curves a dtrain::tune grid search recorded.

    python bench/tune_asha_replay.py STORAGE/grid/tuner_state.json [--max-t 9] [--grace-period 1]
                                     [--reduction-factor 3] [--brackets 1] [--dtrain STORAGE/asha/tuner_state.json]

Every config of tune_example's grid is seeded the same, so a trial ASHA lets run trains
exactly as its grid twin: the grid's curves are what an ASHA search would see. This feeds
them, trial after trial in the grid's order (one trial at a time, as tune_example runs), to
ray.tune's AsyncHyperBandScheduler (the pip-installed Ray, no cluster: a stand-in
controller), and prints the epochs it spends and the best accuracy it reaches. With
--dtrain, it also reads dtrain's real ASHA search and checks both stopped the same trials at
the same epochs. With --orders N, it also replays N random orders of the same trials (seed 0):
async ASHA's budget depends on the order trials arrive in (a rung with few results yet stops
little), and this says how much. Prints one JSON line last.
"""
import argparse
import json
import logging
import random
import sys
import types

from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler


class FakeTrial:
    def __init__(self, trial_id, config):
        self.trial_id = trial_id
        self.config = config
        self.evaluated_params = {}
        self.experiment_tag = trial_id
        self.status = Trial.PENDING
        self.last_result = {}
        self.temporary_state = types.SimpleNamespace(saving_to=None)

    def is_finished(self):
        return self.status in (Trial.TERMINATED, Trial.ERROR)


class FakeController:
    search_alg = None

    def __init__(self, trials):
        self.trials = trials

    def get_trials(self):
        return list(self.trials)

    def get_live_trials(self):
        return [t for t in self.trials if not t.is_finished()]


def replay(trials, max_t, grace_period, reduction_factor, brackets):
    sched = AsyncHyperBandScheduler(time_attr="training_iteration", metric="accuracy", mode="max", max_t=max_t,
                                    grace_period=grace_period, reduction_factor=reduction_factor, brackets=brackets)
    fakes = [FakeTrial(t["id"], t["config"]) for t in trials]
    ctl = FakeController(fakes)
    for f in fakes:
        sched.on_trial_add(ctl, f)
    epochs = {}
    for f, t in zip(fakes, trials):
        f.status = Trial.RUNNING
        n = 0
        last = {}
        for r in t["history"]:
            last = {"accuracy": r["accuracy"], "training_iteration": r["training_iteration"]}
            n += 1
            if sched.on_trial_result(ctl, f, last) == TrialScheduler.STOP:
                break
        sched.on_trial_complete(ctl, f, last)
        f.status = Trial.TERMINATED
        epochs[t["id"]] = n
    best = max(r["accuracy"] for t in trials for r in t["history"][: epochs[t["id"]]])
    return epochs, best


def main():
    logging.getLogger("ray").setLevel(logging.WARNING)
    p = argparse.ArgumentParser()
    p.add_argument("grid_state")
    p.add_argument("--max-t", type=float, default=9)
    p.add_argument("--grace-period", type=float, default=1)
    p.add_argument("--reduction-factor", type=float, default=3)
    p.add_argument("--brackets", type=int, default=1)
    p.add_argument("--dtrain", help="dtrain's ASHA search (tuner_state.json) to compare with")
    p.add_argument("--orders", type=int, default=0, help="also replay this many random trial orders")
    a = p.parse_args()
    trials = json.load(open(a.grid_state))["trials"]
    grid_epochs = sum(len(t["history"]) for t in trials)
    grid_best = max(r["accuracy"] for t in trials for r in t["history"])
    epochs, best = replay(trials, a.max_t, a.grace_period, a.reduction_factor, a.brackets)
    used = sum(epochs.values())
    print(f"grid: {len(trials)} trials, {grid_epochs} epochs, best accuracy {grid_best:.4f}")
    print(f"Ray's AsyncHyperBandScheduler over the same curves: {used} epochs ({used / grid_epochs:.3f} of the grid), "
          f"best accuracy {best:.4f} (gap {grid_best - best:.4f})")
    out = {"grid_epochs": grid_epochs, "grid_best": grid_best, "ray_epochs": used, "ray_best": best,
           "ray_fraction": used / grid_epochs, "ray_epochs_per_trial": epochs}
    if a.orders:
        rng = random.Random(0)
        fractions, gaps = [], []
        for _ in range(a.orders):
            order = list(trials)
            rng.shuffle(order)
            e, b = replay(order, a.max_t, a.grace_period, a.reduction_factor, a.brackets)
            fractions.append(sum(e.values()) / grid_epochs)
            gaps.append(grid_best - b)
        meet = sum(1 for f, g in zip(fractions, gaps) if f <= 1 / 3 and g <= 0.005) / a.orders
        fractions.sort()
        q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]  # noqa: E731
        print(f"{a.orders} random trial orders: epoch fraction median {q(fractions, 0.5):.3f}, "
              f"10th-90th percentile {q(fractions, 0.1):.3f}-{q(fractions, 0.9):.3f}; accuracy gap max {max(gaps):.4f}; "
              f"{meet:.0%} of the orders meet both targets (<= 1/3 of the epochs, gap <= 0.005)")
        out["random_orders"] = {"n": a.orders, "fraction_median": q(fractions, 0.5), "fraction_p10": q(fractions, 0.1),
                                "fraction_p90": q(fractions, 0.9), "gap_max": max(gaps), "share_meeting_targets": meet}
    if a.dtrain:
        ours = {t["id"]: len(t["history"]) for t in json.load(open(a.dtrain))["trials"]}
        same = ours == epochs
        print(f"dtrain's ASHA search: {sum(ours.values())} epochs; the same trials stopped at the same epochs as "
              f"Ray's: {same}")
        out["dtrain_epochs_per_trial"] = ours
        out["same_decisions"] = same
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
