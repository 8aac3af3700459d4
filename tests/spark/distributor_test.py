"""dtrain.spark.Distributor against PySpark's TorchDistributor, both run here, in one process:
the same bad inputs raise the same exception types (and ours says PySpark's words, then the
remedy); function mode returns rank 0's value in local mode (TorchDistributor runs the same
function with torchrun on CPUs) and on the cluster (TorchDistributor's run there too: the
environment its script sees, NODE_RANK, CUDA_VISIBLE_DEVICES, MASTER_ADDR, against ours); a
failing script or function raises RuntimeError as TorchDistributor's _execute_command means to
(its command, return code, last lines: TorchDistributor itself returns None for a failing
script, and raises RuntimeError for a failing function); a program's last line, printed right
before it exits, is on the driver's console in 5 of 5 cluster runs. Started by distributor_test.sh (a Spark standalone cluster on loopback).

    distributor_test.py SPARK_MASTER_URL DTRAIN WORK_DIR
"""

import io
import os
import re
import sys
import time

MASTER, DTRAIN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
T0 = time.monotonic()


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    os._exit(1)


def ok(msg):
    print("ok: %s (%.0f s)" % (msg, time.monotonic() - T0), flush=True)


def raised(make):
    try:
        make()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return e
    return None


from dtrain.spark import Distributor  # noqa: E402
from pyspark.ml.torch.distributor import TorchDistributor  # noqa: E402


def same_error(what, ours, theirs, words=True):
    """Both raised, of one type (PySpark's may subclass it: PySparkRuntimeError), and ours
    opens with PySpark's message (its first sentence) when `words`."""
    if ours is None or theirs is None:
        fail("%s: dtrain raised %r, TorchDistributor %r; expected both to raise" % (what, ours, theirs))
    base = next(c for c in type(theirs).__mro__ if c.__module__ == "builtins")
    if type(ours) is not base:
        fail("%s: dtrain raised %s, TorchDistributor %s (a %s)" % (what, type(ours).__name__, type(theirs).__name__,
                                                                  base.__name__))
    if words:
        theirs_text = str(theirs).split(". ")[0].rstrip(".")
        if not str(ours).startswith(theirs_text):
            fail("%s: dtrain says %r, TorchDistributor %r" % (what, str(ours), str(theirs)))
    ok("%s: %s from both (dtrain: %s)" % (what, base.__name__, ours))


# 1. Validation. No SparkSession yet: TorchDistributor needs one always; dtrain's local mode
#    needs one for GPUs only (use_gpu defaults to True, as TorchDistributor's).
same_error("no SparkSession, default use_gpu=True", raised(lambda: Distributor(2, dtrain=DTRAIN)),
           raised(lambda: TorchDistributor(2)), words=False)
if raised(lambda: Distributor(2, use_gpu=False, dtrain=DTRAIN)) is not None:
    fail("local mode on CPUs without a SparkSession raised")

from pyspark.sql import SparkSession  # noqa: E402

spark = (SparkSession.builder.master(MASTER).appName("dtrain-distributor-test")
         .config("spark.task.maxFailures", "1").config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
ok("SparkSession on %s" % MASTER)

cases = [
    ("num_processes=0", dict(num_processes=0, use_gpu=False), True),
    ("num_processes=-2, local_mode=False", dict(num_processes=-2, local_mode=False, use_gpu=False), True),
    ("num_processes='2'", dict(num_processes="2", use_gpu=False), False),
    ("local_mode=False, GPUs without spark.task.resource.gpu.amount", dict(num_processes=2, local_mode=False), True),
    ("local_mode=True, GPUs the driver does not have", dict(num_processes=2, local_mode=True), True),
    ("every default (local, use_gpu=True)", dict(num_processes=1), True),
]
for what, kw, words in cases:
    same_error(what, raised(lambda: Distributor(dtrain=DTRAIN, **kw)), raised(lambda: TorchDistributor(**kw)), words)
remedy = str(raised(lambda: Distributor(2, local_mode=False, dtrain=DTRAIN)))
if "use_gpu=False" not in remedy:
    fail("the GPU error names no remedy: %s" % remedy)

# A script run's keyword arguments: ValueError from both (checked when run).
same_error("run(path, key=value)", raised(lambda: Distributor(1, use_gpu=False, dtrain=DTRAIN).run("/bin/true", x=1)),
           raised(lambda: TorchDistributor(1, use_gpu=False).run("/x.py", x=1)), words=True)


# 2. Function mode: rank 0's return value.
def train(base, scale=1):
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK",
                                          "CUDA_VISIBLE_DEVICES", "MASTER_ADDR")}
    return {"value": base + scale * t.item(), "env": env}


ours = Distributor(2, local_mode=True, use_gpu=False, dtrain=DTRAIN).run(train, 10, scale=2)
theirs = TorchDistributor(2, local_mode=True, use_gpu=False).run(train, 10, scale=2)
if ours["value"] != 16.0 or ours["env"]["RANK"] != "0" or ours["env"]["WORLD_SIZE"] != "2":
    fail("local function mode: %r, expected rank 0's value 16.0 of 2 ranks" % ours)
if theirs["value"] != ours["value"]:
    fail("local function mode: dtrain %r, TorchDistributor %r" % (ours, theirs))
# TorchDistributor's every process writes the result; the last one wins (rank %s here).
ok("local function mode: rank 0's %r from dtrain, %r (rank %s's) from TorchDistributor"
   % (ours["value"], theirs["value"], theirs["env"]["RANK"]))

