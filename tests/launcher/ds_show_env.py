# A worker for deepspeed_launcher_test: prints one JSON line with its argv, environment and
# pid (and writes it to DS_TEST_OUT/rank<RANK>.json when that is set). With DS_TEST_FAIL_RANK=R, rank R exits 3 after a second and the others sleep (to be
# killed by the launcher). Also runs as `--module ds_show_env` (PYTHONPATH holds this folder).
import json
import os
import sys
import time

# dtrain deepspeed --save_pid: the launcher (this worker's parent) names itself in
# /tmp/<its pid>.deepspeed while the job runs.
pid_file = "/tmp/%d.deepspeed" % os.getppid()
saved = open(pid_file).read() if os.path.exists(pid_file) else None
line = json.dumps({"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid(), "saved_pid": saved})
print(line, flush=True)
# The same line in DS_TEST_OUT/rank<RANK>.json: DeepSpeed's workers share the launcher's stdout
# unprefixed, where two ranks' lines (longer than a pipe's atomic 4 KiB) may interleave.
out_dir = os.environ.get("DS_TEST_OUT")
if out_dir:
    path = os.path.join(out_dir, "rank%s.json" % os.environ.get("RANK", "x"))
    with open(path + ".tmp", "w") as f:
        f.write(line)
    os.rename(path + ".tmp", path)
fail_rank = os.environ.get("DS_TEST_FAIL_RANK")
if fail_rank is not None:
    if os.environ.get("RANK") == fail_rank:
        time.sleep(1)
        sys.exit(3)
    time.sleep(120)
