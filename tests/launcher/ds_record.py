"""DeepSpeed's `deepspeed` launcher run in this process with subprocess.Popen replaced by a
recorder, for deepspeed_launcher_test: its runner's main() and launch.py's main() (the venv's
deepspeed) run as they would, but no worker starts; what each would have run is recorded.

    python ds_record.py ARG...     (the launcher's arguments: one JSON line on stdout)

prints `record {"ok": [{"argv": [...], "env": {...}}, ...]}` (each worker, in start order) or
`record {"error": "MESSAGE"}` where DeepSpeed stops. ds_empty_values.py imports `record`.
(deepspeed's own log lines go to stdout too; the test reads the line that starts with "record ".)
Single node only.
"""
import contextlib
import io
import json
import os
import signal
import subprocess
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from deepspeed.launcher import launch, runner  # noqa: E402

workers = []


class Recorded:
    """A process that ran at once and exited 0."""

    pid = 0
    returncode = 0

    def wait(self, timeout=None):
        return 0

    def poll(self):
        return 0

    def send_signal(self, sig):
        pass


real_popen = subprocess.Popen
in_launch = []  # non-empty while launch.py's main runs


def popen(cmd, *args, **kwargs):
    """subprocess.Popen for the runner and launch.py (one module for both, and for what the
    accelerator runs: that really runs)."""
    env = kwargs.get("env")
    if in_launch and env is not None:  # a worker
        workers.append({"argv": list(cmd), "env": dict(env)})
        return Recorded()
    if isinstance(cmd, list) and cmd[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]:
        # The runner starts `python -u -m deepspeed.launcher.launch ARGS`: its main, here.
        saved_argv, saved_env = sys.argv, dict(os.environ)
        sys.argv = ["launch.py"] + list(cmd[4:])
        os.environ.clear()
        os.environ.update(env or saved_env)
        in_launch.append(True)
        try:
            launch.main()
        finally:
            in_launch.clear()
            sys.argv = saved_argv
            os.environ.clear()
            os.environ.update(saved_env)
        return Recorded()
    return real_popen(cmd, *args, **kwargs)


subprocess.Popen = popen
launch.time.sleep = lambda s: None  # launch.py polls its workers once a second


def record(argv):
    """runner.main(argv): {"ok": [workers]} or {"error": the message DeepSpeed stops with}."""
    workers.clear()
    err = io.StringIO()
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    try:
        with contextlib.redirect_stderr(err):
            runner.main(argv)
        return {"ok": workers[:]}
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines()
        return {"error": lines[-1] if lines else "exit %s" % e.code}
    except Exception as e:  # what DeepSpeed raises (a traceback under the real launcher)
        return {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])


if __name__ == "__main__":
    print("record " + json.dumps(record(sys.argv[1:])), flush=True)
