"""Ray Tune's own schedulers over recorded sequences of results: the peer of dtrain::tune.

Usage: ray_scheduler_peer.py CASES.json OUT.json

Runs ray.tune's AsyncHyperBandScheduler / PopulationBasedTraining / FIFOScheduler classes
(the real ones, from the pip-installed Ray) without a Ray cluster: a small stand-in for the
TuneController feeds each case's events to the scheduler, exactly as tests/tune/
scheduler_parity_test.cpp feeds them to dtrain's schedulers, and records every decision.

Random choices: Ray draws from Python's `random` (PBT) and numpy's global generator (ASHA's
bracket, Domain.sample). Both are replaced by one list of recorded uniform draws in [0, 1),
mapped as dtrain maps them (dtrain/tune_schedulers.h): random() = u,
random.choice(seq) = seq[floor(u * len)], numpy choice(n, p) = searchsorted(cdf, u, 'right'),
uniform(lo, hi) = lo + (hi - lo) * u, randint(lo, hi) = lo + floor((hi - lo) * u),
normal(mean, sd) = mean + sd * sqrt(-2 log(1 - u1)) * cos(2 pi u2) (two draws).

The simulated controller (identical on both sides):
  - every trial is added (on_trial_add) PENDING; it becomes RUNNING at its first event;
  - a result: on_trial_result; STOP -> TERMINATED and on_trial_complete(result);
    PAUSE -> PAUSED; a trial PAUSED (by the decision or by PBT's exploit) runs again at its
    next event;
  - a "complete" event: on_trial_complete(result), TERMINATED;
  - events of a finished trial are skipped (recorded as "SKIPPED");
  - saving a checkpoint returns the token "ckpt:<trial id>:<training_iteration>";
  - a trial's experiment tag starts as its id and is recorded after every event.
"""
import itertools
import json
import logging
import math
import os
import sys
import types

import numpy as np

import ray.tune.schedulers.pbt as pbt_module
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, PopulationBasedTraining


class Draws:
    def __init__(self, draws):
        self.draws = list(draws)
        self.used = 0

    def u(self):
        if self.used >= len(self.draws):
            raise RuntimeError("ran out of recorded draws")
        v = self.draws[self.used]
        self.used += 1
        return v

    def index(self, n):
        return min(int(math.floor(self.u() * n)), n - 1)


DRAWS = Draws([])


class RecordedPythonRandom:
    """Stands in for the `random` module inside ray.tune.schedulers.pbt."""

    def random(self):
        return DRAWS.u()

    def choice(self, seq):
        seq = list(seq)
        return seq[DRAWS.index(len(seq))]


def np_choice(a, size=None, replace=True, p=None):
    n = a if isinstance(a, int) else len(a)
    if p is not None:
        cdf = np.cumsum(p)
        cdf = cdf / cdf[-1]
        idx = int(np.searchsorted(cdf, DRAWS.u(), side="right"))
        idx = min(idx, n - 1)
    else:
        idx = DRAWS.index(n)
    value = idx if isinstance(a, int) else a[idx]
    return value if size is None else np.array([value] * size)


def np_uniform(low=0.0, high=1.0, size=None):
    v = low + (high - low) * DRAWS.u()
    return v if size is None else np.array([v] * size)


def np_normal(loc=0.0, scale=1.0, size=None):
    u1, u2 = DRAWS.u(), DRAWS.u()  # Box-Muller, as dtrain maps two draws to a normal one
    v = loc + scale * math.sqrt(-2.0 * math.log1p(-u1)) * math.cos(2.0 * math.pi * u2)
    return v if size is None else np.array([v] * size)


def np_randint(low, high=None, size=None):
    if high is None:
        low, high = 0, low
    v = low + DRAWS.index(high - low)
    return v if size is None else np.array([v] * size)


logging.getLogger("ray").setLevel(logging.WARNING)  # PBT logs every exploit at INFO
pbt_module.random = RecordedPythonRandom()
np.random.choice = np_choice
np.random.uniform = np_uniform
np.random.randint = np_randint
np.random.normal = np_normal


