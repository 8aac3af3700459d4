"""What dtrain's Spark and Ray drivers (dtrain/spark.py, dtrain/ray.py) share.

The node side of a job: a task of the cluster's own scheduler runs one dtrain agent
(run_agent), its output sent line by line over a socket to the driver (LogServer), which
prints it; the socket closing (the driver died) stops the agent, and the task's own death stops
it too (PR_SET_PDEATHSIG).

The driver service (serve, client): as a notebook keeps its SparkSession or its ray.init()
between jobs, a C++ program keeps one driver process between Distributor::run() calls.
`... --serve SOCKET --parent-pid PID [--idle-timeout S]` connects to the cluster once and
serves jobs on the Unix socket SOCKET. The process that started it (PID) keeps a control
connection open ("CONTROL\\n", answered "READY ID\\n"); when that closes (the program exited,
however it exited), when PID is gone, or after S seconds without a job, the service cancels
what runs, disconnects and exits. A job is a client (a plain Python, no pyspark or ray) that
sends "JOB {json}\\n" and relays the frames it gets back (a kind byte, a 4-byte big-endian
length, the data): O the agents' output (to stdout), E dtrain's messages (to stderr), X the
exit status. The client going away (its run() timed out, its program was killed) cancels the
job. "QUERY {json}\\n" is answered with one JSON line (the cluster's free slots: Ray's, Spark's).

Everything a cluster task runs is in this module, which the drivers ship by value
(cloudpickle), so the nodes need no dtrain Python package.
"""

import collections
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time


# ---- the node side --------------------------------------------------------------------------

def die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop(proc, grace=5.0):
    """SIGTERM to the process group of `proc`, SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def is_agent_command(argv):
    """Whether `argv` is `DTRAIN run ...` or `DTRAIN launch ...`, an agent's command line."""
    return len(argv) >= 2 and argv[1] in ("run", "launch")


def with_agent_flags(argv, flags):
    """`DTRAIN run|launch ...` with `flags` right after the command word (the agent's
    --nnodes, --node-rank, --master-addr, --master-port); `dtrain launch` stays launch, its
    --local-rank=N being the agent's to add."""
    if not is_agent_command(argv):
        raise ValueError("not a `dtrain run` or `dtrain launch` command: %r" % (argv,))
    return argv[:2] + list(flags) + argv[2:]


