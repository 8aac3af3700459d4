"""Prints numbered lines on stdout and stderr (LauncherInterop's log-layout test)."""
import os
import sys

rank = os.environ["RANK"]
for i in range(4):
    print(f"out {rank} line {i}", flush=True)
    print(f"err {rank} line {i}", file=sys.stderr, flush=True)
