"""dtrain on Spark: run a dtrain program (a libtorch C++ training binary, or a .py) on a Spark
cluster's workers, placed by one barrier stage, as PySpark's TorchDistributor does.

From PySpark (a notebook with a SparkSession, or plain Python), as TorchDistributor:

    from dtrain.spark import Distributor
    Distributor(num_processes=4, local_mode=False, use_gpu=False).run("/path/to/train", "--epochs", "1")
    value = Distributor(num_processes=2, use_gpu=False).run(train_fn, 1e-3)  # rank 0's return

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
console; once the stage ends, the driver reads each task's connection to its end, at most 10 s,
so a program's last lines are not lost). The agent's workers get NODE_RANK = i too, as
TorchDistributor's. A task never raises for a failed agent (Spark would retry the barrier stage and
train twice): it returns the agent's exit code, and the driver exits with the first failing
one. A task of a retried attempt refuses to start training. A task whose driver goes away
(socket closed) or whose Python worker dies (PR_SET_PDEATHSIG) stops its agent, and the
agent stops its workers. Function mode (Distributor.run(function)): the pickled function
travels in the task closure; each worker runs it (_cluster.FUNCTION_RUNNER), and task 0 returns
rank 0's pickled result with its exit code.
"""

import os
import shutil
import socket
import sys
import tempfile
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