def run_agent(argv, env, log):
    """Runs the agent `argv` in its own session, its merged output sent to the connected
    socket `log`; stops it when `log` closes. Returns its exit status (negative: a signal).
    The calling thread must live until it returns (PR_SET_PDEATHSIG follows the thread)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            preexec_fn=die_with_parent)
    log.settimeout(None)

    def watch():  # the driver closing its end (it was killed) stops the agent
        try:
            while log.recv(1):
                pass
        except OSError:
            pass
        stop(proc)

    threading.Thread(target=watch, daemon=True).start()
    try:
        for line in proc.stdout:
            try:
                log.sendall(line)
            except OSError:
                stop(proc)
        return proc.wait()
    finally:
        stop(proc)
        # shutdown, not only close: the watcher blocked in recv holds the socket, so a close
        # alone sends no FIN and the driver never sees this log end (it waits for that end
        # before it prints its last lines; the task's worker process outlives the task).
        try:
            log.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            log.close()
        except OSError:
            pass


def open_log(addr, hello, timeout=60.0):
    """Connects to the driver's LogServer, says `hello` (one line, bytes), returns (socket, the
    answer line without its newline)."""
    log = socket.create_connection(addr, timeout=timeout)
    log.sendall(hello.rstrip(b"\n") + b"\n")
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = log.recv(1)
        if not chunk:
            break
        answer += chunk
    return log, answer.rstrip(b"\n")


class LogServer:
    """A socket on the driver that the tasks send their agents' output to; written to `out`
    (bytes) as it comes. Each connection opens with one line; hello(words) returns the answer
    line (bytes; it may block, each connection has its own thread), or None to refuse it (the
    task gets "NO"). A connection's key is the second word of its hello (the task's index in
    "START i ...").

    A task's last lines can still be on their way (in this socket's buffers, or not yet read
    by its thread) when the cluster already says the task finished: close(drain=...) reads the
    finished tasks' connections to their end (the task shuts its end down after its agent's
    last line) before it cuts the others."""

    def __init__(self, out, hello, host=""):
        self.out = out
        self.hello = hello
        self.srv = socket.socket()
        self.srv.bind((host, 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self.conns = []  # [(socket, its thread, {"key": bytes or None})]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            info = {"key": None}
            t = threading.Thread(target=self._serve, args=(conn, info), daemon=True)
            with self.lock:
                self.conns.append((conn, t, info))
            t.start()

    def _serve(self, conn, info):
        with conn:
            try:
                f = conn.makefile("rb")
                words = f.readline().split()
                info["key"] = words[1] if len(words) > 1 else None
                answer = self.hello(words)
                conn.sendall((answer if answer is not None else b"NO") + b"\n")
                if answer is None:
                    return
                for line in f:
                    self.out.write(line)
                    self.out.flush()
            except OSError:
                pass

    def close(self, drain=(), timeout=10.0):
        """Stops accepting; cuts the connections of tasks not in `drain` (keys, bytes; True:
        every connection) at once, which stops their agents; reads those in `drain` to their
        end, waiting at most `timeout` seconds in all, then cuts what is left."""
        self.srv.close()
        with self.lock:
            conns = list(self.conns)
        keep = [(c, t) for c, t, info in conns if drain is True or info["key"] in drain]
        for c, _, info in conns:
            if not (drain is True or info["key"] in drain):
                _cut(c)
        deadline = time.monotonic() + timeout
        for c, t in keep:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                _cut(c)


def _cut(conn):
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# ---- function mode: a pickled Python function run by every worker ---------------------------
#
# TorchDistributor's function mode, as dtrain runs it: the driver pickles (function, args,
# kwargs) with cloudpickle (PySpark's own copy when there is one; dtrain.ray: Ray's); each
# worker process runs FUNCTION_RUNNER (function_command(): `python -c FUNCTION_RUNNER FUNC
# RESULT [--pickler MODULE] [--record]`), which unpickles and calls the function; the process of
# RANK 0 pickles the return value to RESULT (written aside, then renamed, so a reader never sees
# half a file). Only rank 0 writes it: TorchDistributor lets every process of a local run write
# the same file, and the last to finish wins.
#   --pickler MODULE  the cloudpickle to pickle the result with (`ray.cloudpickle`: the one
#                     the driver unpickles with), instead of PySpark's, else the package
#   --record          an exception in the function (or in pickling rank 0's result) is also
#                     written to TORCHELASTIC_ERROR_FILE as PyTorch's @record writes it, so that
#                     `dtrain run`'s root cause (--failure-file) carries its type, message and
#                     traceback

FUNCTION_RUNNER = """
import os, sys
func, result, opts = sys.argv[1], sys.argv[2], sys.argv[3:]
if "--pickler" in opts:
    import importlib
    cloudpickle = importlib.import_module(opts[opts.index("--pickler") + 1])
else:
    try:
        from pyspark import cloudpickle
    except ImportError:
        import cloudpickle
