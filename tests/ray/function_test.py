"""dtrain.ray.Distributor's function mode on the test's Ray cluster (tests/ray/ray_test.sh: the
head on n0, where this driver runs, and worker nodes n1, n2 of 2 CPUs), in one driver process:
on the cluster, 2 bundles x 2 processes STRICT_SPREAD, a function with args and kwargs that
all-reduces in a Gloo group made from the environment dtrain set comes back with rank 0's value
from the worker host that ran rank 0 (never n0); a function that raises on rank 1 (the other
host) gives WorkerError naming rank 1, its host and the ValueError with its traceback, while
rank 0 waits in a sleep. In local mode (`dtrain run` on n0): the same function's value, a
raising function, rank 0 that exits without returning, a value that cannot be unpickled here,
and one that cannot be pickled there. The shell checks after it that nothing is left.

    function_test.py RAY_GCS DTRAIN
"""

import os
import socket
import sys
import time

GCS, DTRAIN = sys.argv[1], sys.argv[2]
T0 = time.monotonic()


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    os._exit(1)


def ok(msg):
    print("ok: %s (%.0f s)" % (msg, time.monotonic() - T0), flush=True)


def raised(make):
    try:
        value = make()
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        return e
    fail("expected an exception, got the value %r" % (value,))


import ray  # noqa: E402

from dtrain.ray import Distributor, WorkerError  # noqa: E402

ray.init(address=GCS, log_to_driver=False, logging_level="ERROR")
HERE = socket.gethostname()


def train(base, scale=1):
    import os
    import socket

    import torch
    import torch.distributed as dist

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if k not in os.environ:
            raise KeyError("dtrain did not set %s" % k)
    dist.init_process_group("gloo")  # env://, from what dtrain set
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    world = dist.get_world_size()
    dist.destroy_process_group()
    return {"value": base + scale * t.item(), "world": world, "host": socket.gethostname(),
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")}}


def fails_on_rank_1():
    import os
    import time

    if os.environ["RANK"] == "1":
        raise ValueError("failing on purpose on rank 1")
    time.sleep(120)  # stopped by the failure, long before this ends
    return "rank 0 should not have returned"


# 1. Cluster mode: rank 0's value from a worker host.
t = time.monotonic()
got = Distributor(4, local_mode=False, processes_per_bundle=2, strategy="STRICT_SPREAD",
                  dtrain=DTRAIN).run(train, 10, scale=2)
want_env = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "NODE_RANK": "0"}
if not isinstance(got, dict) or got.get("value") != 30.0 or got.get("world") != 4 or got.get("env") != want_env:
    fail("cluster function mode: %r, expected rank 0's value 10 + 2 x (1+2+3+4) = 30.0 of 4 ranks, env %r"
         % (got, want_env))
if got["host"] not in ("n1", "n2") or got["host"] == HERE:
    fail("cluster function mode: rank 0 ran on %r, expected a worker host (n1 or n2), not the driver's %r"
         % (got["host"], HERE))
ok("cluster, 2 bundles x 2 STRICT_SPREAD: rank 0's value %r (all-reduce of 4 ranks, args and kwargs) "
   "back from %s on the driver on %s, in %.1f s" % (got["value"], got["host"], HERE, time.monotonic() - t))

# 2. Cluster mode: rank 1 raises on the other host; rank 0 is stopped.
t = time.monotonic()
e = raised(lambda: Distributor(2, local_mode=False, strategy="STRICT_SPREAD", dtrain=DTRAIN).run(fails_on_rank_1))
took = time.monotonic() - t
text = str(e)
if not isinstance(e, WorkerError) or not isinstance(e, RuntimeError) or e.rank != 1 or \
        e.error != "ValueError: failing on purpose on rank 1" or e.host not in ("n1", "n2") or \
        "rank 1 (host %s" % e.host not in text or "ValueError: failing on purpose on rank 1" not in text or \
        'raise ValueError("failing on purpose on rank 1")' not in text:
    fail("cluster, a raising function: %r, expected WorkerError naming rank 1, its host, the ValueError "
         "and its traceback" % e)
if took > 60:
    fail("cluster, a raising function: run() raised after %.0f s; rank 0 was not stopped" % took)
ok("cluster, rank 1 raises on %s: %s: %s (%.1f s)" % (e.host, type(e).__name__, text.splitlines()[0], took))

# 3. Local mode: the same function, `dtrain run` on this host.
t = time.monotonic()
got = Distributor(2, dtrain=DTRAIN).run(train, 1, scale=3)
if not isinstance(got, dict) or got.get("value") != 10.0 or got.get("world") != 2 or got.get("host") != HERE or \
        got["env"]["RANK"] != "0" or got["env"]["WORLD_SIZE"] != "2":
    fail("local function mode: %r, expected rank 0's value 1 + 3 x (1+2) = 10.0 of 2 ranks on %s" % (got, HERE))
ok("local, 2 processes: rank 0's value %r (%.1f s)" % (got["value"], time.monotonic() - t))

# 4. Local mode: the raising function.
e = raised(lambda: Distributor(2, dtrain=DTRAIN).run(fails_on_rank_1))
if not isinstance(e, WorkerError) or e.rank != 1 or e.error != "ValueError: failing on purpose on rank 1" or \
        "Traceback" not in str(e):
    fail("local, a raising function: %r" % e)
ok("local, rank 1 raises: %s" % str(e).splitlines()[0])


# 5. Local mode: rank 0 exits without returning; a value that cannot be unpickled here; one
#    that cannot be pickled there; a program given keyword arguments.
def exits_on_rank_0():
    import os
    import sys

    if os.environ["RANK"] == "0":
        sys.exit(0)
    return 1


def _unbuildable():
    raise ValueError("cannot be rebuilt on the driver")


class Unbuildable:
    def __reduce__(self):
        return _unbuildable, ()


e = raised(lambda: Distributor(2, dtrain=DTRAIN).run(exits_on_rank_0))
if type(e) is not RuntimeError or "rank 0 did not return from the function" not in str(e):
    fail("local, rank 0 exits without returning: %r" % e)
ok("local, rank 0 calls sys.exit(0): %s" % e)
e = raised(lambda: Distributor(1, dtrain=DTRAIN).run(lambda: Unbuildable()))
if type(e) is not RuntimeError or "cannot be unpickled here (ValueError: cannot be rebuilt on the driver)" not in str(e):
    fail("local, a value that cannot be unpickled: %r" % e)
ok("local, a value that cannot be unpickled on the driver: %s" % e)
e = raised(lambda: Distributor(1, dtrain=DTRAIN).run(lambda: __import__("threading").Lock()))
if not isinstance(e, WorkerError) or e.rank != 0 or "rank 0's return value, a lock, cannot be pickled" not in e.error:
    fail("local, a value that cannot be pickled: %r" % e)
ok("local, a value that cannot be pickled on rank 0: %s" % e.error)
e = raised(lambda: Distributor(1, dtrain=DTRAIN).run("/bin/true", lr=1))
if type(e) is not TypeError or "as keywords (got lr)" not in str(e):
    fail("a program with keyword arguments: %r" % e)
ok("a program with keyword arguments: %s" % e)
if Distributor(2, dtrain=DTRAIN).run("/bin/sh", "-c", "exit $((RANK == 1 ? 3 : 0))") != 3:
    fail("program mode no longer returns the exit status")
ok("program mode still returns the exit status (3)")
