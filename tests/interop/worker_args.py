# Prints this worker's arguments, one line each ("arg=VALUE" after an "args=rank N" line), as
# tests/launcher/test_worker.cpp's --print-args does, so that a test can compare what torchrun
# and `dtrain run` give a Python worker and a C++ one.
import os
import sys

print("args=rank %s" % os.environ["RANK"], flush=True)
for a in sys.argv[1:]:
    print("arg=" + a, flush=True)
