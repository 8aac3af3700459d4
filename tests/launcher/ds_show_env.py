# A worker for deepspeed_launcher_test: prints one JSON line with its argv, environment and
# pid. With DS_TEST_FAIL_RANK=R, rank R exits 3 after a second and the others sleep (to be
# killed by the launcher). Also runs as `--module ds_show_env` (PYTHONPATH holds this folder).
import json
import os
import sys
import time

# dtrain deepspeed --save_pid: the launcher (this worker's parent) names itself in
# /tmp/<its pid>.deepspeed while the job runs.
pid_file = "/tmp/%d.deepspeed" % os.getppid()
saved = open(pid_file).read() if os.path.exists(pid_file) else None
print(json.dumps({"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid(), "saved_pid": saved}),
      flush=True)
fail_rank = os.environ.get("DS_TEST_FAIL_RANK")
if fail_rank is not None:
    if os.environ.get("RANK") == fail_rank:
        time.sleep(1)
        sys.exit(3)
    time.sleep(120)
