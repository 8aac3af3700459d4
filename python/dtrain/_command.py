"""The `dtrain` command of the pip wheel: the native launcher installed inside the package
(bin/dtrain, libtorch-free), run in place of this Python process."""

import os
import sys


def executable():
    """Path of the native `dtrain` command inside this installation."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dtrain")


def exec_dtrain(args):
    """Replaces this process with `dtrain ARGS...`; exits 1 with a message when it is missing."""
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(
            "dtrain: the native dtrain command is not in this installation (expected at %s);\n"
            "dtrain: it comes with the pip wheel (pip install dtrain), or use the dtrain of a\n"
            "dtrain: build or Debian package directly\n" % exe)
        sys.exit(1)
    # A .py PROGRAM runs on this interpreter, as torchrun runs it on its own (sys.executable),
    # unless DTRAIN_PYTHON or torchrun's PYTHON_EXEC names another.
    if not os.environ.get("DTRAIN_PYTHON") and not os.environ.get("PYTHON_EXEC") and sys.executable:
        os.environ["DTRAIN_PYTHON"] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe] + list(args))


def main():
    """Console entry point `dtrain` (every subcommand: run, zero, horovodrun, ...)."""
    exec_dtrain(sys.argv[1:])
