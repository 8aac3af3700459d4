"""A Spark DataFrame handed to C++ training: Petastorm's make_spark_converter for dtrain.

    from dtrain.spark import Distributor, make_converter
    spark.conf.set("dtrain.spark.converter.parentCacheDirUrl", "file:///dbfs/tmp/dtrain")
    conv = make_converter(df)            # written once as Parquet; reused while df's plan is the same
    Distributor(num_processes=4, local_mode=False, use_gpu=False).run(
        "/path/to/train", "--data", conv.location)   # each rank reads its row groups (dtrain::data)
    conv.delete()                         # when done with it

The DataFrame is materialised once under the parent cache directory, in a directory named after
a hash of its analyzed logical plan and the write options: a second make_converter() of a
DataFrame with the same plan (the same query over the same inputs) reuses the files instead of
writing them again, as Petastorm's converter does. The write goes to a temporary directory first
and is renamed into place when complete, so a reader never sees half a dataset.

As Petastorm, before writing: double columns (and arrays of doubles) become float with
dtype="float32" (the default; dtype=None keeps them), and Spark ML vectors become arrays.
Row groups hold about `row_group_bytes` (default 32 MiB, Petastorm's default too): dtrain::data
splits a table across ranks by row group, so a table needs at least as many row groups as ranks.

The cache directory must be a path every worker sees the same (a shared file system: DBFS's
/dbfs fuse mount on Databricks, NFS...); "file:" URIs and plain paths are accepted.
"""

import hashlib
import json
import os
import shutil
import uuid

PARENT_CACHE_DIR_CONF = "dtrain.spark.converter.parentCacheDirUrl"
_META = "_dtrain_converter.json"  # beside the data; readers skip files starting with '_'


def _local_path(url):
    if url.startswith("file://"):
        return url[len("file://"):]
    if url.startswith("file:"):
        return url[len("file:"):]
    if "://" in url or (":" in url.split("/")[0]):
        raise ValueError("dtrain converter: the cache directory %r is not a local path; give a "
                         "path every worker sees (a shared file system such as /dbfs/...)" % url)
    return url


class Converter:
    """A DataFrame materialised as Parquet. location ("parquet:DIR") is what dtrain::data and
    the examples' --data take; path the directory; dataset_size its rows; schema its columns
    (name, Spark type) as written; file_urls its Parquet files."""

    def __init__(self, path, dataset_size, schema, reused):
        self.path = path
        self.location = "parquet:" + path
        self.dataset_size = dataset_size
        self.schema = schema
        self.reused = reused

    @property
    def file_urls(self):
        out = []
        for root, dirs, files in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            out += ["file://" + os.path.join(root, f) for f in sorted(files)
                    if f.endswith(".parquet") and not f.startswith(("_", "."))]
        return out

    def env(self):
        """Environment for a Distributor run: DTRAIN_DATA (the location) and DTRAIN_DATA_SCHEMA
        (the columns as JSON), for programs that take their table from the environment."""
        return {"DTRAIN_DATA": self.location, "DTRAIN_DATA_SCHEMA": json.dumps(self.schema)}

    def delete(self):
        """Deletes the materialised files (the next make_converter() of the plan writes again)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def __repr__(self):
        return "Converter(%s, %d rows%s)" % (self.location, self.dataset_size,
                                             ", reused" if self.reused else "")


def _prepared(df, dtype):
    """Petastorm's conversions: vectors to arrays, doubles to floats (dtype float32)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    cols = []
    for field in df.schema.fields:
        c = F.col("`%s`" % field.name)
        t = field.dataType
        if type(t).__name__ == "VectorUDT":
            from pyspark.ml.functions import vector_to_array
            c = vector_to_array(c, dtype="float32" if dtype == "float32" else "float64")
        elif dtype == "float32" and isinstance(t, T.DoubleType):
            c = c.cast(T.FloatType())
        elif dtype == "float32" and isinstance(t, T.ArrayType) and isinstance(t.elementType, T.DoubleType):
            c = c.cast(T.ArrayType(T.FloatType()))
        cols.append(c.alias(field.name))
    return df.select(*cols)


def make_converter(df, parent_cache_dir=None, row_group_bytes=32 * 1024 * 1024,
                   compression="snappy", dtype="float32"):
    """Materialises `df` as Parquet (once per plan) and returns its Converter.

    parent_cache_dir: default the Spark conf dtrain.spark.converter.parentCacheDirUrl; one of
    the two is required (ValueError otherwise)."""
    spark = df.sparkSession
    parent = parent_cache_dir or spark.conf.get(PARENT_CACHE_DIR_CONF, None)
    if not parent:
        raise ValueError("dtrain converter: no cache directory: pass parent_cache_dir=... or set "
                         "the Spark conf %s to a directory every worker sees" % PARENT_CACHE_DIR_CONF)
    parent = _local_path(parent)
    if dtype not in ("float32", None):
        raise ValueError("dtrain converter: dtype must be 'float32' or None, got %r" % (dtype,))
    prepared = _prepared(df, dtype)
    # The canonical plan: the same query over the same inputs gives the same string, whatever
    # expression ids this session gave its attributes (what Petastorm's sameResult() checks).
    plan = prepared._jdf.queryExecution().analyzed().canonicalized().toString()
    key = hashlib.sha256(json.dumps([plan, row_group_bytes, compression, dtype]).encode()).hexdigest()[:24]
    path = os.path.join(os.path.abspath(parent), "df-" + key)
    meta = os.path.join(path, _META)
    if os.path.exists(meta):
        with open(meta) as f:
            m = json.load(f)
        return Converter(path, m["rows"], m["schema"], reused=True)
    os.makedirs(parent, exist_ok=True)
    tmp = "%s.tmp-%s" % (path, uuid.uuid4().hex[:8])
    try:
        (prepared.write.option("parquet.block.size", int(row_group_bytes))
         .option("compression", compression).parquet("file://" + tmp))
        rows = spark.read.parquet("file://" + tmp).count()
        schema = [[f.name, f.dataType.simpleString()] for f in prepared.schema.fields]
        with open(os.path.join(tmp, _META), "w") as f:
            json.dump({"rows": rows, "schema": schema, "plan_sha256": key}, f)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.exists(meta):  # not another writer of the same plan that won
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            with open(meta) as f:
                m = json.load(f)
            return Converter(path, m["rows"], m["schema"], reused=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Converter(path, rows, schema, reused=False)
