"""`python -m dtrain.run [launcher flags] PROGRAM [ARGS...]`: the same as `dtrain run ...`, as
`python -m torch.distributed.run` is `torchrun`. Takes torchrun's flags (`dtrain run --help`)."""

import sys

from dtrain._command import exec_dtrain


def main(argv=None):
    exec_dtrain(["run"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
