"""dtrain on Ray: run a dtrain program (a libtorch C++ training binary, or a .py) on a Ray
cluster's nodes, placed by a Ray placement group, as Ray Train's TorchTrainer places its workers.

From Python (a notebook after ray.init(), or plain Python with an address):

    from dtrain.ray import Distributor
    d = Distributor(num_processes=4, local_mode=False, processes_per_bundle=2, strategy="STRICT_SPREAD")
    rc = d.run("/path/to/train", "--epochs", "1")   # a program: its exit status
    value = d.run(train_fn, 1e-3, epochs=2)         # a function: rank 0's return value

From the shell (what `dtrain run --ray-address` and the C++ Distributor run):

    python dtrain/ray.py --address HEAD:6379 --bundles 2 --per-bundle 2 -- dtrain run \\
        --nproc-per-node 2 /path/to/train ...
    dtrain run --ray-address HEAD:6379 --nnodes 2 --nproc-per-node 2 /path/to/train

The C++ Distributor keeps one driver connected between its run() calls (`--serve`, `--client`:
dtrain/_cluster.py), as a notebook keeps its ray.init(); it runs several jobs at once (Tune's
trials), each with its placement group.

How a job runs. The driver checks that the cluster can ever hold the job (every alive node's
total resources; else exit NO_RESOURCES at once, nothing started), reserves a placement group
of B bundles of {"CPU": P x cpus, "GPU": P x gpus} (P processes per bundle; strategy PACK,
SPREAD, STRICT_PACK or STRICT_SPREAD) and waits for it up to the placement timeout (else exit
NO_RESOURCES, naming what is free). Bundle i runs a Ray task holding the bundle's resources that
runs one dtrain agent, `dtrain run --nnodes B --node-rank k --master-addr <bundle 0's node>
--master-port <a free port bundle 0's task picked> ...`, agent k's ranks [kP, (k+1)P). As Ray
Train's TorchTrainer numbers its workers, bundles on one node are consecutive agents (nodes in
the order of their first bundle) and their workers are that node's: LOCAL_RANK and
LOCAL_WORLD_SIZE count every bundle's workers on the node, NODE_RANK is the node's index, and
with GPUs each sees all of the node's bundles' GPUs (layout()); GROUP_RANK is the agent's k. Its output goes line by line over a socket to the driver, which prints it (all of a
finished task's output before the driver returns: it reads each finished task's connection to
its end, at most 10 s). A task never
raises for a failed agent: it returns the exit code, and the driver exits with the first
failing node's. Once one agent failed, the others get term timeout + 5 s to stop through the
job's own failure record, then their tasks are cancelled. However the job ends - success,
failure, the client gone, the driver's SIGTERM - the driver cancels the tasks and removes the
placement group; a driver that is SIGKILLed leaves that to Ray (a job's tasks and placement
groups end with its driver), and an agent whose task or driver is gone stops its workers.
Function mode (Distributor.run(function)): the pickled function travels as the tasks' argument;
each worker runs it (_cluster.FUNCTION_RUNNER), the task of the agent that ran rank 0 returns its
pickled result, and a failed agent's task returns the job's root cause (`dtrain run
--failure-file`), which the driver raises as WorkerError.
"""

import os
import socket
import sys
import threading
import time

if __name__ == "__main__":
    # Run as a file, this directory is first on the path, where this file would stand for the
    # `ray` package: put the package's parent there instead.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from dtrain import _cluster  # noqa: E402

NO_RESOURCES = 76  # exit status: the cluster cannot hold the job (now, or ever)
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _fits(free, need):
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def _take(free, need):
    for k, v in need.items():
        free[k] = free.get(k, 0.0) - v


def placeable(node_resources, bundles, strategy):
    """Whether `bundles` fit on nodes with these resources (a list of dicts) under `strategy`:
    first fit, bundles largest first (an approximation of Ray's own packing, exact for equal
    bundles, which dtrain's are)."""
    nodes = [dict(r) for r in node_resources]
    if strategy == "STRICT_PACK":
        total = {}
        for b in bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + v
        return any(_fits(n, total) for n in nodes)
    if strategy == "STRICT_SPREAD":
        used = set()
        for b in sorted(bundles, key=lambda b: -sum(b.values())):
            i = next((i for i, n in enumerate(nodes) if i not in used and _fits(n, b)), None)
            if i is None:
                return False
            used.add(i)
        return True
    for b in sorted(bundles, key=lambda b: -sum(b.values())):
        n = next((n for n in nodes if _fits(n, b)), None)
        if n is None:
            return False
        _take(n, b)
    return True


