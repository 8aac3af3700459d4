"""The Python side of tests/tracking/mlflow_state_dict_test.cpp: mlflow.pytorch's own
log_state_dict / load_state_dict and torch.nn models equivalent to the C++ ones
(examples/fashion_mnist/main.cpp's make_model). Prints one JSON object as its last line.

    state_dict_peer.py check URI MODEL IO_FILE ECHO_FILE
        mlflow.pytorch.load_state_dict(URI); its keys, dtypes and shapes; the Python MODEL's own
        state_dict() keys; Module.load_state_dict(strict=True); the model's output (eval mode)
        on IO_FILE's "input" against its "output" (torch.load, weights_only); the loaded dict
        saved again with torch.save to ECHO_FILE (the C++ side compares it bit for bit).
    state_dict_peer.py log EXPERIMENT MODEL IO_FILE
        In a new run (MLFLOW_TRACKING_URI): mlflow.pytorch.log_state_dict of MODEL's state dict
        under "model"; of a dict of views (non-contiguous, offset, sharing one storage) and
        dtypes under "tensors"; of a checkpoint dict (model, epoch) under "checkpoint". IO_FILE
        gets the model's input and output (eval mode). Prints the run id, the artifact URI of
        "model", and the "tensors" entries' values.
"""
import json
import os
import sys

import mlflow
import mlflow.pytorch
import torch
from torch import nn


def make_model(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    # dtrain::SyncBatchNorm has BatchNorm2d's parameters and buffers (as nn.SyncBatchNorm).
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 7 * 7, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def check(uri, kind, io_file, echo_file):
    sd = mlflow.pytorch.load_state_dict(uri)
    net = make_model(kind)
    own_keys = list(net.state_dict().keys())
    result = net.load_state_dict(sd, strict=True)
    net.eval()
    io = torch.load(io_file)
    with torch.no_grad():
        out = net(io["input"])
    torch.save(sd, echo_file)
    return {
        "type": type(sd).__name__,
        "keys": list(sd.keys()),
        "python_keys": own_keys,
        "dtypes": {k: str(v.dtype) for k, v in sd.items()},
        "shapes": {k: list(v.shape) for k, v in sd.items()},
        "missing": list(result.missing_keys),
        "unexpected": list(result.unexpected_keys),
        "max_abs_diff": float((out - io["output"]).abs().max()),
        "outputs_equal": bool(torch.equal(out, io["output"])),
    }


def log(experiment, kind, io_file):
    torch.manual_seed(7)
    net = make_model(kind)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):  # running statistics other than the initial ones
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.num_batches_tracked.fill_(11)
    net.eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        y = net(x)
    torch.save({"input": x, "output": y}, io_file)

    base = torch.arange(24, dtype=torch.float32)
    tensors = {
        "transposed": torch.arange(12, dtype=torch.float64).reshape(3, 4).t(),  # strides (1, 4)
        "window": base[5:11],          # offset 5 into base's storage
        "strided": base[::3],          # stride 3, the same storage
        "matrix": base.view(4, 6),     # the whole storage again
        "half": torch.tensor([0.5, -2.0, 65504.0], dtype=torch.float16),
        "bfloat16": torch.tensor([1.5, -3.0], dtype=torch.bfloat16),
        "long": torch.tensor([[-(2**40), 3]], dtype=torch.int64),
        "int8": torch.tensor([-128, 127], dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.25),
    }
    mlflow.set_experiment(experiment)
    with mlflow.start_run() as run:
        mlflow.pytorch.log_state_dict(net.state_dict(), "model")
        mlflow.pytorch.log_state_dict(tensors, "tensors")
        mlflow.pytorch.log_state_dict({"model": net.state_dict(), "epoch": 3}, "checkpoint")
        model_uri = mlflow.get_artifact_uri("model")
    return {
        "run_id": run.info.run_id,
        "model_uri": model_uri,
        "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape),
                        "values": v.double().flatten().tolist()} for k, v in tensors.items()},
    }


def main():
    # mlflow.pytorch.load_state_dict refuses pickle files unless this is set (MLflow 3.x).
    os.environ.setdefault("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")
    if sys.argv[1] == "check":
        out = check(*sys.argv[2:6])
    elif sys.argv[1] == "log":
        out = log(*sys.argv[2:5])
    else:
        raise SystemExit("usage: state_dict_peer.py check URI MODEL IO_FILE ECHO_FILE | "
                         "log EXPERIMENT MODEL IO_FILE")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