# The functions of dtrain's sample_from cases (tests/tune/scheduler_parity_test.cpp), by the
# name the C++ side gives them; attribute access, as Ray's docs write them, so a value not
# resolved yet raises RecursiveDependencyError and Ray asks again in its next pass.
SAMPLE_FROM = {
    "b_from_a_and_n_k": lambda c: c.a * 10 + c.n.k,
    "x_twice_y": lambda c: c.y * 2,
    "y_a_plus_r": lambda c: c.a + c.r,
    "lr_over_a": lambda c: c.lr / c.a,
    "p_after_q": lambda c: c.q + 1,
    "q_after_p": lambda c: c.p + 1,
    # Zero-argument functions (Ray's Function with pass_config False).
    "w_from_t_and_r": lambda c: c.t * 100 + c.r,
    "ticket": (lambda calls: lambda: next(calls))(itertools.count()),
    "seven": lambda: 7,
    "no_config_fails": lambda: int("text"),
}


def to_ray_space(value):
    """dtrain's JSON domains -> Ray's search space objects (nested objects and lists kept)."""
    if isinstance(value, dict):
        kind = value.get("__domain__")
        if kind == "sample_from":
            return tune.sample_from(SAMPLE_FROM[value["function"]])
        if kind == "uniform":
            return tune.uniform(value["lower"], value["upper"])
        if kind == "loguniform":
            return tune.loguniform(value["lower"], value["upper"])
        if kind == "quniform":
            return tune.quniform(value["lower"], value["upper"], value["q"])
        if kind == "randint":
            return tune.randint(value["lower"], value["upper"])
        if kind == "choice":
            return tune.choice(value["categories"])
        if kind == "qloguniform":
            return tune.qloguniform(value["lower"], value["upper"], value["q"])
        if kind == "qrandint":
            return tune.qrandint(value["lower"], value["upper"], value["q"])
        if kind == "lograndint":
            return tune.lograndint(value["lower"], value["upper"])
        if kind == "qlograndint":
            return tune.qlograndint(value["lower"], value["upper"], value["q"])
        if kind == "randn":
            return tune.randn(value["mean"], value["sd"])
        if kind == "qrandn":
            return tune.qrandn(value["mean"], value["sd"], value["q"])
        return {k: to_ray_space(v) for k, v in value.items()}
    return value


class FakeTrial:
    def __init__(self, trial_id, config):
        self.trial_id = trial_id
        self.config = config
        self.evaluated_params = {}
        self.experiment_tag = trial_id
        self.status = Trial.PENDING
        self.checkpoint = None
        self.last_result = {}
        self.temporary_state = types.SimpleNamespace(saving_to=None)
        self.run_metadata = types.SimpleNamespace(
            checkpoint_manager=types.SimpleNamespace(
                checkpoint_config=types.SimpleNamespace(num_to_keep=None),
                _latest_checkpoint_result=None,
            )
        )

    def is_finished(self):
        return self.status in (Trial.TERMINATED, Trial.ERROR)

    def set_experiment_tag(self, tag):
        self.experiment_tag = tag

    def set_config(self, config):
        self.config = config

    def __repr__(self):
        return self.trial_id


class FakeController:
    search_alg = None

    def __init__(self, trials):
        self.trials = trials

    def get_trials(self):
        return list(self.trials)

    def get_live_trials(self):
        return [t for t in self.trials if not t.is_finished()]

    def _schedule_trial_save(self, trial, result=None):
        it = (result or trial.last_result).get("training_iteration")
        return f"ckpt:{trial.trial_id}:{it}"

    def pause_trial(self, trial, should_checkpoint=True):
        trial.status = Trial.PAUSED


def make_scheduler(case):
    o = dict(case.get("options", {}))
    kind = case["scheduler"]
    if kind == "asha":
        return AsyncHyperBandScheduler(**o)
    if kind == "pbt":
        o["hyperparam_mutations"] = to_ray_space(o["hyperparam_mutations"])
        if "perturbation_factors" in o:
            o["perturbation_factors"] = tuple(o["perturbation_factors"])
        return PopulationBasedTraining(log_config=False, **o)
    if kind == "fifo":
        s = FIFOScheduler()
        return s
    raise ValueError(kind)


