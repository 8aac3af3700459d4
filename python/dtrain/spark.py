"""dtrain on Spark: run a dtrain program (a libtorch C++ training binary, or a .py) on a Spark
cluster's workers, placed by one barrier stage, as PySpark's TorchDistributor does.

From PySpark (a notebook with a SparkSession, or plain Python):

    from dtrain.spark import Distributor
    rc = Distributor(num_processes=4, local_mode=False).run("/path/to/train", "--epochs", "1")

From the shell (what the C++ Distributor runs too):

    spark-submit --master spark://HOST:7077 dtrain/spark.py --tasks 2 -- dtrain run \
        --nproc-per-node 2 /path/to/train ...
    dtrain run --spark-master spark://HOST:7077 --nnodes 2 --nproc-per-node 2 /path/to/train

The C++ Distributor keeps one application between its run() calls (`--serve`, `--client`:
see "a kept Spark application" below), as a notebook keeps its SparkSession.

How it works. The driver runs one barrier stage of T tasks (T = --tasks). Task i runs a dtrain
agent, `dtrain run --nnodes T --node-rank i --master-addr <task 0's host> --master-port <a
free port task 0 picked, shared with allGather> ...`, with its output sent line by line to
the driver over a socket (the driver prints it: the agents' rank-prefixed logs on the driver's
console). A task never raises for a failed agent (Spark would retry the barrier stage and
train twice): it returns the agent's exit code, and the driver exits with the first failing
one. A task of a retried attempt refuses to start training. A task whose driver goes away
(socket closed) or whose Python worker dies (PR_SET_PDEATHSIG) stops its agent, and the
agent stops its workers.
"""

import os
import socket
import subprocess
import sys
import threading
import time

try:
    from dtrain import _cluster
except ImportError:  # run as a script (spark-submit .../dtrain/spark.py): its directory is on the path
    import _cluster

REFUSED_RETRY = 75  # exit status: Spark retried the stage; training was not run again
NO_SLOTS = 76       # exit status: the cluster has too few task slots


def plan_tasks(num_processes, use_gpu, task_gpu_amount=None, processes_per_task=None):
    """(tasks, processes per task), as TorchDistributor sizes a cluster run: one process per
    task on CPUs, spark.task.resource.gpu.amount processes (one per GPU) per task with GPUs."""
    if num_processes < 1:
        raise ValueError("num_processes must be at least 1, got %d" % num_processes)
    per = processes_per_task or (int(task_gpu_amount or 1) if use_gpu else 1)
    if per < 1 or num_processes % per:
        raise ValueError("num_processes (%d) must be a multiple of the processes per task (%d)"
                         % (num_processes, per))
    return num_processes // per, per


def _task_fn(agent_argv, tasks, log_addr, env, split_omp=True):
    """The barrier task: runs one dtrain agent, returns [(partition, exit code, host)]."""

    def run(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        part = ctx.partitionId()
        host = socket.gethostname()
        if ctx.attemptNumber() > 0:
            return [(part, REFUSED_RETRY, host)]
        # The driver says whether this node may start: once per partition per run, so a
        # retried barrier stage (a new stage attempt, its tasks again at attempt 0) does not
        # train a second time.
        log, answer = _cluster.open_log(log_addr, b"START %d" % part)
        if answer != b"GO":
            log.close()
            return [(part, REFUSED_RETRY, host)]
        infos = ctx.getTaskInfos()
        master = infos[0].address.rsplit(":", 1)[0]
        port = ""
        if part == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
        port = ctx.allGather(port)[0]
        i = agent_argv.index("run") + 1
        argv = (agent_argv[:i] + ["--nnodes", str(tasks), "--node-rank", str(part),
                                  "--master-addr", master, "--master-port", port]
                + agent_argv[i:])
        child_env = dict(os.environ)
        # Spark sets OMP_NUM_THREADS to spark.task.cpus in every Python worker (unless
        # spark.executorEnv.OMP_NUM_THREADS is set): the task's cores, which its agent's
        # processes share. Each worker gets its share, not all of them: with 2 processes of
        # 2 OpenMP threads each on a 2-core task, the Fashion-MNIST example trained at 291
        # samples/s instead of 6975 on the loaded 2-core test VM (bench/spark_bench.sh).
        if split_omp:
            try:
                per = int(argv[argv.index("--nproc-per-node") + 1])
            except (ValueError, IndexError):
                per = 1
            child_env["OMP_NUM_THREADS"] = str(max(1, int(ctx.cpus()) // max(1, per)))
        child_env.update(env)
        gpus = ctx.resources().get("gpu")
        if gpus is not None and "CUDA_VISIBLE_DEVICES" not in env:
            child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses)
        rc = _cluster.run_agent(argv, child_env, log)
        return [(part, rc, host)]

    return run


def _start_once():
    """The log server's answer to a task's "START i": GO the first time partition i asks in this
    run, NO after that (a retried stage attempt)."""
    started = set()
    lock = threading.Lock()

    def hello(words):
        with lock:
            if len(words) == 2 and words[0] == b"START" and words[1] not in started:
                started.add(words[1])
                return b"GO"
        return None

    return hello


def _max_slots(sc):
    jsc = sc._jsc.sc()
    return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))


