# Prints "args A B ... LOCAL_RANK=N" on one line: what `dtrain launch` (torch.distributed.launch)
# gave this worker (tests/support/launch_check.sh).
import os
import sys

print("args %s LOCAL_RANK=%s" % (" ".join(sys.argv[1:]), os.environ["LOCAL_RANK"]), flush=True)
