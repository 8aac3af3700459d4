"""Prints numbered lines on stdout and stderr (LauncherInterop's log-layout test).

Each line is one write(2): ranks whose streams torchrun leaves on its own console share one pipe,
and print() writes the text and its newline apart, so two ranks' lines could join into one."""
import os

rank = os.environ["RANK"]
for i in range(4):
    os.write(1, f"out {rank} line {i}\n".encode())
    os.write(2, f"err {rank} line {i}\n".encode())
