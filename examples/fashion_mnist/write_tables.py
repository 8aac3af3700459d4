"""Writes Fashion-MNIST (the IDX files of Debian's dataset-fashion-mnist) as tables for
`fashion_mnist --data`: a directory of Parquet files (pyarrow) and a Delta table (deltalake,
i.e. delta-rs), each with a train and a test table of two columns, image (784 pixels 0-255,
list<uint8> in Parquet, list<int16> in Delta, which has no unsigned types) and label (int64). Row groups of 1000 rows, so 60 row groups split evenly over
1-6 ranks.

    write_tables.py OUT [--idx DIR] [--rows-per-group 1000] [--files 4]

    OUT/parquet/{train,test}/part-0000N.parquet
    OUT/delta/{train,test}/ (_delta_log + data files)

then:  dtrain run --nproc-per-node 2 build/examples/fashion_mnist \\
           --data delta:OUT/delta/train --test-data delta:OUT/delta/test
From a Spark DataFrame instead, dtrain.spark.make_converter(df) writes the Parquet files.
"""
import argparse
import gzip
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import WriterProperties, write_deltalake


def idx_split(idx, stem):
    with gzip.open(os.path.join(idx, stem + "-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(idx, stem + "-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return pa.table({
        "image": pa.ListArray.from_arrays(pa.array(np.arange(0, images.size + 1, 784), pa.int32()),
                                          pa.array(images.reshape(-1), pa.uint8())),
        "label": pa.array(labels, pa.int64()),
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--idx", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--rows-per-group", type=int, default=1000)
    ap.add_argument("--files", type=int, default=4)
    a = ap.parse_args()
    for split, stem in (("train", "train"), ("test", "t10k")):
        t = idx_split(a.idx, stem)
        pdir = os.path.join(a.out, "parquet", split)
        ddir = os.path.join(a.out, "delta", split)
        shutil.rmtree(pdir, ignore_errors=True)
        shutil.rmtree(ddir, ignore_errors=True)
        os.makedirs(pdir)
        per_file = -(-t.num_rows // a.files)
        for i in range(a.files):
            part = t.slice(i * per_file, per_file)
            pq.write_table(part, os.path.join(pdir, "part-%05d.parquet" % i),
                           row_group_size=a.rows_per_group)
            # One Delta commit per part: the table has a history, as one appended to has.
            # Delta has no unsigned types: the pixels go in as short (int16).
            part = part.set_column(0, "image", part.column("image").cast(pa.list_(pa.int16())))
            write_deltalake(ddir, part, mode="append",
                            writer_properties=WriterProperties(max_row_group_size=a.rows_per_group))
        print("%s: %d rows -> %s, %s" % (split, t.num_rows, pdir, ddir))


if __name__ == "__main__":
    main()
