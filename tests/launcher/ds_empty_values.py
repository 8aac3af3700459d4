"""What DeepSpeed's `deepspeed` launcher does with `--FLAG=` (argparse's empty string), flag by
flag, for deepspeed_launcher_test (DeepSpeedLauncher.EmptyFlagValuesAsDeepSpeedTakesThem).

    python ds_empty_values.py WORKER ARG...

For each option string of DeepSpeed's runner (deepspeed/launcher/runner.py, the venv's), runs its
own main() with `FLAG= --num_gpus 2 --no_python WORKER ARG...` in this process, deepspeed's
launch.py main() included, with subprocess.Popen replaced by a recorder: no worker starts, and
what each would have run is recorded. One line per flag on stdout:

    empty FLAG {"ok": [{"argv": [...], "env": {...}}, ...]}   (each worker, rank order)
    empty FLAG {"error": "MESSAGE"}                           (where DeepSpeed stops)

(deepspeed's own log lines go to stdout too; the test reads the lines that start with "empty ").
Single node only: the flags that matter across nodes alone (--launcher, --launcher_args, --venv_script,
--ssh_port) are run as on one node, where DeepSpeed does not read them.
"""
import argparse
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

# The runner's parser: parse_args builds it on each call; its option strings come from a call
# that records the parser it made.
flags = []

parsers = []
original_init = argparse.ArgumentParser.__init__


def recording_init(self, *a, **k):
    original_init(self, *a, **k)
    parsers.append(self)


argparse.ArgumentParser.__init__ = recording_init
runner.parse_args(["x"])
argparse.ArgumentParser.__init__ = original_init
for action in parsers[0]._actions:
    for opt in action.option_strings:
        if opt not in ("-h", "--help"):
            flags.append(opt)

tail = ["--num_gpus", "2", "--no_python"] + sys.argv[1:]
for flag in flags:
    workers.clear()
    err = io.StringIO()
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    try:
        with contextlib.redirect_stderr(err):
            runner.main([flag + "="] + tail)
        result = {"ok": workers[:]}
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines()
        result = {"error": lines[-1] if lines else "exit %s" % e.code}
    except Exception as e:  # what DeepSpeed raises (a traceback under the real launcher)
        result = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    print("empty " + flag + " " + json.dumps(result), flush=True)