def task_slots(sc, tasks, wait, settle=3.0):
    """The application's task slots, as Spark counts them for a barrier stage (its executors'
    cores / spark.task.cpus, maxNumConcurrentTasks), and how many of them run no task now
    (the active stages' running tasks, from the status tracker): {"total_slots", "free_slots"}.
    Executors register over a few seconds after the application starts, so it counts once they
    hold `tasks` slots and the count has not changed for `settle` seconds (at most `wait`)."""
    deadline = time.monotonic() + wait
    last, since = -1, time.monotonic()
    while True:
        total = _max_slots(sc)
        now = time.monotonic()
        if total != last:
            last, since = total, now
        if (total >= tasks and now - since >= settle) or now > deadline:
            break
        time.sleep(0.25)
    tracker = sc.statusTracker()
    running = 0
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        if info is not None:
            running += info.numActiveTasks
    return {"total_slots": total, "free_slots": max(0, total - running)}


def run_on_spark(sc, tasks, agent_argv, env=None, slot_timeout=60.0, out=None, err=None,
                 cancelled=None):
    """Runs `agent_argv` (a `dtrain run ...` command line) as T barrier tasks of `sc`; returns
    the exit status: 0, the first failing agent's code, NO_SLOTS or REFUSED_RETRY. out: where
    the agents' output goes (bytes), err: dtrain's own messages (text); cancelled: an Event
    that, once set, ends the wait for slots (the caller cancels the stage itself)."""
    out = out or sys.stdout.buffer
    err = err or sys.stderr
    srv = _cluster.LogServer(out, _start_once())
    driver_host = sc.getConf().get("spark.driver.host", socket.gethostname())
    log_addr = (driver_host, srv.port)
    # Wait for executors with T slots (they register after the application starts); Spark's
    # own check would otherwise fail at once, or retry for 40 x 15 s.
    deadline = time.monotonic() + slot_timeout
    slots = 0
    while True:
        try:
            slots = _max_slots(sc)
        except Exception:  # older Spark: no such call; let the barrier check decide
            slots = tasks
        if slots >= tasks or time.monotonic() > deadline:
            break
        if cancelled is not None and cancelled.is_set():
            srv.close()
            return 1
        time.sleep(0.2)
    if slots < tasks:
        err.write(
            "dtrain.spark: the cluster has %d free task slot(s) for this job after %.0f s, but the "
            "barrier stage needs %d (one per node: num_processes / processes per task); add workers "
            "or cores (SPARK_WORKER_CORES), lower spark.task.cpus, or lower num_processes\n"
            % (slots, slot_timeout, tasks))
        srv.close()
        return NO_SLOTS
    # The executors' Python has no dtrain module: ship the task function (and, imported as
    # dtrain.spark, this module) by value.
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(_cluster)
    if __name__ != "__main__":
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rdd = sc.parallelize(range(tasks), tasks).barrier()
    try:
        # Split the task's cores among its processes unless the user chose the threads.
        split_omp = ("OMP_NUM_THREADS" not in (env or {}) and
                     sc.getConf().get("spark.executorEnv.OMP_NUM_THREADS", None) is None)
        results = rdd.mapPartitions(_task_fn(list(agent_argv), tasks, log_addr, env or {},
                                             split_omp)).collect()
    except Exception as e:  # the stage failed in Spark itself (a Python worker died, ...)
        msg = str(e)
        if "SPARK-24819" in msg or "more slots than the total number" in msg:
            err.write("dtrain.spark: the barrier stage needs %d slots; the cluster has fewer\n" % tasks)
            return NO_SLOTS
        # The cause is in the Python traceback of the task, inside Spark's message.
        lines = [l for l in msg.splitlines() if l.strip()]
        cause = [l for l in lines if "Error" in l and not l.startswith("\tat ")]
        err.write("dtrain.spark: the Spark job failed: %s\n" % (cause[-1] if cause else lines[0] if lines else repr(e)))
        if os.environ.get("DTRAIN_SPARK_DEBUG"):
            err.write(msg + "\n")
        return 1
    finally:
        srv.close()
    results.sort()
    failed = [r for r in results if r[1] != 0]
    if any(r[1] == REFUSED_RETRY for r in failed):
        err.write("dtrain.spark: Spark retried the barrier stage; dtrain does not train twice "
                         "silently (spark.task.maxFailures=1): run the job again\n")
        return REFUSED_RETRY
    if failed:
        part, rc, host = failed[0]
        err.write("dtrain.spark: node %d (Spark task on %s) exited with code %d\n" % (part, host, rc))
        return rc if rc > 0 else 128 - rc
    return 0


