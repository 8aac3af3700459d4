"""What DeepSpeed's `deepspeed` launcher does with `--FLAG=` (argparse's empty string), flag by
flag, for deepspeed_launcher_test (DeepSpeedLauncher.EmptyFlagValuesAsDeepSpeedTakesThem).

    python ds_empty_values.py WORKER ARG...

For each option string of DeepSpeed's runner (deepspeed/launcher/runner.py, the venv's), runs its
own main() with `FLAG= --num_gpus 2 --no_python WORKER ARG...` in this process, deepspeed's
launch.py main() included, with subprocess.Popen replaced by a recorder (ds_record.py): no worker
starts, and what each would have run is recorded. One line per flag on stdout:

    empty FLAG {"ok": [{"argv": [...], "env": {...}}, ...]}   (each worker, rank order)
    empty FLAG {"error": "MESSAGE"}                           (where DeepSpeed stops)
    space FLAG ...                                            (the same for `FLAG ''`, a flag
                                                               that takes a value)

(deepspeed's own log lines go to stdout too; the test reads the lines that start with "empty " or "space ").
Single node only: the flags that matter across nodes alone (--launcher, --launcher_args, --venv_script,
--ssh_port) are run as on one node, where DeepSpeed does not read them.
"""
import argparse
import json
import sys

from ds_record import record, runner

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
            flags.append((opt, action.nargs != 0))

tail = ["--num_gpus", "2", "--no_python"] + sys.argv[1:]
for flag, takes_value in flags:
    print("empty " + flag + " " + json.dumps(record([flag + "="] + tail)), flush=True)
    if takes_value:
        print("space " + flag + " " + json.dumps(record([flag, ""] + tail)), flush=True)