def _task_fn(agent_argv, tasks, log_addr, env, split_omp=True, use_gpu=None, payload=None):
    """The barrier task: runs one dtrain agent, returns [(partition, exit code, host, output)].
    use_gpu: False hides the GPUs from the workers (CUDA_VISIBLE_DEVICES=""), as TorchDistributor
    does on CPUs; True or None gives them the task's GPUs. payload: function mode, a pickled
    (function, args, kwargs): the agent runs it (FUNCTION_RUNNER) and partition 0 returns rank
    0's pickled result as its output (None otherwise)."""

    def run(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        part = ctx.partitionId()
        host = socket.gethostname()
        if ctx.attemptNumber() > 0:
            return [(part, REFUSED_RETRY, host, None)]
        # The driver says whether this node may start: once per partition per run, so a
        # retried barrier stage (a new stage attempt, its tasks again at attempt 0) does not
        # train a second time.
        log, answer = _cluster.open_log(log_addr, b"START %d" % part)
        if answer != b"GO":
            log.close()
            return [(part, REFUSED_RETRY, host, None)]
        infos = ctx.getTaskInfos()
        master = infos[0].address.rsplit(":", 1)[0]
        port = ""
        if part == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
        port = ctx.allGather(port)[0]
        argv = _cluster.with_agent_flags(agent_argv, ["--nnodes", str(tasks), "--node-rank", str(part),
                                                      "--master-addr", master, "--master-port", port])
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
        # What TorchDistributor's task gives torchrun, whose workers inherit it: the node's
        # index (the workers' RANK, WORLD_SIZE, MASTER_ADDR/PORT are the agent's, as torchrun's).
        child_env["NODE_RANK"] = str(part)
        # Tells the agent it is a Spark task's, whose console the driver shares with the rest.
        child_env["DTRAIN_SPARK_TASK"] = str(part)
        child_env.update(env)
        gpus = ctx.resources().get("gpu")
        if "CUDA_VISIBLE_DEVICES" not in env:
            if use_gpu is False:
                child_env["CUDA_VISIBLE_DEVICES"] = ""
            elif gpus is not None:
                child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses)
        work = None
        try:
            if payload is not None:  # function mode: the function's file and its result's
                work = tempfile.mkdtemp(prefix="dtrain-fn-")
                func, result = _cluster.function_files(work, payload)
                argv += [sys.executable, "-c", _cluster.FUNCTION_RUNNER, func, result]
            rc = _cluster.run_agent(argv, child_env, log)
            output = None
            if payload is not None and part == 0 and rc == 0:
                output = _cluster.read_result(result)
            return [(part, rc, host, output)]
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)

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
                 cancelled=None, use_gpu=None, payload=None, outputs=None):
    """Runs `agent_argv` (a `dtrain run|launch ...` command line) as T barrier tasks of `sc`; returns
    the exit status: 0, the first failing agent's code, NO_SLOTS or REFUSED_RETRY. out: where
    the agents' output goes (bytes), err: dtrain's own messages (text); cancelled: an Event
    that, once set, ends the wait for slots (the caller cancels the stage itself). use_gpu,
    payload: _task_fn's (function mode: `agent_argv` names no program); outputs: a dict that
    gets "output", rank 0's pickled result in function mode.

    Every line an agent printed is on `out` when this returns: Spark can say the stage is done
    before the driver has read a task's last lines (in this socket's buffers, or not yet read
    by its thread), so the log server reads each connection to its end (at most 10 s) before
    it closes."""
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
                                             split_omp, use_gpu, payload)).collect()
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
        # Every task has ended (or the stage failed, which ends them): read each task's log
        # connection to its end, as dtrain.ray does, so a program's last lines are not lost.
        srv.close(drain=True)
    results.sort()
    if outputs is not None:
        outputs["output"] = next((r[3] for r in results if r[0] == 0), None)
    failed = [r for r in results if r[1] != 0]
    if any(r[1] == REFUSED_RETRY for r in failed):
        err.write("dtrain.spark: Spark retried the barrier stage; dtrain does not train twice "
                         "silently (spark.task.maxFailures=1): run the job again\n")
        return REFUSED_RETRY
    if failed:
        part, rc, host, _ = failed[0]
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
    """PySpark's TorchDistributor for dtrain programs and Python functions:

        Distributor(num_processes=1, local_mode=True, use_gpu=True).run(train_object, *args, **kwargs)

    As TorchDistributor's (pyspark 4.0.1):
    - use_gpu defaults to True, and GPUs asked for must be configured, else RuntimeError: with
      local_mode=False the session's spark.task.resource.gpu.amount (one GPU per process),
      with local_mode=True the driver's GPUs (the session's resources and
      spark.driver.resource.gpu.amount; num_processes is lowered to their number, with a
      warning). CPU training: pass use_gpu=False (then the cluster's workers see no GPU:
      CUDA_VISIBLE_DEVICES=""). num_processes that is not an int: TypeError; not positive:
      ValueError.
    - run(path, *args): a program (a C++ binary, a .py, anything `dtrain run` runs) on
      num_processes processes; returns None; a failure raises RuntimeError naming the command,
      its return code and the last 100 lines of output. kwargs: ValueError.
    - run(function, *args, **kwargs): function mode. The function and its arguments are
      pickled with cloudpickle, every process calls it with torchrun's environment (RANK,
      WORLD_SIZE, MASTER_ADDR, ...), and run() returns rank 0's return value.
    local_mode=True runs `dtrain run --nproc-per-node N` on this machine (no Spark needed
    unless use_gpu); False runs one Spark barrier stage on the session's cluster (the given
    `spark`, else the active SparkSession, else one started with `master`), one task per node
    of processes (dtrain's processes per task: spark.task.resource.gpu.amount with GPUs, 1 on
    CPUs), each task's workers with NODE_RANK = the task's partition, as TorchDistributor's.

    Where dtrain differs, on purpose: a failing script raises (TorchDistributor 4.0.1's
    torchrun wrapper exits 0 whatever torchrun's status, so its run() returns None); a
    failure in non-local mode raises the same RuntimeError as in local mode (TorchDistributor
    raises Spark's Py4JJavaError for a failing function there); rank 0's value is returned
    (TorchDistributor's local mode returns the last one any process wrote); local mode
    without GPUs needs no SparkSession (TorchDistributor needs one always)."""

    def __init__(self, num_processes=1, local_mode=True, use_gpu=True, master=None,
                 dtrain="dtrain", spark=None, slot_timeout=60.0, env=None):
        if isinstance(num_processes, bool) or not isinstance(num_processes, int):
            raise TypeError("num_processes has to be a positive integer, got %r (%s): pass an int"
                            % (num_processes, type(num_processes).__name__))
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.master = master
        self.dtrain = dtrain
        self.spark = spark
        self.slot_timeout = slot_timeout
        self.env = dict(env or {})
        self.driver_gpus = None  # local mode with GPUs: the driver's GPUs the workers get
        # TorchDistributor's order: the GPU settings first, then the count.
        if use_gpu:
            self._check_gpus()
        if self.num_processes <= 0:
            raise ValueError("num_processes has to be a positive integer, got %d: the number of "
                             "training processes (1 or more)" % self.num_processes)

    def _known_session(self):
        """The given or active SparkSession, or None (none is started here)."""
        if self.spark is not None:
            return self.spark
        try:
            from pyspark.sql import SparkSession
        except ImportError:
            return None
        return SparkSession.getActiveSession()

    def _check_gpus(self):
        cpu = "; or pass use_gpu=False to train on CPUs"
        session = self._known_session()
        if not self.local_mode:
            if session is None:
                return  # the session run() starts sets spark.task.resource.gpu.amount (spark_conf)
            key = "spark.task.resource.gpu.amount"
            try:
                amount = float(session.conf.get(key, "0") or "0")
            except ValueError:
                amount = 0
            if amount < 1:
                raise RuntimeError("'%s' was unset, so gpu usage is unavailable: set it on the "
                                   "session (the GPUs of each task, one per process)%s" % (key, cpu))
            return
        if session is None:
            raise RuntimeError("use_gpu=True in local mode trains on the driver's GPUs, which come "
                               "from the active SparkSession (spark.driver.resource.gpu.amount and "
                               "a discovery script), and there is no active SparkSession: start one "
                               "with them%s" % cpu)
        resources = session.sparkContext.resources
        if "gpu" not in resources:
            raise RuntimeError("GPUs were unable to be found on the driver: its SparkSession has no "
                               "'gpu' resource (set spark.driver.resource.gpu.amount and "
                               "spark.driver.resource.gpu.discoveryScript)%s" % cpu)
        available = int(float(session.conf.get("spark.driver.resource.gpu.amount", "0") or "0"))
        if available == 0:
            raise RuntimeError("GPU resources were not configured properly on the driver: "
                               "spark.driver.resource.gpu.amount is 0 or unset%s" % cpu)
        if self.num_processes > available:
            sys.stderr.write("dtrain.spark: num_processes (%d) is more than the driver's %d GPU(s): "
                             "lowered to %d, as TorchDistributor does\n"
                             % (self.num_processes, available, available))
            self.num_processes = available
        owned = list(resources["gpu"].addresses)
        bad = [a for a in owned if not a.isdigit() or (len(a) > 1 and a[0] == "0")]
        if bad:
            raise ValueError("the driver's GPU addresses %s are not all CUDA_VISIBLE_DEVICES "
                             "indices (integers, no zero padding): fix the discovery script" % owned)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:  # Spark's addresses index the devices this process already sees
            devices = visible.split(",")
            owned = [devices[int(a)] for a in owned if int(a) < len(devices)]
        self.driver_gpus = owned[:max(0, self.num_processes)]

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

    def run(self, train_object, *args, **kwargs):
        """Runs train_object (a program's path, or a function) on num_processes processes.
        Returns None for a program, rank 0's return value for a function; raises RuntimeError
        when the run fails (the command, its return code, the last 100 lines of its output)."""
        if isinstance(train_object, str):
            if kwargs:
                raise ValueError("Running pytorch file does not support key-word type arguments: "
                                 "pass the program's arguments as strings (%s)" % sorted(kwargs))
            program = [train_object] + [str(a) for a in args]
            payload = None
        elif callable(train_object):
            program = None
            payload = _cluster.cloudpickle_module().dumps((train_object, args, kwargs))
        else:
            raise TypeError("run() takes a program's path (str) or a function, got %r" % (train_object,))
        out = _cluster.OutputTail()
        if self.local_mode:
            rc, argv, output, said = self._run_here(program, payload, out)
        else:
            rc, argv, output, said = self._run_on_cluster(program, payload, out)
        if rc != 0:
            raise RuntimeError(
                "Command %s failed with return code %d.%s The last lines of its output are "
                "included below (all of it went to this console):\n%s"
                % (argv, rc, (" " + said.strip()) if said.strip() else "", out.text()))
        if payload is None:
            return None
        if output is None:
            raise RuntimeError("the function ran on every process but rank 0 wrote no result: "
                               "see the output above")
        return _cluster.cloudpickle_module().loads(output)

    def _run_here(self, program, payload, out):
        """local_mode: (exit status, the command, rank 0's pickled result or None, '')."""
        env = {**os.environ, **self.env}
        if self.driver_gpus is not None and "CUDA_VISIBLE_DEVICES" not in self.env:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.driver_gpus)
        argv = [self.dtrain, "run", "--nproc-per-node", str(self.num_processes)]
        if payload is None:
            argv += program
            return _cluster.run_local(argv, env, out), argv, None, ""
        work = tempfile.mkdtemp(prefix="dtrain-fn-")
        try:
            func, result = _cluster.function_files(work, payload)
            shown = argv + [sys.executable, "<the function>"]
            argv += [sys.executable, "-c", _cluster.FUNCTION_RUNNER, func, result]
            rc = _cluster.run_local(argv, env, out)
            return rc, shown, _cluster.read_result(result) if rc == 0 else None, ""
        finally:
            _cluster.remove_private_dir(work)

    def _run_on_cluster(self, program, payload, out):
        """local_mode=False: (exit status, the command, rank 0's pickled result or None, what
        dtrain.spark said about a failure)."""
        session = self._session()
        conf = session.sparkContext.getConf()
        tasks, per = plan_tasks(self.num_processes, self.use_gpu,
                                conf.get("spark.task.resource.gpu.amount", None))
        argv = [self.dtrain, "run", "--nproc-per-node", str(per)] + (program or [])
        said = _cluster.Said()
        outputs = {}
        rc = run_on_spark(session.sparkContext, tasks, argv, self.env, self.slot_timeout, out=out,
                          err=said, use_gpu=bool(self.use_gpu), payload=payload, outputs=outputs)
        if payload is not None:
            argv = argv + ["python", "<the function>"]
        return rc, argv, outputs.get("output"), said.text


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
        sys.stderr.write("usage: spark-submit dtrain/spark.py --tasks T [--slot-timeout S] -- dtrain run|launch ...\n")
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
    if tasks < 1 or not _cluster.is_agent_command(agent):
        sys.stderr.write("dtrain.spark: need --tasks T (>= 1) and a `dtrain run|launch ...` command after --\n")
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
