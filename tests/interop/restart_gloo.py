# An ordinary PyTorch script as torchrun runs it, with a failure on purpose: env:// rendezvous
# (the launcher's store), a Gloo group, one all_reduce; then, while TORCHELASTIC_RESTART_COUNT
# is below RESTARTS, rank 0 exits 1 so that the launcher restarts every worker.
#   python restart_gloo.py RESTARTS INIT_TIMEOUT_S
# Each attempt that gets through the all_reduce prints "attempt K rank R all_reduce 3.0".
# PyTorch 2.x's env:// rendezvous does not prefix keys by attempt, so under a launcher that
# keeps one store for the job a restarted attempt can read the previous one's Gloo addresses:
# init_process_group fails ("Connection refused") or waits for its timeout.
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    restarts, timeout = int(sys.argv[1]), float(sys.argv[2])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"attempt {attempt} rank {rank} all_reduce {t.item()}", flush=True)
    if attempt < restarts and rank == 0:
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
