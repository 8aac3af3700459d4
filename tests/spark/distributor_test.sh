#!/usr/bin/env bash
# dtrain.spark.Distributor against PySpark's TorchDistributor on a Spark standalone cluster on
# loopback (a master + 2 workers of 2 cores, tests/spark/lib.sh; no root): validation errors,
# function mode in local and cluster mode, a failing script, and no lost last line (5 of 5
# runs). The cases are distributor_test.py's. Fails (never skips) when Java or pyspark is
# missing.
#   distributor_test.sh DTRAIN PYTHON_DIR
source "$(dirname "$0")/lib.sh"
DTRAIN="$(realpath "$1")" PYDIR="$(realpath "$2")"
[[ -x "$DTRAIN" ]] || fail "$DTRAIN is not built: run scripts/setup.sh"
spark_init
"$PY" -c 'import torch, pandas, pyarrow' 2>/dev/null || fail "$PY lacks torch, pandas or pyarrow (TorchDistributor's peers): pip install -r scripts/requirements.txt"
spark_up 2
PYTHONPATH="$PYDIR" timeout 600 "$PY" "$(dirname "$0")/distributor_test.py" "$SPARK_MASTER_URL" "$DTRAIN" "$T" ||
  fail "distributor_test.py failed (exit $?)"