def spark_conf(num_tasks, per_task, use_gpu):
    """The settings the barrier stage needs (the caller's own --conf wins)."""
    conf = {"spark.task.maxFailures": "1",
            "spark.stage.maxConsecutiveAttempts": "1",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "5",
            "spark.python.worker.reuse": "false"}
    if use_gpu:
        conf["spark.task.resource.gpu.amount"] = str(per_task)
    else:
        conf["spark.task.cpus"] = str(per_task)
    return conf


class Distributor:
    """TorchDistributor's shape for dtrain programs.

    Distributor(num_processes, local_mode, use_gpu).run(program, *args) -> exit status.
    local_mode=True runs `dtrain run --nproc-per-node N` here; False runs on the active
    SparkSession's cluster (or `master`), one barrier task per node of processes."""

    def __init__(self, num_processes=1, local_mode=True, use_gpu=False, master=None,
                 dtrain="dtrain", spark=None, slot_timeout=60.0, env=None):
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.master = master
        self.dtrain = dtrain
        self.spark = spark
        self.slot_timeout = slot_timeout
        self.env = dict(env or {})

    def _session(self):
        """The SparkSession the job runs in, as TorchDistributor finds it: the given one, else
        the active one (a notebook's), else SparkSession.builder.getOrCreate() (with `master`
        and the barrier stage's settings when it has to start one). A session started here is
        kept, not stopped after run(): the next run() reuses its application and executors."""
        from pyspark.sql import SparkSession
        if self.spark is not None:
            return self.spark
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        b = SparkSession.builder.appName("dtrain")
        if self.master:
            b = b.master(self.master)
        tasks, per = plan_tasks(self.num_processes, self.use_gpu)
        for k, v in spark_conf(tasks, per, self.use_gpu).items():
            b = b.config(k, v)
        self.spark = b.getOrCreate()
        return self.spark

    def run(self, program, *args):
        args = [str(a) for a in args]
        if self.local_mode:
            return subprocess.call([self.dtrain, "run", "--nproc-per-node", str(self.num_processes),
                                    program] + args, env={**os.environ, **self.env})
        session = self._session()
        conf = session.sparkContext.getConf()
        tasks, per = plan_tasks(self.num_processes, self.use_gpu,
                                conf.get("spark.task.resource.gpu.amount", None))
        argv = [self.dtrain, "run", "--nproc-per-node", str(per), program] + args
        return run_on_spark(session.sparkContext, tasks, argv, self.env, self.slot_timeout)


