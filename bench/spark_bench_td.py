"""The TorchDistributor side of bench/spark_bench.sh: one SparkSession (as a notebook has)
on the given master, then the cases named on the command line, in order, each a
TorchDistributor(num_processes=N, local_mode=False, use_gpu=False).run(...) timed from the
call to its return. Prints one JSON line per case ("TDCASE {...}") on stdout.

  spark_bench_td.py --master URL [--nproc 4] [--cap S] [--peer FILE] [--output FILE] CASE...

Cases: trivial (a function: init a Gloo group, all-reduce, return rank 0's (rank, sum,
host)), epoch (the file bench/pytorch_fashion_mnist.py, 1 epoch: the peer of the example),
exit7 (rank 3 exits with code 7 before the all-reduce, the others wait in it), kill9 (rank
2 SIGKILLs itself there), output (--output FILE: a Python file the bench writes, the same
one dtrain runs). A failure case that has not returned after --cap seconds is cancelled
(SparkContext.cancelAllJobs) and reported as such.

Stdout and stderr must be regular files (the bench redirects them): each case reports the
bytes and lines that reached the driver's console (both streams, the JVM's too) while it
ran, and its text is saved beside them (FILE.case-N) for the bench to inspect.
TorchDistributor with local_mode=False on CPUs runs one torchrun of one process per Spark
task: --nproc 4 is 4 barrier tasks (spark.task.cpus=1) of 1 process each.
"""

import argparse
import json
import os
import sys
import threading
import time


def trivial():
    import socket

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    r = (dist.get_rank(), t.item(), socket.gethostname())
    dist.destroy_process_group()
    return r


def failing(mode):
    import os
    import signal
    import sys

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "exit7" and rank == 3:
        print("rank 3 exits with code 7 on purpose", file=sys.stderr, flush=True)
        os._exit(7)
    if mode == "kill9" and rank == 2:
        print("rank 2 SIGKILLs itself on purpose", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    return t.item()


def stream_sizes():
    sizes = []
    for fd in (1, 2):
        try:
            sizes.append(os.fstat(fd).st_size)
        except OSError:
            sizes.append(0)
    return sizes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--cap", type=float, default=120.0)
    p.add_argument("--peer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_fashion_mnist.py"))
    p.add_argument("--output", default="")
    p.add_argument("cases", nargs="+")
    a = p.parse_args()

    t0 = time.perf_counter()
    from pyspark.sql import SparkSession
    from pyspark.ml.torch.distributor import TorchDistributor

    spark = SparkSession.builder.master(a.master).appName("torchdistributor-bench").getOrCreate()
    session_s = time.perf_counter() - t0
    print("TDCASE " + json.dumps({"case": "session", "seconds": session_s}), flush=True)
    paths = [os.readlink("/proc/self/fd/%d" % fd) for fd in (1, 2)]
    for n, case in enumerate(a.cases):
        sys.stdout.flush()
        sys.stderr.flush()
        before = stream_sizes()
        td = TorchDistributor(num_processes=a.nproc, local_mode=False, use_gpu=False)
        timer = None
        if case in ("exit7", "kill9"):
            timer = threading.Timer(a.cap, spark.sparkContext.cancelAllJobs)
            timer.start()
        rec = {"case": case}
        t = time.perf_counter()
        try:
            if case == "trivial":
                rec["result"] = td.run(trivial)
            elif case == "epoch":
                td.run(a.peer, "--epochs", "1")
            elif case in ("exit7", "kill9"):
                rec["result"] = td.run(failing, case)
            elif case == "output":
                td.run(a.output)
            else:
                raise SystemExit("unknown case " + case)
            rec["ok"] = True
        except Exception as e:  # what TorchDistributor raises, as the user sees it
            rec["ok"] = False
            rec["error_type"] = type(e).__name__
            rec["error"] = str(e)
        rec["seconds"] = time.perf_counter() - t
        if timer is not None:
            rec["cancelled"] = not timer.is_alive() and rec["seconds"] >= a.cap
            timer.cancel()
        time.sleep(0.5)  # the log server's last lines, the JVM's last messages
        sys.stdout.flush()
        sys.stderr.flush()
        after = stream_sizes()
        text = b""
        for path, b, e in zip(paths, before, after):
            with open(path, "rb") as f:
                f.seek(b)
                text += f.read(e - b)
        with open("%s.case-%d" % (paths[0], n), "wb") as f:
            f.write(text)
        rec["driver_bytes"] = len(text)
        rec["driver_lines"] = text.count(b"\n")
        rec["text_file"] = "%s.case-%d" % (paths[0], n)
        print("TDCASE " + json.dumps(rec), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
