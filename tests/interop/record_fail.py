# A PyTorch script that fails on rank 1 under torch's @record decorator, which writes the
# exception to TORCHELASTIC_ERROR_FILE; the launcher must show it in its failure summary.
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 failed on purpose")
    time.sleep(30)


if __name__ == "__main__":
    main()