def make_converter(df, parent_cache_dir=None, **options):
    """Petastorm's make_spark_converter for dtrain: `df` materialised once as Parquet (reused
    while its plan is the same), returned as a Converter whose .location ("parquet:DIR") a
    Distributor run hands to a C++ program (dtrain::data). See dtrain/converter.py."""
    from dtrain.converter import make_converter as make
    return make(df, parent_cache_dir, **options)


# ---- a kept Spark application: a driver service, and the client of one job -----------------
#
# `spark-submit ... spark.py --serve SOCKET --parent-pid PID [--idle-timeout S]` creates the
# SparkContext once and serves jobs (dtrain/_cluster.py's service) as a notebook's
# SparkSession serves TorchDistributor.run() calls, several at once as its threads do (Tune's
# trials): the executors (and their Python daemons) stay up between jobs, and a job is one
# barrier stage, which Spark starts once all its slots are free at once. When the service stops it
# stops the SparkContext, and the application's end stops the executors (and with them the
# tasks' agents). `spark.py --client SOCKET --tasks T [--slot-timeout S] -- dtrain run ...` (a
# plain Python, no pyspark) is one job; its going away cancels the job's stage.

def serve(sock_path, parent_pid, idle_timeout=600.0):
    from pyspark import SparkContext

    sc = SparkContext.getOrCreate()
    sc.setLogLevel("ERROR")

    def run_job(req, n, out, err, gone):
        tasks, argv = int(req["tasks"]), [str(a) for a in req["argv"]]
        slot_timeout = float(req.get("slot_timeout", 60.0))
        sc.setJobGroup("dtrain-job-%d" % n, "dtrain job %d" % n, interruptOnCancel=True)
        return run_on_spark(sc, tasks, argv, {}, slot_timeout, out=out, err=err, cancelled=gone)

    def query(req):
        return task_slots(sc, int(req.get("tasks", 1)), float(req.get("wait", 60.0)))

    def on_stop():
        try:
            sc.cancelAllJobs()
        except Exception:
            pass
        sc.stop()  # bounded by serve(); the JVM's end stops the executors either way

    _cluster.serve(sock_path, parent_pid, idle_timeout, "spark", sc.applicationId,
                   "Spark application " + sc.applicationId, run_job,
                   query=query, cancel=lambda n: sc.cancelJobGroup("dtrain-job-%d" % n),
                   on_stop=on_stop)


def main(argv):
    """spark-submit entry: spark.py --tasks T [--slot-timeout S] -- DTRAIN run ...;
    spark.py --serve SOCKET --parent-pid PID [--idle-timeout S] (under spark-submit);
    spark.py --client SOCKET --tasks T [--slot-timeout S] -- DTRAIN run ... (plain Python)."""
    if argv[:1] == ["--serve"]:
        opts = dict(zip(argv[2::2], argv[3::2]))
        return serve(argv[1], int(opts["--parent-pid"]), float(opts.get("--idle-timeout", 600)))
    sock = None
    if argv[:1] == ["--client"] and len(argv) > 1:
        sock, argv = argv[1], argv[2:]
    if "--" not in argv:
        sys.stderr.write("usage: spark-submit dtrain/spark.py --tasks T [--slot-timeout S] -- dtrain run ...\n")
        return 2
    cut = argv.index("--")
    opts, agent = argv[:cut], argv[cut + 1:]
    tasks, slot_timeout = 0, 60.0
    i = 0
    while i < len(opts):
        if opts[i] == "--tasks":
            tasks = int(opts[i + 1])
        elif opts[i] == "--slot-timeout":
            slot_timeout = float(opts[i + 1])
        else:
            sys.stderr.write("dtrain.spark: unknown option %s\n" % opts[i])
            return 2
        i += 2
    if tasks < 1 or "run" not in agent:
        sys.stderr.write("dtrain.spark: need --tasks T (>= 1) and a `dtrain run ...` command after --\n")
        return 2
    if sock is not None:
        return _cluster.client(sock, {"tasks": tasks, "slot_timeout": slot_timeout, "argv": agent}, "spark")
    from pyspark import SparkContext
    sc = SparkContext.getOrCreate()
    sc.setLogLevel("ERROR")
    try:
        return run_on_spark(sc, tasks, agent, {}, slot_timeout)
    finally:
        sc.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
