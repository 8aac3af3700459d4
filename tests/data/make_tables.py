"""Writes the data tests' tables (tests/data/data_test.cpp) under OUT, with real writers:
pyarrow for Parquet and deltalake (delta-rs) for a Delta table, and records what each holds
as the writers' own readers see it (OUT/expected.json), for the C++ reader to match exactly.

    make_tables.py OUT

OUT/parquet/         a directory of 3 Parquet files, row groups of 7 to 40 rows (uneven), an
                     id (int64), x = list<float>[4] (id * 10 + j), label (int32 = id % 10),
                     name (string), and a hidden _SUCCESS and _tmp/ that readers must skip
OUT/delta/           a Delta table: v0 create (ids 0-99), v1 append (100-149), v2 overwrite
                     (1000-1079), v3 append (1080-1119), checkpoint at 3, v4 delete (id % 5 == 0),
                     v5 append (2000-2029), v6 append (3000-3009)
OUT/delta_part/      a Delta table partitioned by label (ids 0-89 in two commits)
OUT/delta_gap/       a copy of delta/ without 00000000000000000002.json (a missing commit)
OUT/delta_mapped/    a Delta table with column mapping by name, partitioned by label (ids 0-89
                     in two commits): its Parquet files and partitionValues use physical names
OUT/delta_mapped_id/ the same rows (no partition) with column mapping by id (Parquet field ids)
OUT/types/           one file of 30 rows in row groups of 8: a column of every numeric type and
                     lists of several (the values follow from the id; data_test.cpp checks them)
OUT/bad/             truncated.parquet, corrupt.parquet, nulls.parquet, ragged.parquet (a list
                     row of 3 values where 4 are expected)
"""
import json
import os
import shutil
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    x = (ids[:, None] * 10 + np.arange(4)[None, :]).astype(np.float32)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), 4),
        "label": pa.array((ids % 10).astype(np.int32), pa.int32()),
        "name": pa.array(["row%d" % i for i in ids], pa.string()),
    })