try:
    with open(func, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    value = fn(*args, **kwargs)
    if os.environ.get("RANK", "0") == "0":
        try:
            data = cloudpickle.dumps(value)
        except Exception as e:
            if "--record" not in opts:
                raise
            raise TypeError("rank 0's return value, a %s, cannot be pickled to go back to the "
                            "driver (%s: %s): return plain data (numbers, strings, lists, dicts, "
                            "tensors)" % (type(value).__name__, type(e).__name__, e)) from e
        with open(result + ".part", "wb") as f:
            f.write(data)
        os.replace(result + ".part", result)
except Exception as e:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if "--record" in opts and path:
        import json, time, traceback
        with open(path, "w") as f:
            json.dump({"message": {"message": "%s: %s" % (type(e).__name__, e),
                                   "extraInfo": {"py_callstack": traceback.format_exc(),
                                                 "timestamp": str(int(time.time()))}}}, f)
    raise
"""


def function_command(python, func, result, pickler=None, record=False):
    """The worker's command line of function mode: `python` runs FUNCTION_RUNNER on the pickled
    function `func`, rank 0 writing its result to `result` (function_files())."""
    argv = [python, "-c", FUNCTION_RUNNER, func, result]
    if pickler:
        argv += ["--pickler", pickler]
    if record:
        argv.append("--record")
    return argv


def cloudpickle_module():
    """PySpark's cloudpickle when PySpark is installed (what its executors unpickle with), else
    the cloudpickle package; ImportError naming both when neither is."""
    try:
        from pyspark import cloudpickle
    except ImportError:
        try:
            import cloudpickle
        except ImportError:
            raise ImportError("function mode pickles the function with cloudpickle: install "
                              "pyspark (which bundles it) or cloudpickle") from None
    return cloudpickle


def function_files(directory, payload):
    """Writes the pickled function `payload` (bytes) into `directory`; returns the paths of that
    file and of the result file rank 0 writes (FUNCTION_RUNNER's two arguments)."""
    func = os.path.join(directory, "function.pickle")
    with open(func, "wb") as f:
        f.write(payload)
    return func, os.path.join(directory, "result.pickle")


def read_result(path):
    """The pickled result rank 0 wrote (bytes), or None when it wrote none."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


class OutputTail:
    """A writer of the agents' output (bytes, whole lines, from several threads) that prints
    it on this process's console (sys.stdout: a notebook's cell output too) and keeps its last
    `lines` lines for an error message."""

    def __init__(self, lines=100):
        self.tail = collections.deque(maxlen=lines)
        self.lock = threading.Lock()

    def write(self, data):
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        with self.lock:
            self.tail.extend(text.splitlines(keepends=True))
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except (OSError, ValueError):
                pass  # a closed console: the tail still says it
        return len(data)

    def flush(self):
        pass

    def text(self):
        with self.lock:
            return "".join(self.tail)


class Said:
    """A driver's own messages of one run (text): written to stderr as they come, and kept
    (.text) for the error that run raises."""

    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text
        sys.stderr.write(text)
        sys.stderr.flush()

    def flush(self):
        pass


def run_local(argv, env, out):
    """Runs `argv` here in its own session, its merged output written to `out` line by line;
    returns its exit status (negative: a signal). However this returns (an exception, a
    KeyboardInterrupt: a notebook's interrupt reaches only this process), the command and its
    process group are stopped."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        for line in proc.stdout:
            out.write(line)
        return proc.wait()
    finally:
        stop(proc)
        proc.stdout.close()


# ---- the driver service ---------------------------------------------------------------------

def _frame(kind, data):
    return kind + struct.pack(">I", len(data)) + data


class FrameWriter:
    """A file-like writer that sends what is written as frames of one kind (bytes or text)."""

    def __init__(self, conn, lock, kind):
        self.conn, self.lock, self.kind = conn, lock, kind

    def write(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8", "replace")
        with self.lock:
            try:
                self.conn.sendall(_frame(self.kind, data))
            except OSError:
                pass  # the client is gone: the watcher cancels the job
        return len(data)

    def flush(self):
        pass


def remove_private_dir(path):
    """Removes `path` when it is one of dtrain's private temporary directories of this user."""
    try:
        if os.path.basename(path).startswith("dtrain-") and os.stat(path).st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def serve(sock_path, parent_pid, idle_timeout, name, ready_id, describe, run_job, query=None,
          cancel=None, one_at_a_time=False, on_stop=None):
    """Serves jobs on `sock_path` until the control connection closes, `parent_pid` is gone or
    `idle_timeout` seconds pass without a job; then calls on_stop() and exits the process.
    run_job(request, n, out, err, gone) -> exit status runs job n (gone: an Event set when its
    client went away, after cancel(n) is called); query(request) -> a JSON-able answer.
    describe: what a job runs in ("Spark application app-..."), said at each job's start."""
    born = time.monotonic()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    srv.settimeout(1.0)
    stop_ev = threading.Event()
    job_lock = threading.Lock()
    state = {"last": time.monotonic(), "jobs": 0, "running": 0, "control": False}
    state_lock = threading.Lock()
    controls = []

    def control(conn):
        state["control"] = True
        controls.append(conn)
        try:
            conn.sendall(b"READY %s\n" % ready_id.encode())
            while conn.recv(4096):
                pass
        except OSError:
            pass
        stop_ev.set()

    def job(conn, request):
        wlock = threading.Lock()
        err = FrameWriter(conn, wlock, b"E")
        try:
            req = json.loads(request)
        except ValueError as e:
            err.write("dtrain.%s: a malformed job request: %s\n" % (name, e))
            conn.sendall(_frame(b"X", b"2"))
            return
        with state_lock:
            state["jobs"] += 1
            state["running"] += 1
            n = state["jobs"]
        gone = threading.Event()

        def watch():  # the client going away cancels the job
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            gone.set()
            if cancel is not None:
                try:
                    cancel(n)
                except Exception:
                    pass

        rc = 1
        try:
            with job_lock if one_at_a_time else _nothing():
                err.write("dtrain.%s: job %d of %s (up %.1f s)\n" % (name, n, describe, time.monotonic() - born))
                threading.Thread(target=watch, daemon=True).start()
                try:
                    rc = run_job(req, n, FrameWriter(conn, wlock, b"O"), err, gone)
                except Exception as e:  # never leave the client without a status
                    err.write("dtrain.%s: the job failed in the driver: %r\n" % (name, e))
                    rc = 1
        finally:
            with state_lock:
                state["running"] -= 1
                state["last"] = time.monotonic()
        with wlock:
            try:
                conn.sendall(_frame(b"X", str(rc).encode()))
            except OSError:
                pass

    def answer(conn, request):
        try:
            reply = query(json.loads(request)) if query is not None else {"error": "no queries"}
        except Exception as e:
            reply = {"error": "%s: %s" % (type(e).__name__, e)}
        conn.sendall(json.dumps(reply).encode() + b"\n")

    def handle(conn):
        try:
            f = conn.makefile("rb")
            line = f.readline().rstrip(b"\n")
            if line == b"CONTROL":
                control(conn)
            elif line.startswith(b"JOB "):
                job(conn, line[4:])
            elif line.startswith(b"QUERY "):
                answer(conn, line[6:])
        except OSError:
            pass
        finally:
            conn.close()

    def watch_parent():
        try:
            fd = os.pidfd_open(parent_pid)
        except (AttributeError, OSError):
            fd = None
        while not stop_ev.is_set():
            if fd is not None:
                if select.select([fd], [], [], 1.0)[0]:
                    state["parent_exited"] = True  # (it may be a zombie for a while)
                    break
            else:
                try:
                    os.kill(parent_pid, 0)
                except ProcessLookupError:
                    state["parent_exited"] = True
                    break
                time.sleep(1.0)
        stop_ev.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    try:
        while not stop_ev.is_set():
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                with state_lock:
                    idle = time.monotonic() - state["last"] if state["running"] == 0 else 0.0
                if idle > idle_timeout:
                    sys.stderr.write("dtrain.%s: %s idle for %.0f s: stopping it\n" % (name, describe, idle))
                    break
                if not state["control"] and time.monotonic() - born > 60:
                    break  # the program that started it never connected
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    finally:
        srv.close()
        try:
            os.unlink(sock_path)
        except OSError:
            pass
        if state.get("parent_exited"):
            # The program was killed, so it never removes the socket's private directory
            # (/tmp/dtrain-<engine>-<pid>-XXXXXX, which only it and this service use): do it.
            remove_private_dir(os.path.dirname(os.path.abspath(sock_path)))
        # First tell the program (its next run() starts a new driver), then stop.
        for c in controls:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if on_stop is not None:
            t = threading.Thread(target=on_stop, daemon=True)
            t.start()
            t.join(20)
        os._exit(0)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _connect(sock_path, name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock_path)
    except OSError as e:
        sys.stderr.write("dtrain.%s: cannot reach the driver service at %s (%s): it has stopped; "
                         "run the job again to start a new one\n" % (name, sock_path, e))
        return None
    return s


def client(sock_path, request, name):
    """Sends one job to the service and relays its frames; returns its exit status."""
    s = _connect(sock_path, name)
    if s is None:
        return 1
    s.sendall(b"JOB " + json.dumps(request).encode() + b"\n")
    f = s.makefile("rb")
    while True:
        head = f.read(5)
        if len(head) < 5:
            sys.stderr.write("dtrain.%s: the driver service went away during the job\n" % name)
            return 1
        kind, n = head[:1], struct.unpack(">I", head[1:])[0]
        data = f.read(n)
        if kind == b"O":
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        elif kind == b"E":
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()
        elif kind == b"X":
            return int(data)

