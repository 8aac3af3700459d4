#!/usr/bin/env bash
# dtrain.spark.make_converter (Petastorm's make_spark_converter for dtrain) on a real Spark
# standalone cluster (tests/spark/lib.sh: a master and 2 workers of 1 core on loopback):
# a DataFrame (Fashion-MNIST read by Spark, cast and repartitioned) materialised once as
# Parquet under the cache directory, doubles written as floats; the same plan from a new
# DataFrame reuses the files, another plan gets its own, delete() removes them; then a
# Distributor run on the cluster (2 barrier tasks) trains the C++ example from the converter's
# location to accuracy. FAILS (never skips) when Java, pyspark or the data is missing.
#   converter_test.sh DTRAIN FASHION_MNIST PYTHON_DIR
source "$(dirname "$0")/../spark/lib.sh"
DTRAIN="$(realpath "$1")" FM="$(realpath "$2")" PYDIR="$(realpath "$3")"
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "dataset-fashion-mnist is not installed: run scripts/setup.sh"
spark_init
t0=$SECONDS
spark_up 1
# The source data Spark reads: the IDX training split as one Parquet file (pyarrow).
"$PY" - "$T/src.parquet" <<'PY' || fail "writing the source Parquet file"
import gzip, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
d = "/usr/share/datasets/fashion-mnist/"
img = np.frombuffer(gzip.open(d + "train-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
lab = np.frombuffer(gzip.open(d + "train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
offsets = pa.array(np.arange(0, img.size + 1, 784), pa.int32())
pq.write_table(pa.table({"pixels": pa.ListArray.from_arrays(offsets, pa.array(img, pa.int16())),
                         "y": pa.array(lab.astype(np.int16))}), sys.argv[1])
PY
cat >"$T/converter.py" <<PY
import json, os
from pyspark.sql import SparkSession, functions as F
from dtrain.spark import Distributor, make_converter
from dtrain.converter import PARENT_CACHE_DIR_CONF
spark = (SparkSession.builder.master("$SPARK_MASTER_URL").appName("dtrain-converter-test")
         .config(PARENT_CACHE_DIR_CONF, "file://$T/cache").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
def frame():  # a new DataFrame of the same query each call
    src = spark.read.parquet("file://$T/src.parquet")
    return src.select(F.col("pixels").cast("array<double>").alias("image"),
                      F.col("y").cast("long").alias("label")).repartition(4)
df = frame()
conv = make_converter(df, row_group_bytes=4 << 20)
assert not conv.reused and conv.dataset_size == 60000, conv
schema = dict(conv.schema)
assert schema == {"image": "array<float>", "label": "bigint"}, schema  # doubles -> float32
files = conv.file_urls
assert len(files) == 4, files
stamp = os.path.getmtime(conv.path)
again = make_converter(frame(), row_group_bytes=4 << 20)
assert again.reused and again.path == conv.path and os.path.getmtime(conv.path) == stamp, again
other = make_converter(df.filter("label < 5"), row_group_bytes=4 << 20)
assert other.path != conv.path and not other.reused and other.dataset_size == 30000, other
other.delete()
assert not os.path.exists(other.path)
print("converter", conv, "row groups", sum(__import__("pyarrow.parquet").parquet.ParquetFile(f[7:]).num_row_groups for f in files), flush=True)
rc = Distributor(num_processes=2, local_mode=False, use_gpu=False, dtrain="$DTRAIN").run(
    "$FM", "--data", conv.location, "--epochs", "1", "--log-every", "0")
conv.delete()
print("rc", rc, "left", sorted(os.listdir("$T/cache")), flush=True)
spark.stop()
PY
PYTHONPATH="$PYDIR" "$PY" "$T/converter.py" >"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err" >&2; fail "the converter script failed"; }
grep -q "^converter Converter(parquet:$T/cache/df-[0-9a-f]*, 60000 rows)" "$T/out" || { cat "$T/out" "$T/err" >&2; fail "no converter line"; }
grep -qx "rc None left \[\]" "$T/out" || { cat "$T/out" "$T/err" >&2; fail "the Distributor run failed, or delete() left files"; }
json="$(grep -o '{.*"test_accuracy".*}' "$T/out" | tail -1)"
"$PY" -c '
import json, sys
r = json.loads(sys.argv[1])
assert r["world_size"] == 2 and r["test_accuracy"] >= 0.80, r
print("ok: fashion_mnist from the converter on Spark, 2 barrier tasks: test accuracy %.4f" % r["test_accuracy"])
' "$json" || { cat "$T/out" >&2; fail "training result: $json"; }
pass "$(grep '^converter' "$T/out"): materialised once, reused for the same plan, its own files for another, deleted on request ($((SECONDS - t0)) s)"
