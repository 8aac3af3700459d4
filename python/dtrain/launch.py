"""`python -m dtrain.launch [launcher flags] PROGRAM [ARGS...]`: the same as `dtrain launch ...`,
as `python -m torch.distributed.launch` is torchrun with `--use-env`: without that flag each
worker gets `--local-rank=N` before PROGRAM's arguments."""

import sys

from dtrain._command import exec_dtrain


def main(argv=None):
    exec_dtrain(["launch"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
