"""Spark's DeepspeedTorchDistributor (pyspark, the venv's pinned version) running ds_argv.py in
local mode on 2 CPU processes, once per way of giving the config: a dict ("object"), a path
("path"), none ("none"). Each case's workers write their arguments under OUT/<case>/; the C++
test (deepspeed_distributor_test.cpp) runs dtrain's DeepSpeedDistributor the same way and
compares.

    ds_distributor_peer.py OUT SCRIPT CONFIG_PATH ARGS...
"""
import json
import os
import sys
import tempfile

out, script, config_path, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# Spark's distributor writes a dict config to a NamedTemporaryFile it never removes: under OUT,
# which the test removes.
os.makedirs(out, exist_ok=True)
tempfile.tempdir = out

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor  # noqa: E402

spark = (SparkSession.builder.master("local[2]").appName("ds-distributor-peer")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .getOrCreate())
try:
    with open(config_path) as f:
        as_object = json.load(f)
    for case, config in (("object", as_object), ("path", config_path), ("none", None)):
        os.makedirs(os.path.join(out, case))
        os.environ["DS_ARGV_OUT"] = os.path.join(out, case)
        DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=True, useGpu=False,
                                  deepspeedConfig=config).run(script, *args)
        print("peer: %s done" % case, flush=True)
finally:
    spark.stop()