def run_variants(case):
    """Ray's variant generation (BasicVariantGenerator: num_samples passes over the grid)."""
    from ray.tune.search.variant_generator import generate_variants

    space = to_ray_space(case["variants"])
    configs = []
    try:
        for _ in range(case["num_samples"]):
            for _, spec in generate_variants(space):
                configs.append(spec)
    except Exception as e:  # RecursiveDependencyError, ValueError: the case says it must raise
        if not case.get("raises_error"):
            raise
        return {"raised": True, "error": f"{type(e).__name__}: {e}"}
    return {"configs": configs, "draws_used": DRAWS.used}


class LoggedTrial:
    """What Ray's JsonLoggerCallback / CSVLoggerCallback use of a Trial: its directory."""

    def __init__(self, path, config):
        self.local_path = path
        self.config = config
        self.checkpoint = None  # nothing to restore from remote storage
        os.makedirs(path, exist_ok=True)

    def init_local_path(self):
        os.makedirs(self.local_path, exist_ok=True)


def run_trial_files(case):
    """One trial through Ray's own Trainable (the function API's session, auto-filled metrics,
    checkpoint persistence) and Ray's own loggers, with the TuneController's steps around them
    done here: trial_id set, the stopping criteria checked (Trial.should_stop), done=True on the
    result the trial stops at and on its last result. No Ray cluster: Ray's session directory is
    pointed at the case's directory."""
    import tempfile

    import ray.train._internal.storage as storage_module
    from ray.train._internal.storage import StorageContext
    from ray.tune import Checkpoint
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.trainable import wrap_function
    from ray.tune.utils import flatten_dict

    spec = case["trial_files"]
    root = spec["dir"]
    cwd = os.getcwd()
    storage_module._get_ray_train_session_dir = lambda: os.path.join(root, "session")

    failed = []

    def train_fn(config):
        start = 0
        ckpt = tune.get_checkpoint()
        if ckpt:
            with ckpt.as_directory() as d:
                start = int(open(os.path.join(d, "state")).read())
        for it in range(start + 1, config["reports"] + 1):
            if it == config.get("fail_at") and not failed:
                failed.append(it)
                raise RuntimeError("injected failure")
            metrics = {"score": config["x"] * it}
            if it == config["checkpoint_at"]:
                with tempfile.TemporaryDirectory() as d:
                    open(os.path.join(d, "state"), "w").write(str(it))
                    tune.report(metrics, checkpoint=Checkpoint.from_directory(d))
            else:
                tune.report(metrics)

    config = spec["config"]
    storage = StorageContext(storage_path=os.path.join(root, "storage"),
                             experiment_dir_name="exp", trial_dir_name="trial")
    cls = wrap_function(train_fn)
    trainable = cls(config=json.loads(json.dumps(config)), storage=storage)
    trial = LoggedTrial(os.path.join(root, "trial"), config)
    trial.stopping_criterion = spec["stop"]
    loggers = [JsonLoggerCallback(), CSVLoggerCallback()]
    for cb in loggers:
        cb.log_trial_start(trial)
    results = []
    last = None
    saved = None  # the latest checkpoint, as the controller keeps it (Trainable.save)
    while True:
        try:
            result = trainable.train()
        except Exception:
            # A failure with retries left: the trial starts again on a new Trainable restored
            # from its latest checkpoint (Trainable.restore), and its loggers start again.
            for cb in loggers:
                cb.log_trial_end(trial, failed=True)
            try:
                trainable.stop()
            except (Exception, SystemExit):
                pass
            trainable = cls(config=json.loads(json.dumps(config)), storage=storage)
            trainable.restore(saved)
            for cb in loggers:
                cb.log_trial_start(trial)
            continue
        if result.get("should_checkpoint"):
            saved = trainable.save()
        result.update(trial_id=spec["trial_id"])
        if "__duplicate__" in result:
            last.update(done=True)
            break
        if Trial.should_stop(trial, flatten_dict(result)):
            result.update(done=True)
        for cb in loggers:
            cb.log_trial_result(len(results) + 1, trial, result)
        results.append(result)
        last = result
        if result["done"]:
            break
    for cb in loggers:
        cb.log_trial_end(trial)
    try:
        trainable.stop()
    except SystemExit:
        pass  # a trial stopped before its function returned: its thread ends with sys.exit(0)
    os.chdir(cwd)  # Ray's session moved into the trial's working directory
    files = {}
    for name in ("params.json", "result.json", "progress.csv"):
        with open(os.path.join(trial.local_path, name), newline="") as f:
            files[name] = f.read()
    return {"results": results, "last_result": last, "files": files}


