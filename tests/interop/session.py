# Prints, as one JSON line, the session and process group this worker runs in and its parent's
# (the launcher's) session, so that a test can compare how torchrun and `dtrain run` start
# their workers.
import json
import os

print(json.dumps({"rank": int(os.environ["RANK"]), "pid": os.getpid(), "sid": os.getsid(0),
                  "pgid": os.getpgid(0), "parent_sid": os.getsid(os.getppid())}), flush=True)
