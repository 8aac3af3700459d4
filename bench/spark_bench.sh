#!/usr/bin/env bash
# dtrain on Spark against PySpark's TorchDistributor, on the same Spark standalone cluster
# (master + 2 workers x 2 cores on loopback, tests/spark/lib.sh), in one SparkSession, in one
# run: time from run() to the result for a trivial all-reduce job (2 processes), and what
# each reports for a worker that exits with code 7. Ratios in the same run; names the machine.
#   bench/spark_bench.sh BUILD_DIR [REPEATS]
# (TorchDistributor's failure case is cancelled after 60 s; a torchrun it leaves behind is
# reported and killed by spark_down, which then exits 1.)
source "$(dirname "$0")/../tests/spark/lib.sh"
BUILD="$(realpath "${1:-build}")"
REPS="${2:-3}"
SRC="$(realpath "$(dirname "$0")/..")"
spark_init
spark_up 2
cat >"$T/peer.py" <<'PY'
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if len(sys.argv) > 1 and sys.argv[1] == str(dist.get_rank()):
    sys.exit(7)  # the failure case: this rank exits with code 7
print("peer rank", dist.get_rank(), "sum", t.item(), flush=True)
PY
cat >"$T/bench.py" <<PY
import os, platform, statistics, sys, time
from pyspark.sql import SparkSession
from pyspark.ml.torch.distributor import TorchDistributor
from dtrain.spark import Distributor
spark = SparkSession.builder.master("$SPARK_MASTER_URL").appName("dtrain-bench").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
def timed(f):
    t = time.perf_counter(); r = f(); return time.perf_counter() - t, r
worker = "$BUILD/tests/cluster_worker"
rows = {}
for name, job in [
    ("dtrain.spark (C++ cluster_worker)", lambda: Distributor(2, local_mode=False, dtrain="$BUILD/tools/dtrain").run(worker)),
    ("TorchDistributor (peer.py)", lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run("$T/peer.py")),
]:
    job()  # warm: the executors' Python workers, the page cache
    rows[name] = [timed(job)[0] for _ in range($REPS)]
print("machine:", platform.node(), platform.machine(), os.cpu_count(), "cores;", "Spark", spark.version)
for n, v in rows.items():
    print("%-36s median %.2f s  (runs: %s)" % (n, statistics.median(v), ", ".join("%.2f" % x for x in v)))
d, p = (statistics.median(v) for v in rows.values())
print("round trip ratio dtrain / TorchDistributor: %.2f" % (d / p))
t, rc = timed(lambda: Distributor(2, local_mode=False, dtrain="$BUILD/tools/dtrain").run("/bin/sh", "-c", 'exit \$((RANK == 1 ? 7 : 0))'))
print("failure: dtrain.spark returned exit status %d after %.2f s (root cause with rank, host, exit code printed above)" % (rc, t))
# TorchDistributor's node 0 keeps waiting after node 1 failed: cancel the job after 60 s.
import threading
timer = threading.Timer(60, spark.sparkContext.cancelAllJobs)
timer.start()
t0 = time.perf_counter()
try:
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run("$T/peer.py", "1")
    print("failure: TorchDistributor returned normally")
except Exception as e:
    msg = str(e).strip().splitlines()
    print("failure: TorchDistributor raised %s after %.2f s: %s" % (type(e).__name__, time.perf_counter() - t0, (msg[-1] if msg else "")[:300]))
timer.cancel()
spark.stop()
PY
PYTHONPATH="$SRC/python" "$PY" -u "$T/bench.py" 2>&1 | grep -v "WARN\|^WARNING\|Stage [0-9]"