def sampled(case):
    """Ray's own sampling of every domain (numpy's real generator, not the recorded draws)
    next to dtrain's values for it: types, ranges, quantization and the values seen."""
    rng = np.random.default_rng(case["seed"])
    out = []
    for item in case["samples"]:
        domain = to_ray_space(item["domain"])
        ray_values = domain.sample(size=len(item["values"]), random_state=rng)
        out.append({"name": item["name"], "ray": summary(ray_values, item["domain"]),
                    "dtrain": summary(item["values"], item["domain"])})
    return {"samples": out}


def raises(case):
    """Whether Ray raises for each call (building the domain, or sampling it: Ray checks some
    bounds only when it samples)."""
    out = []
    for call in case["raises"]:
        try:
            domain = getattr(tune, call["fn"])(*call["args"])
            domain.sample(size=16, random_state=np.random.default_rng(0))
            out.append({"call": call, "raises": False})
        except Exception as e:  # ValueError, AssertionError, ZeroDivisionError: Ray's ways
            out.append({"call": call, "raises": True, "error": f"{type(e).__name__}: {e}"})
    return {"raises": out}


def summary(values, domain):
    values = [v.item() if hasattr(v, "item") else v for v in values]
    types = sorted({type(v).__name__ for v in values})
    q = domain.get("q")
    s = {"types": types, "min": min(values), "max": max(values),
         "mean": float(np.mean(values)), "sd": float(np.std(values))}
    distinct = sorted(set(values))
    s["distinct"] = distinct if len(distinct) <= 64 else len(distinct)
    if q is not None:
        # Every value a multiple of q (to the last bits of a float product).
        s["on_grid"] = all(math.isclose(v / q, round(v / q), abs_tol=1e-9) for v in values)
    return s


def run_case(case):
    global DRAWS
    DRAWS = Draws(case.get("draws", []))
    if "trial_files" in case:
        return run_trial_files(case)
    if "samples" in case:
        return sampled(case)
    if "raises" in case:
        return raises(case)
    if "variants" in case:
        return run_variants(case)
    sched = make_scheduler(case)
    trials = [FakeTrial(t["id"], json.loads(json.dumps(t["config"]))) for t in case["trials"]]
    by_id = {t.trial_id: t for t in trials}
    ctl = FakeController(trials)
    for t in trials:
        sched.on_trial_add(ctl, t)
    out = []
    for ev in case["events"]:
        t = by_id[ev["trial"]]
        if t.is_finished():
            out.append({"trial": t.trial_id, "decision": "SKIPPED"})
            continue
        t.status = Trial.RUNNING
        rec = {"trial": t.trial_id}
        if "complete" in ev:
            t.last_result = ev["complete"]
            sched.on_trial_complete(ctl, t, ev["complete"])
            t.status = Trial.TERMINATED
            rec["decision"] = "COMPLETE"
        else:
            result = ev["result"]
            t.last_result = result
            before = t.run_metadata.checkpoint_manager._latest_checkpoint_result
            decision = sched.on_trial_result(ctl, t, result)
            rec["decision"] = decision
            if decision == "STOP":
                t.status = Trial.TERMINATED
                sched.on_trial_complete(ctl, t, result)
            elif decision == "PAUSE":
                t.status = Trial.PAUSED
            after = t.run_metadata.checkpoint_manager._latest_checkpoint_result
            if after is not before and after is not None:
                rec["restored"] = after.checkpoint
        rec["status"] = t.status
        rec["config"] = t.config
        rec["tag"] = t.experiment_tag  # PBT's exploit: "<tag>@perturbed[...]"
        out.append(rec)
    return {"events": out, "draws_used": DRAWS.used}


def main():
    cases = json.load(open(sys.argv[1]))
    results = [run_case(c) for c in cases]
    json.dump(results, open(sys.argv[2], "w"), indent=1,
              default=lambda o: o.item() if hasattr(o, "item") else str(o))


if __name__ == "__main__":
    main()