def slots(node_resources, per_process):
    """How many processes of `per_process` resources the nodes hold (each on one node)."""
    total = 0
    for r in node_resources:
        counts = [int(r.get(k, 0.0) // v + 1e-9) for k, v in per_process.items() if v > 0]
        total += min(counts) if counts else 0
    return total


def _resources(cpus, gpus, per):
    b = {"CPU": cpus * per}
    if gpus > 0:
        b["GPU"] = gpus * per
    return {k: v for k, v in b.items() if v > 0}


def _describe(r):
    return ", ".join("%s %g" % (k, v) for k, v in sorted(r.items())) or "nothing"


def _node_table():
    """[(node id, address, total resources, free resources)] of the alive nodes."""
    import ray

    free = {}
    try:  # per-node free resources: not public API (nor there through ray://): else the totals
        from ray._private.state import available_resources_per_node
        free = available_resources_per_node()
    except Exception:
        pass
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        total = {k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU")}
        avail = free.get(n["NodeID"])
        avail = {k: v for k, v in avail.items() if k in ("CPU", "GPU")} if avail is not None else dict(total)
        out.append((n["NodeID"], n["NodeManagerAddress"], total, avail))
    return out


def layout(nodes, gpus, per):
    """Where each bundle's workers stand, as Ray Train's TorchTrainer numbers its workers
    (WorkerGroup._assign_worker_ranks): bundles grouped by node, the nodes in the order of
    their first bundle, within a node by lowest GPU id (then bundle index); ranks follow that
    order. nodes: each bundle's node id, in bundle order; gpus: each bundle's GPU ids (strings;
    empty without GPUs); per: processes per bundle. Returns, per bundle, (agent rank, node
    rank, first LOCAL_RANK, LOCAL_WORLD_SIZE, the node's GPU ids joined by "," or "") - the
    agent rank is its `--node-rank` (GROUP_RANK); bundle 0 is always agent 0 (its node hosts
    the store) unless another bundle on its node has a lower GPU id, which is then agent 0 on
    the same node."""
    by_node = {}
    for b, n in enumerate(nodes):
        by_node.setdefault(n, []).append(b)
    out = [None] * len(nodes)
    agent = 0
    for node_rank, members in enumerate(by_node.values()):
        members.sort(key=lambda b: _lowest(gpus[b]))
        ids = sorted(set(g for b in members for g in gpus[b]))
        for k, b in enumerate(members):
            out[b] = (agent, node_rank, k * per, len(members) * per, ",".join(ids))
            agent += 1
    return out


def _lowest(ids):
    """Ray Train's sort key of a worker on its node: its lowest GPU id (0 without)."""
    if not ids:
        return 0
    try:
        return min(int(g) for g in ids)
    except ValueError:
        return min(ids)


def _agent_task(index, bundles, per, cpus, argv, log_addr, env, answer_timeout=180.0, payload=None):
    """The task of bundle `index`: one dtrain agent. Returns (its agent rank, exit status, host,
    result, failure); agent rank -1 when the driver refused it. payload: function mode, a pickled
    (function, args, kwargs) (`argv` then names no program): the agent's workers run it
    (_cluster.FUNCTION_RUNNER); result is rank 0's pickled return value when this agent ran rank 0
    and succeeded, failure the job's root cause (`dtrain run --failure-file`'s JSON, bytes) when
    it failed; both None in program mode."""

    def run():
        import shutil
        import tempfile

        import ray

        host = socket.gethostname()
        port = b"-"
        if index == 0:  # the store's port, on this node (agent 0, on this node, hosts the store)
            with socket.socket() as s:
                s.bind(("", 0))
                port = b"%d" % s.getsockname()[1]
        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        hello = b"START %d %s %s" % (index, port, ",".join(gpu_ids).encode() or b"-")
        # The driver answers once every bundle has said hello (up to its placement timeout + 60 s).
        log, answer = _cluster.open_log(log_addr, hello, timeout=answer_timeout)
        words = answer.decode().split()
        if len(words) != 8 or words[0] != "GO":
            log.close()
            return -1, 1, host, None, None
        master, master_port, agent_rank, node_rank, first, local_size, visible = words[1:]
        agent = _cluster.with_agent_flags(argv, ["--nnodes", str(bundles), "--node-rank", agent_rank,
                                                 "--master-addr", master, "--master-port", master_port])
        child_env = dict(os.environ)
        # Ray gives a task OMP_NUM_THREADS = its CPUs, which its processes share: each gets
        # its own part.
        child_env["OMP_NUM_THREADS"] = str(max(1, int(cpus)))
        # The agent is one of the job's nodes on Ray: every agent's output reaches the driver's
        # console, so only node 0's prints the whole failure summary (engine "ray" adopts it).
        # Its workers are numbered on their host as Ray Train's: LOCAL_RANK from `first`,
        # LOCAL_WORLD_SIZE the workers of every bundle on this node, NODE_RANK the node's.
        child_env["DTRAIN_RAY_NODE"] = "%s:%s:%s" % (node_rank, first, local_size)
        if visible != "-":
            # Every GPU of this node's bundles visible to each (Ray Train shares them the same
            # way), so that cuda:LOCAL_RANK is the worker's own.
            child_env["CUDA_VISIBLE_DEVICES"] = visible
        child_env.update(env)
        if payload is None:
            return int(agent_rank), _cluster.run_agent(agent, child_env, log), host, None, None
        # Function mode: the function's file, rank 0's result and the root cause of a failure in
        # a directory of this node; the workers run the function with this task's Python (Ray's).
        work = tempfile.mkdtemp(prefix="dtrain-fn-")
        try:
            func, result = _cluster.function_files(work, payload)
            failure = os.path.join(work, "failure.json")
            agent = (_cluster.with_agent_flags(agent, ["--failure-file", failure]) +
                     _cluster.function_command(sys.executable, func, result, "ray.cloudpickle", record=True))
            rc = _cluster.run_agent(agent, child_env, log)
            return (int(agent_rank), rc, host, _cluster.read_result(result) if rc == 0 else None,
                    _cluster.read_result(failure) if rc != 0 else None)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return run()


def run_on_ray(agent_argv, bundles, per, cpus=1.0, gpus=0.0, strategy="PACK",
               placement_timeout=60.0, env=None, out=None, err=None, cancelled=None,
               term_timeout=5.0, driver_host=None, payload=None, outputs=None):
    """Runs `agent_argv` (a `dtrain run|launch ...` command line) as `bundles` agents of `per`
    processes each on the connected Ray cluster; returns the exit status: 0, the first failing
    agent's, NO_RESOURCES, or 1 (cancelled, or Ray failed). out: the agents' output (bytes);
    err: dtrain's messages (text); cancelled: an Event that ends the job when set. payload:
    function mode (_agent_task's; `agent_argv` names no program); outputs: a dict that gets
    "result", rank 0's pickled return value (from whichever node ran rank 0, through Ray's
    object transport), and "failure", the root cause (--failure-file's JSON) of a failed job."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    out = out or sys.stdout.buffer
    err = err or sys.stderr
    env = env or {}
    if strategy not in STRATEGIES:
        err.write("dtrain.ray: unknown placement strategy '%s': expected one of %s\n" % (strategy, ", ".join(STRATEGIES)))
        return 2
    bundle = _resources(cpus, gpus, per)
    shape = [bundle] * bundles
    nodes = _node_table()
    if not placeable([n[2] for n in nodes], shape, strategy):
        err.write(
            "dtrain.ray: the Ray cluster can never hold this job: it needs %d bundle(s) of {%s} "
            "(%d process(es) each, %s), and its %d alive node(s) have in all: %s. Add nodes, or ask "
            "for less: fewer processes, fewer CPUs/GPUs per process, or another placement strategy\n"
            % (bundles, _describe(bundle), per, strategy, len(nodes),
               "; ".join("%s {%s}" % (n[1], _describe(n[2])) for n in nodes) or "none"))
        return NO_RESOURCES
    pg = placement_group(shape, strategy=strategy, name="dtrain-%d-%d" % (os.getpid(), threading.get_ident()))
    refs = []
    pending = []
    results = {}
    srv = None
    try:
        deadline = time.monotonic() + placement_timeout
        while not pg.wait(0.5):
            if cancelled is not None and cancelled.is_set():
                return 1
            if time.monotonic() > deadline:
                free = _node_table()
                err.write(
                    "dtrain.ray: the placement group of %d bundle(s) of {%s} (%s) was not ready after "
                    "%.0f s: other jobs hold the resources it needs. Free now: %s. Wait for them, "
                    "raise the placement timeout, or ask for less\n"
                    % (bundles, _describe(bundle), strategy, placement_timeout,
                       "; ".join("%s {%s}" % (n[1], _describe(n[3])) for n in free)))
                return NO_RESOURCES
        where = placement_group_table(pg)["bundles_to_node_id"]
        address = {n[0]: n[1] for n in _node_table()}
        master = address.get(where[0])
        if master is None:
            err.write("dtrain.ray: the node of bundle 0 (%s) is not alive any more\n" % where[0])
            return 1
        # Every task says hello (bundle 0's with the store's port, each with its GPU ids); once
        # all have, each learns the master's address and port and where its workers stand
        # (layout()).
        gpu_ids = {}
        port = {}
        answers = {}
        all_in = threading.Event()
        lock = threading.Lock()

        def hello(words):  # START INDEX PORT|- GPU,IDS|-
            if len(words) != 4 or words[0] != b"START" or not words[1].isdigit():
                return None
            i = int(words[1])
            with lock:
                if i >= bundles or i in gpu_ids or (i == 0) == (words[2] == b"-"):
                    return None
                gpu_ids[i] = [] if words[3] == b"-" else words[3].decode().split(",")
                if i == 0:
                    port["port"] = words[2].decode()
                if len(gpu_ids) == bundles:
                    plan = layout([where[b] for b in range(bundles)], [gpu_ids[b] for b in range(bundles)], per)
                    for b, (agent, node, first, size, visible) in enumerate(plan):
                        answers[b] = ("GO %s %s %d %d %d %d %s" % (master, port["port"], agent, node, first,
                                                                    size, visible or "-")).encode()
                    all_in.set()
            if not all_in.wait(placement_timeout + 60):
                return None
            return answers[i]

        srv = _cluster.LogServer(out, hello)
        if driver_host is None:
            driver_host = _driver_host()
        # The tasks run this module's code: ship it (and _cluster) by value, so the nodes need
        # no dtrain Python package.
        ray.cloudpickle.register_pickle_by_value(_cluster)
        if __name__ != "__main__":
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        task = ray.remote(_agent_task)
        # Ray only retries a task whose worker died when asked; never run training twice.
        opts = dict(num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), max_retries=0)
        refs = [task.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                             name="dtrain-agent-%d" % i, **opts)
                .remote(i, bundles, per, cpus, list(agent_argv), (driver_host, srv.port), env,
                        placement_timeout + 90, payload)
                for i in range(bundles)]
        pending = list(refs)
        first_failure = None
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
            for ref in done:
                i = refs.index(ref)
                try:
                    agent, rc, host, result, failure = ray.get(ref)
                except Exception as e:  # the task itself failed: its worker or node died
                    agent, rc, host, result, failure = -1, 1, address.get(where.get(i), "?"), None, None
                    err.write("dtrain.ray: the Ray task of bundle %d (on %s) failed: %s\n" % (i, host, _first_line(e)))
                results[i] = (rc, host, agent)
                if outputs is not None and result is not None:
                    outputs["result"] = result
                if outputs is not None and failure is not None and "failure" not in outputs:
                    outputs["failure"] = failure  # every agent's names the job's one root cause
                if rc != 0 and first_failure is None:
                    first_failure = time.monotonic()
            if cancelled is not None and cancelled.is_set():
                return 1
            # After a failure the other agents stop through the job's failure record; an agent
            # that cannot (it never joined) is stopped here.
            if pending and first_failure is not None and time.monotonic() > first_failure + term_timeout + 5:
                break
        # The first failing agent by node rank (GROUP_RANK); a task without an agent last.
        failed = sorted((agent if agent >= 0 else bundles + i, i, rc, host)
                        for i, (rc, host, agent) in results.items() if rc != 0)
        if failed:
            agent, i, rc, host = failed[0]
            who = "node %d" % agent if agent < bundles else "the task of bundle %d" % i
            err.write("dtrain.ray: %s (Ray task on %s) exited with code %d\n" % (who, host, rc))
            return rc if rc > 0 else 128 - rc
        if len(results) < bundles:
            return 1
        return 0
    finally:
        if srv is not None:
            # The finished tasks' last lines first (Ray can say a task finished before its
            # output is read here); the unfinished tasks' connections cut at once.
            srv.close(drain={b"%d" % i for i in results})
        _finish(pending, term_timeout + 5)
        try:
            remove_placement_group(pg)
        except Exception:
            pass


def _finish(refs, grace):
    """Waits up to `grace` seconds for unfinished tasks (their log connection is closed: each
    stops its agent, which stops its workers), then cancels those left by killing their
    workers. Only unfinished ones: force-cancelling a task that is completing trips an
    assertion in Ray 2.60's task manager, which aborts the driver. (Ray's gentle cancel, a
    KeyboardInterrupt, does not reach a task blocked reading its agent's output.)"""
    import ray

    if not refs:
        return
    try:
        _, refs = ray.wait(refs, num_returns=len(refs), timeout=grace)
    except Exception:
        pass
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:
            pass


def _driver_host():
    """The address the nodes reach this driver at: through Ray Client (ray://HOST:PORT), the
    local address that routes to HOST; else this Ray node's address."""
    import ray

    if _connected_to.startswith("ray://"):
        host = _connected_to[len("ray://"):].split("/")[0].rsplit(":", 1)[0].strip("[]")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # UDP: nothing is sent
            return s.getsockname()[0]
    return ray.util.get_node_ip_address()


def _first_line(e):
    lines = [l for l in str(e).splitlines() if l.strip()]
    return lines[-1] if lines else type(e).__name__


def capacity(per_process):
    """{total_slots, free_slots, nodes}: processes of `per_process` resources the alive nodes
    hold, and of them now free."""
    nodes = _node_table()
    return {"total_slots": slots([n[2] for n in nodes], per_process),
            "free_slots": slots([n[3] for n in nodes], per_process), "nodes": len(nodes)}


_connected_to = ""


def connect(address):
    global _connected_to
    try:
        import ray
    except ImportError as e:
        sys.stderr.write("dtrain: --ray-address needs Ray in the Python that runs dtrain's Ray driver "
                         "(%s: %s); install it there (pip install 'ray[default]'), or set "
                         "DTRAIN_RAY_PYTHON to a Python that has it\n" % (sys.executable, e))
        sys.exit(2)

    _connected_to = address
    # Ray Client's proxy starts one server process per client and can lose the race with a
    # server that dies at once ("Initialization failure from server"; Ray 2.60's proxier reads
    # the command line of a process that is already a zombie). A new connection gets a new
    # server: two more tries, a second apart, then the error.
    for attempt in range(3):
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                     configure_logging=False)
            return
        except ConnectionAbortedError as e:
            if not str(address).startswith("ray://") or attempt == 2:
                raise
            print(f"dtrain.ray: Ray Client at {address} failed to start a server for this "
                  f"client ({_first_line(e)}); connecting again", file=sys.stderr, flush=True)
            ray.shutdown()
            time.sleep(1.0)


class WorkerError(RuntimeError):
    """A function-mode job failed in a worker (or its agent): the job's root cause, as `dtrain
    run --failure-file` records it (`failure`, its JSON as a dict). Attributes: rank (-1: the
    agent itself failed), host, node_rank, exit_code, signal (0: none), error ("ValueError: ...":
    what the function raised; "" when it did not raise: a crash, an exit), traceback (the
    worker's Python traceback, or ""), stderr_tail (its last lines of stderr)."""

    def __init__(self, failure):
        self.failure = dict(failure)
        self.rank = int(failure.get("rank", -1))
        self.host = failure.get("host", "")
        self.node_rank = int(failure.get("node_rank", 0))
        self.exit_code = int(failure.get("exit_code", 1))
        self.signal = int(failure.get("signal", 0))
        self.error, self.traceback = _recorded_error(failure.get("error_file_contents", ""))
        self.stderr_tail = list(failure.get("stderr_tail", []))
        super().__init__(self._describe(failure.get("reason", "")))

    def __reduce__(self):  # pickled (a Ray task or a Tune trial that raises it): rebuilt from the record
        return WorkerError, (self.failure,)

    def _describe(self, reason):
        import signal

        where = "host %s, node %d" % (self.host or "?", self.node_rank)
        if self.rank >= 0:
            who = "rank %d (%s)" % (self.rank, where)
            if self.error:
                what = "raised %s" % self.error
            elif self.signal:
                try:
                    name = signal.Signals(self.signal).name
                except ValueError:
                    name = "signal %d" % self.signal
                what = "died of %s (signal %d, exit code %d)" % (name, self.signal, self.exit_code)
            else:
                what = "exited with code %d without raising" % self.exit_code
        else:
            who = "the dtrain agent (%s)" % where
            what = "failed, exit code %d" % self.exit_code
        if reason:
            what += ": %s" % reason
        text = "dtrain.ray: the function failed on %s: %s" % (who, what)
        if self.traceback:
            text += "\nThe worker's traceback:\n" + self.traceback.rstrip("\n")
        elif self.stderr_tail:
            text += "\nThe last lines of its stderr:\n" + "\n".join(self.stderr_tail)
        return text


def _recorded_error(contents):
    """(message, traceback) of a TORCHELASTIC_ERROR_FILE as PyTorch's @record (and
    _cluster.FUNCTION_RUNNER) writes it; ("", "") when there is none."""
    import json

    if not contents:
        return "", ""
    try:
        m = json.loads(contents)["message"]
        if isinstance(m, str):
            return m, ""
        return str(m["message"]), str(m.get("extraInfo", {}).get("py_callstack", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return contents.strip(), ""


def _failure_record(data):
    """`dtrain run --failure-file`'s JSON (bytes) as a dict; None without one (or a torn one)."""
    import json

    try:
        f = json.loads(data) if data else None
    except ValueError:
        return None
    return f if isinstance(f, dict) else None


class Distributor:
    """TorchTrainer's placement for dtrain programs and Python functions.

    Distributor(num_processes, local_mode, use_gpu, ...).run(program, *args) -> exit status.
    Distributor(...).run(function, *args, **kwargs) -> rank 0's return value (function mode,
    as PySpark's TorchDistributor and dtrain.spark's: the function and its arguments are
    pickled with Ray's cloudpickle, every process calls it with torchrun's environment - RANK,
    WORLD_SIZE, MASTER_ADDR, ... - and the value rank 0 returns comes back, from whichever node
    ran it; a failure raises WorkerError naming the rank, its host and what it raised).
    local_mode=True runs `dtrain run --nproc-per-node N` here; False runs on the Ray cluster
    this process is connected to (ray.init() already called), else on `address` (default
    RAY_ADDRESS): num_processes / processes_per_bundle bundles of processes_per_bundle
    processes, num_cpus_per_process and num_gpus_per_process each (default 1 with use_gpu),
    placed with `strategy`, one dtrain agent per bundle."""

    def __init__(self, num_processes=1, local_mode=True, use_gpu=False, address=None,
                 processes_per_bundle=1, strategy="PACK", num_cpus_per_process=1.0,
                 num_gpus_per_process=None, dtrain="dtrain", placement_timeout=60.0, env=None):
        if num_processes < 1 or processes_per_bundle < 1 or num_processes % processes_per_bundle:
            raise ValueError("num_processes (%d) must be a multiple of processes_per_bundle (%d), both >= 1"
                             % (num_processes, processes_per_bundle))
        if strategy not in STRATEGIES:
            raise ValueError("strategy must be one of %s, got %r" % (", ".join(STRATEGIES), strategy))
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.address = address
        self.per = processes_per_bundle
        self.strategy = strategy
        self.cpus = float(num_cpus_per_process)
        self.gpus = float(num_gpus_per_process if num_gpus_per_process is not None else (1 if use_gpu else 0))
        self.dtrain = dtrain
        self.placement_timeout = placement_timeout
        self.env = dict(env or {})

    def run(self, train_object, *args, **kwargs):
        """A program (its path: a C++ binary, a .py, anything `dtrain run` runs) with string
        arguments -> its exit status (0, or the failing rank's); a function -> rank 0's return
        value (raises WorkerError when a worker fails, RuntimeError when the job does not start
        or rank 0 returns no value that can be read here)."""
        import subprocess

        import ray

        if callable(train_object) and not isinstance(train_object, (str, bytes, os.PathLike)):
            return self._run_function(train_object, args, kwargs)
        if kwargs:
            raise TypeError("run(program, *args) gives a program its arguments as strings, not as "
                            "keywords (got %s): pass them in args, e.g. run(program, '--lr', '0.001'); "
                            "keyword arguments are for a function" % ", ".join(sorted(kwargs)))
        program = train_object
        args = [str(a) for a in args]
        if self.local_mode:
            return subprocess.call([self.dtrain, "run", "--nproc-per-node", str(self.num_processes),
                                    program] + args, env={**os.environ, **self.env})
        if not ray.is_initialized():
            connect(self.address or os.environ.get("RAY_ADDRESS") or "auto")
        argv = [self.dtrain, "run", "--nproc-per-node", str(self.per), program] + args
        return run_on_ray(argv, self.num_processes // self.per, self.per, self.cpus, self.gpus,
                          self.strategy, self.placement_timeout, env=self.env)

    def _run_function(self, fn, args, kwargs):
        """Function mode: rank 0's return value, or an exception saying why there is none."""
        import tempfile

        import ray

        pickler = ray.cloudpickle
        try:
            payload = pickler.dumps((fn, args, kwargs))
        except Exception as e:
            raise TypeError("run(function, ...): the function or its arguments cannot be pickled to "
                            "reach the workers (%s: %s): pass plain data as arguments, and create "
                            "what cannot be pickled (locks, open files, sockets) inside the function"
                            % (type(e).__name__, e)) from e
        out = _cluster.OutputTail()
        said = _cluster.Said()
        if self.local_mode:
            work = tempfile.mkdtemp(prefix="dtrain-fn-")
            try:
                func, result = _cluster.function_files(work, payload)
                failure = os.path.join(work, "failure.json")
                argv = ([self.dtrain, "run", "--nproc-per-node", str(self.num_processes), "--failure-file", failure]
                        + _cluster.function_command(sys.executable, func, result, "ray.cloudpickle", record=True))
                rc = _cluster.run_local(argv, {**os.environ, **self.env}, out)
                outputs = {"result": _cluster.read_result(result) if rc == 0 else None,
                           "failure": _cluster.read_result(failure) if rc != 0 else None}
            finally:
                _cluster.remove_private_dir(work)
        else:
            if not ray.is_initialized():
                connect(self.address or os.environ.get("RAY_ADDRESS") or "auto")
            argv = [self.dtrain, "run", "--nproc-per-node", str(self.per)]
            outputs = {}
            rc = run_on_ray(argv, self.num_processes // self.per, self.per, self.cpus, self.gpus,
                            self.strategy, self.placement_timeout, env=self.env, out=out, err=said,
                            payload=payload, outputs=outputs)
        if rc != 0:
            failure = _failure_record(outputs.get("failure"))
            if failure is not None:
                raise WorkerError(failure)
            raise RuntimeError("dtrain.ray: the function's job failed with exit status %d before any worker "
                               "reported a cause.%s The last lines of its output (all of it went to this "
                               "console):\n%s" % (rc, (" " + said.text.strip()) if said.text.strip() else "",
                                                  out.text()))
        data = outputs.get("result")
        if data is None:
            raise RuntimeError("dtrain.ray: every process ended with exit status 0, but rank 0 did not return "
                               "from the function, so there is no value to give back (did rank 0 call "
                               "sys.exit() or os._exit()?). Return from the function instead")
        try:
            return pickler.loads(data)
        except Exception as e:
            raise RuntimeError("dtrain.ray: rank 0's return value came back (%d bytes) but cannot be "
                               "unpickled here (%s: %s): return plain data (numbers, strings, lists, "
                               "dicts, tensors), or make the modules and classes it uses importable "
                               "in this Python" % (len(data), type(e).__name__, e)) from e


# ---- the driver service (dtrain/_cluster.py): one ray.init() for many jobs ------------------

def serve(sock_path, parent_pid, address, idle_timeout=600.0):
    import ray

    connect(address)

    def run_job(req, n, out, err, gone):
        return run_on_ray([str(a) for a in req["argv"]], int(req["bundles"]), int(req["per"]),
                          float(req.get("cpus", 1)), float(req.get("gpus", 0)), req.get("strategy", "PACK"),
                          float(req.get("placement_timeout", 60)), out=out, err=err, cancelled=gone,
                          term_timeout=float(req.get("term_timeout", 5)), driver_host=req.get("driver_host"))

    def query(req):
        return capacity(_resources(float(req.get("cpus", 1)), float(req.get("gpus", 0)), 1))

    _cluster.serve(sock_path, parent_pid, idle_timeout, "ray", address,
                   "the Ray driver connected to " + address, run_job, query=query, on_stop=ray.shutdown)


USAGE = ("usage: ray.py (--address ADDR | --client SOCKET) --bundles B --per-bundle P [--cpus C] [--gpus G]\n"
         "              [--strategy S] [--placement-timeout S] [--term-timeout S] [--driver-host H] -- dtrain run|launch ...\n"
         "       ray.py --serve SOCKET --parent-pid PID --address ADDR [--idle-timeout S]\n")


def main(argv):
    if argv[:1] == ["--serve"] and len(argv) > 1:
        opts = dict(zip(argv[2::2], argv[3::2]))
        if "--parent-pid" not in opts or "--address" not in opts:
            sys.stderr.write(USAGE)
            return 2
        return serve(argv[1], int(opts["--parent-pid"]), opts["--address"], float(opts.get("--idle-timeout", 600)))
    if "--" not in argv:
        sys.stderr.write(USAGE)
        return 2
    cut = argv.index("--")
    opts, agent = argv[:cut], argv[cut + 1:]
    names = {"--address": str, "--client": str, "--bundles": int, "--per-bundle": int, "--cpus": float,
             "--gpus": float, "--strategy": str, "--placement-timeout": float, "--term-timeout": float,
             "--driver-host": str}
    o = {}
    if len(opts) % 2:
        sys.stderr.write(USAGE)
        return 2
    for k, v in zip(opts[::2], opts[1::2]):
        if k not in names:
            sys.stderr.write("dtrain.ray: unknown option %s\n%s" % (k, USAGE))
            return 2
        try:
            o[k] = names[k](v)
        except ValueError:
            sys.stderr.write("dtrain.ray: %s needs a number, got '%s'\n" % (k, v))
            return 2
    if o.get("--bundles", 0) < 1 or o.get("--per-bundle", 0) < 1 or not _cluster.is_agent_command(agent) or \
            ("--address" in o) == ("--client" in o):
        sys.stderr.write(USAGE)
        return 2
    req = {"bundles": o["--bundles"], "per": o["--per-bundle"], "cpus": o.get("--cpus", 1.0),
           "gpus": o.get("--gpus", 0.0), "strategy": o.get("--strategy", "PACK"),
           "placement_timeout": o.get("--placement-timeout", 60.0), "term_timeout": o.get("--term-timeout", 5.0),
           "driver_host": o.get("--driver-host"), "argv": agent}
    if "--client" in o:
        return _cluster.client(o["--client"], req, "ray")
    import signal

    connect(o["--address"])
    # SIGTERM (the Distributor's timeout, a killed parent) or SIGINT ends the job the way a
    # client going away does: the agents stopped, the placement group removed; then 128 + N.
    # Installed after ray.init, whose own SIGTERM handler aborts the process.
    stopped = threading.Event()
    got = []

    def on_signal(signum, _frame):
        got.append(signum)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rc = run_on_ray(agent, req["bundles"], req["per"], req["cpus"], req["gpus"], req["strategy"],
                    req["placement_timeout"], cancelled=stopped, term_timeout=req["term_timeout"],
                    driver_host=req["driver_host"])
    return 128 + got[0] if got else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