def main(out):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    expected = {}

    # Parquet: uneven row groups across 3 files (and a variable-size list column "xv").
    pdir = os.path.join(out, "parquet")
    os.makedirs(os.path.join(pdir, "_tmp"))
    start = 0
    for i, (n, group) in enumerate([(100, 40), (57, 7), (83, 25)]):
        t = rows(range(start, start + n))
        xv = pa.array([list(map(float, r)) for r in t.column("x").to_pylist()], pa.list_(pa.float32()))
        t = t.append_column("xv", xv)
        pq.write_table(t, os.path.join(pdir, "part-%05d.parquet" % i), row_group_size=group)
        start += n
    open(os.path.join(pdir, "_SUCCESS"), "w").close()
    pq.write_table(rows([-1]), os.path.join(pdir, "_tmp", "part-99999.parquet"))
    expected["parquet"] = list(range(start))

    # Delta, by delta-rs: appends, an overwrite, a delete, a checkpoint.
    ddir = os.path.join(out, "delta")
    write_deltalake(ddir, rows(range(0, 100)), mode="error")
    write_deltalake(ddir, rows(range(100, 150)), mode="append")
    write_deltalake(ddir, rows(range(1000, 1080)), mode="overwrite")
    write_deltalake(ddir, rows(range(1080, 1120)), mode="append")
    DeltaTable(ddir).create_checkpoint()
    DeltaTable(ddir).delete("id % 5 = 0")
    write_deltalake(ddir, rows(range(2000, 2030)), mode="append")
    write_deltalake(ddir, rows(range(3000, 3010)), mode="append")
    dt = DeltaTable(ddir)
    expected["delta_newest"] = dt.version()
    versions = {}
    for v in range(dt.version() + 1):
        t = DeltaTable(ddir, version=v).to_pyarrow_table(columns=["id"])
        versions[str(v)] = sorted(t.column("id").to_pylist())
    expected["delta"] = versions
    expected["delta_checkpoint"] = json.load(open(os.path.join(ddir, "_delta_log", "_last_checkpoint")))["version"]
    expected["delta_protocol"] = str(dt.protocol())

    # Partitioned by label: the label is not in the files, only in the log's partitionValues.
    part = os.path.join(out, "delta_part")
    write_deltalake(part, rows(range(0, 60)), partition_by=["label"])
    write_deltalake(part, rows(range(60, 90)), partition_by=["label"], mode="append")
    expected["delta_part"] = sorted(DeltaTable(part).to_pyarrow_table(columns=["id"]).column("id").to_pylist())

    # Column mapping (Databricks turns it on to rename or drop columns): the files' columns and
    # the log's partitionValues hold physical names ("col-<uuid>"), the schema maps them.
    for mode, key, partition in (("name", "delta_mapped", ["label"]), ("id", "delta_mapped_id", None)):
        mdir = os.path.join(out, key)
        cfg = {"delta.columnMapping.mode": mode, "delta.minReaderVersion": "2",
               "delta.minWriterVersion": "5"}
        write_deltalake(mdir, rows(range(0, 60)), partition_by=partition, configuration=cfg)
        write_deltalake(mdir, rows(range(60, 90)), partition_by=partition, mode="append")
        files = [os.path.join(d, f) for d, _, fs in os.walk(mdir) if "_delta_log" not in d
                 for f in fs if f.endswith(".parquet")]
        names = pq.read_schema(files[0]).names
        assert names and all(n.startswith("col-") for n in names), names  # physical names
        t = DeltaTable(mdir).scan(columns=["id", "label", "x"]).read_all()
        t = pa.table(t)
        got = sorted(zip(t.column("id").to_pylist(), t.column("label").to_pylist(),
                         t.column("x").to_pylist()))
        expected[key] = [[i, label] + list(x) for i, label, x in got]

    gap = os.path.join(out, "delta_gap")
    shutil.copytree(ddir, gap)
    os.remove(os.path.join(gap, "_delta_log", "%020d.json" % 2))

    # Every numeric type, as scalars and as lists.
    tdir = os.path.join(out, "types")
    os.makedirs(tdir)
    i = np.arange(30, dtype=np.int64)

    def lists(values, per, typ, fixed=False):
        flat = pa.array(values.reshape(-1), typ)
        if fixed:
            return pa.FixedSizeListArray.from_arrays(flat, per)
        return pa.ListArray.from_arrays(pa.array(np.arange(0, values.size + 1, per), pa.int32()), flat)

    typed = pa.table({
        "id": pa.array(i, pa.int64()),
        "i8": pa.array(i - 15, pa.int8()),
        "i16": pa.array(i * -1000, pa.int16()),
        "i32": pa.array(i * 70000, pa.int32()),
        "u8": pa.array(i * 8, pa.uint8()),
        "u16": pa.array(i * 2000, pa.uint16()),
        "u32": pa.array(i * 100000000, pa.uint32()),
        "f32": pa.array(i * 0.5, pa.float32()),
        "f64": pa.array(i * 0.25, pa.float64()),
        "b": pa.array(i % 2 == 0, pa.bool_()),
        "l_u8": lists(np.stack([i, i + 1, i + 2], 1), 3, pa.uint8()),
        "l_i16": lists(np.stack([-i, i], 1), 2, pa.int16()),
        "l_i64": lists(np.stack([i * 10000000000, i], 1), 2, pa.int64()),
        "l_f64": lists(np.stack([i * 1.5, -i * 1.0], 1), 2, pa.float64(), fixed=True),
    })
    pq.write_table(typed, os.path.join(tdir, "part-00000.parquet"), row_group_size=8)

    # Bad files.
    bad = os.path.join(out, "bad")
    os.makedirs(bad)
    good = os.path.join(bad, "good.parquet")
    pq.write_table(rows(range(50)), good, row_group_size=25, compression="snappy")
    data = open(good, "rb").read()
    open(os.path.join(bad, "truncated.parquet"), "wb").write(data[: len(data) // 2])
    # Garbage over the data pages, footer intact: the footer reads, the data does not.
    corrupt = bytearray(data)
    for i in range(8, len(data) // 2):
        corrupt[i] = (i * 131) & 0xFF
    open(os.path.join(bad, "corrupt.parquet"), "wb").write(bytes(corrupt))
    t = rows(range(10))
    labels = pa.array([None if i == 3 else i for i in range(10)], pa.int32())
    pq.write_table(t.set_column(2, "label", labels), os.path.join(bad, "nulls.parquet"))
    ragged = pa.array([[1.0, 2.0, 3.0, 4.0]] * 5 + [[1.0, 2.0, 3.0]] + [[1.0, 2.0, 3.0, 4.0]] * 4,
                      pa.list_(pa.float32()))
    pq.write_table(t.set_column(1, "x", ragged), os.path.join(bad, "ragged.parquet"))
    os.remove(good)

    json.dump(expected, open(os.path.join(out, "expected.json"), "w"))
    print("tables written under", out, "; Delta versions 0 to", expected["delta_newest"],
          "checkpoint at", expected["delta_checkpoint"], expected["delta_protocol"])


if __name__ == "__main__":
    main(sys.argv[1])