ours = Distributor(2, local_mode=False, use_gpu=False, dtrain=DTRAIN).run(train, 1, scale=3)
if ours["value"] != 10.0 or ours["env"]["RANK"] != "0":
    fail("cluster function mode: %r, expected rank 0's value 10.0" % ours)
theirs = TorchDistributor(2, local_mode=False, use_gpu=False).run(train, 1, scale=3)
if theirs["value"] != ours["value"]:
    fail("cluster function mode: dtrain %r, TorchDistributor %r" % (ours, theirs))
if ours["env"] != theirs["env"]:
    fail("cluster function mode: rank 0's environment: dtrain %r, TorchDistributor %r" % (ours["env"], theirs["env"]))
ok("cluster function mode: rank 0's %r from both, rank 0's environment the same: %r" % (ours["value"], ours["env"]))

# 3. A failing script: RuntimeError naming the command, its return code and its last lines, in
#    the words of TorchDistributor's _execute_command. TorchDistributor itself (pyspark 4.0.1)
#    returns None here: its torch_run_process_wrapper exits 0 whatever torchrun's status, so
#    only a function's failure reaches its caller (no result file: RuntimeError). dtrain raises
#    for both; the test records what TorchDistributor did beside it.
script = os.path.join(WORK, "fails.py")
with open(script, "w") as f:
    f.write("import os, sys\nsys.stdout.write('about to fail on rank %s\\n' % os.environ['RANK'])\n"
            "sys.stdout.flush()\nsys.exit(5)\n")
ours = raised(lambda: Distributor(2, use_gpu=False, dtrain=DTRAIN).run(script, "--flag"))
text = str(ours)
if type(ours) is not RuntimeError or \
        not re.search(r"^Command \[.*%s, '--flag'\] failed with return code 5\." % re.escape(repr(script)), text) or \
        "about to fail on rank" not in text:
    fail("a failing script, local mode: %r, expected RuntimeError naming the command, return code 5 "
         "and the script's output" % ours)
theirs = raised(lambda: TorchDistributor(2, use_gpu=False).run(script, "--flag"))
peer = "returned None (its torchrun wrapper exits 0)" if theirs is None else "raised %r" % theirs
if theirs is not None and (type(theirs) is not RuntimeError or "failed with return code" not in str(theirs)):
    fail("a failing script: TorchDistributor raised %r, not _execute_command's RuntimeError" % theirs)
ok("a failing script in local mode: dtrain raises RuntimeError 'Command [...] failed with return code 5' "
   "with its output; TorchDistributor %s" % peer)


def fails(code):
    import sys

    print("the function fails", flush=True)
    sys.exit(code)


same_error("a failing function, local mode", raised(lambda: Distributor(2, use_gpu=False, dtrain=DTRAIN).run(fails, 3)),
           raised(lambda: TorchDistributor(2, use_gpu=False).run(fails, 3)), words=False)
ours = raised(lambda: Distributor(2, local_mode=False, use_gpu=False, dtrain=DTRAIN).run(script))
if type(ours) is not RuntimeError or "failed with return code 5." not in str(ours) or \
        "about to fail on rank" not in str(ours):
    fail("a failing script on the cluster: %r" % ours)
if Distributor(2, local_mode=False, use_gpu=False, dtrain=DTRAIN).run("/bin/true") is not None:
    fail("a script's run() returned something, not None")
ok("a failing script on the cluster: RuntimeError with return code 5 and its output; a good one returns None")
ours = raised(lambda: Distributor(2, local_mode=False, use_gpu=False, dtrain=DTRAIN).run(fails, 4))
if type(ours) is not RuntimeError or "failed with return code 4." not in str(ours):
    fail("a failing function on the cluster: %r" % ours)
ok("a failing function on the cluster: RuntimeError with return code 4")

# 4. A program's last line, printed right before it exits, reaches the driver's console:
#    5 of 5 cluster runs. The console is slow, as a notebook's is (2 ms a line): the tasks end,
#    and Spark says so, while most of their output is still on its way to it.
class SlowConsole(io.StringIO):
    def write(self, text):
        time.sleep(0.002)
        return super().write(text)


got = 0
for k in range(5):
    console = SlowConsole()
    real = sys.stdout
    sys.stdout = console
    t = time.monotonic()
    try:
        Distributor(2, local_mode=False, use_gpu=False, dtrain=DTRAIN).run(
            "/bin/sh", "-c", 'i=0; while [ $i -lt 1000 ]; do echo "filler $RANK $i"; i=$((i+1)); done; '
                             'echo "last line %d of rank $RANK"' % k)
    finally:
        sys.stdout = real
    text = console.getvalue()
    have = [r for r in (0, 1) if re.search(r"^\[default%d\]:last line %d of rank %d$" % (r, k, r), text, re.M)]
    fillers = len(re.findall(r"^\[default[01]\]:filler ", text, re.M))
    print("run %d: last lines of ranks %s, %d of 2000 filler lines (%.1f s)" % (k + 1, have, fillers, time.monotonic() - t),
          flush=True)
    got += len(have) == 2 and fillers == 2000
if got != 5:
    fail("the programs' last lines reached the driver in %d of 5 runs" % got)
ok("every line, the last one too, on the driver's console in 5 of 5 runs")
spark.stop()
