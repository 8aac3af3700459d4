"""Reads back MLflow runs with MLflow's own Python client and prints them as one JSON object.

    read_runs.py TRACKING_URI EXPERIMENT_NAME

{"runs": [{"run_id", "status", "parent", "params", "tags", "metrics": {key: [[step, value], ...]},
           "artifacts": [path, ...]}]}  ({"runs": []} when the experiment does not exist)
A value JSON has no number for is written as the string "NaN", "Infinity" or "-Infinity".
"""
import json
import math
import os
import sys

# MLflow 3.17 keeps the file store (dtrain's offline runs) in maintenance mode behind this switch.
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

from mlflow.tracking import MlflowClient  # noqa: E402


def json_value(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def artifacts(client, run_id, path=None):
    out = []
    for f in client.list_artifacts(run_id, path):
        out.extend(artifacts(client, run_id, f.path) if f.is_dir else [f.path])
    return out


def main():
    uri, name = sys.argv[1], sys.argv[2]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    runs = []
    if exp is not None:
        for run in client.search_runs([exp.experiment_id], max_results=1000):
            rid = run.info.run_id
            metrics = {}
            for key in run.data.metrics:
                hist = client.get_metric_history(rid, key)
                points = sorted((m.step, m.value) for m in hist)
                metrics[key] = [[step, json_value(value)] for step, value in points]
            runs.append({
                "run_id": rid,
                "status": run.info.status,
                "parent": run.data.tags.get("mlflow.parentRunId", ""),
                "params": run.data.params,
                "tags": run.data.tags,
                "metrics": metrics,
                "artifacts": sorted(artifacts(client, rid)),
            })
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
