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
OUT/delta_dv/        a Delta table with deletion vectors (delta.enableDeletionVectors, so its reader
                     features are deletionVectors and variantType, with no variant column): v0-v2
                     three files by delta-rs (ids 0-99, 100-179, 180-259; row groups of 16), v3
                     DVs: inline on file 0 (one whole row group among its rows), two in one DV
                     file under a random prefix (u) on files 1 and 2, v4 file 0 deleted again
                     by an absolute path DV (p) replacing its first, checkpoint at 4 (delta-rs),
                     v5 append (ids 1000-1019) by delta-rs, v6 file 2's DV replaced by an inline
                     one listed before the remove of the old one in its commit
OUT/delta_dv_part/   partitioned by label (ids 0-89, two commits), DVs on three partition files
OUT/delta_dv_bad/    copies of a one-file DV table: missing/ (its DV file removed), truncated/ (its
                     last 10 bytes cut), crc/ (a byte of the bitmap changed), magic/ (a wrong
                     magic number, checksum recomputed), cardinality/ (the log's one too high)
OUT/delta_dv_moved/  one file of ids 0-19: v1 an inline DV deleting row 3, v2 one deleting row 7
                     instead (the same row counts at v1 and v2, other rows)
OUT/delta_v2ck/      the v2Checkpoint reader feature (delta-rs): v0 ids 0-29 (DVs enabled), v1 the
                     feature added, v2 append 30-59, v3 an inline DV on file 0 (ids 0-2), a
                     classic checkpoint in the V2 spec at 3 (delta-rs), v4 append 60-69
OUT/delta_v2ck_sidecar/ the same, its checkpoint given a sidecar action (file actions elsewhere)
OUT/delta_variant/   ids 0-9 and a variant column v (the log's schema says variant, the files hold
                     the unshredded struct<value, metadata> of binaries)
OUT/types/           one file of 30 rows in row groups of 8: a column of every numeric type and
                     lists of several (the values follow from the id; data_test.cpp checks them)
OUT/bad/             truncated.parquet, corrupt.parquet, nulls.parquet, ragged.parquet (a list
                     row of 3 values where 4 are expected)
"""
import json
import os
import shutil
import struct
import sys
import time
import uuid
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyroaring
from deltalake import DeltaTable, QueryBuilder, TableFeatures, WriterProperties, write_deltalake


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    x = (ids[:, None] * 10 + np.arange(4)[None, :]).astype(np.float32)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), 4),
        "label": pa.array((ids % 10).astype(np.int32), pa.int32()),
        "name": pa.array(["row%d" % i for i in ids], pa.string()),
    })


# Deletion vectors, written per the Delta protocol ("Deletion Vectors" and the appendix "Deletion
# Vector Format"): delta-rs 1.6.6 reads them (its DataFusion QueryBuilder applies them) but its
# delete/update/merge rewrite files instead of writing one, so this script writes them: the bitmap
# by pyroaring (CRoaring's 64-bit portable serialization), the framing and the log by hand.
DV_MAGIC = 1681511377
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data):
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = struct.unpack(">I", data[i:i + 4])[0]
        group = ""
        for _ in range(5):
            group = Z85[v % 85] + group
            v //= 85
        out.append(group)
    return "".join(out)


def dv_bitmap(rows):
    """The serialized RoaringBitmapArray of row positions: magic, then the portable 64-bit format."""
    return struct.pack("<I", DV_MAGIC) + pyroaring.BitMap64(rows).serialize()


def dv_file(path, bitmaps):
    """A DV file holding several vectors; returns each one's (offset, size)."""
    out, spans = bytearray(b"\x01"), []
    for b in bitmaps:
        spans.append((len(out), len(b)))
        out += struct.pack(">I", len(b)) + b + struct.pack(">I", zlib.crc32(b))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(out)
    return spans


def inline_dv(rows):
    b = dv_bitmap(rows)
    return {"storageType": "i", "pathOrInlineDv": z85(b), "sizeInBytes": len(b), "cardinality": len(rows)}


def uuid_dvs(table, prefix, row_sets):
    """One DV file at <table>/<prefix>/deletion_vector_<uuid>.bin with a vector per row set."""
    u = uuid.uuid4()
    spans = dv_file(os.path.join(table, prefix, "deletion_vector_%s.bin" % u), [dv_bitmap(r) for r in row_sets])
    return [{"storageType": "u", "pathOrInlineDv": prefix + z85(u.bytes), "offset": off,
             "sizeInBytes": size, "cardinality": len(r)} for (off, size), r in zip(spans, row_sets)]


def path_dv(path, rows):
    ((off, size),) = dv_file(path, [dv_bitmap(rows)])
    return {"storageType": "p", "pathOrInlineDv": "file://" + path, "offset": off, "sizeInBytes": size,
            "cardinality": len(rows)}


def dv_key(action):
    """A logical file's key in log replay: (path, the DV's uniqueId)."""
    dv = action.get("deletionVector") or {}
    uid = dv.get("storageType", "") + dv.get("pathOrInlineDv", "")
    if dv.get("offset") is not None:
        uid += "@%d" % dv["offset"]
    return action["path"], uid


def live_adds(table):
    """The snapshot's add actions by data file path (newest version), replayed from the JSON log."""
    adds = {}
    log = os.path.join(table, "_delta_log")
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
        for line in open(os.path.join(log, name)):
            a = json.loads(line)
            if "add" in a:
                adds[dv_key(a["add"])] = a["add"]
            elif "remove" in a:
                adds.pop(dv_key(a["remove"]), None)
    return {path: add for (path, _), add in adds.items()}


def commit_dvs(table, dvs, remove_first=True):
    """Commits the next version: each file of `dvs` (path -> descriptor) removed with its old
    DV (if any) and added again with the new one, as Delta's DELETE does."""
    version = DeltaTable(table).version() + 1
    adds = live_adds(table)
    lines = [{"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "DELETE",
                             "engineInfo": "dtrain tests/data/make_tables.py"}}]
    for path, dv in dvs.items():
        old = adds[path]
        remove = {"path": path, "deletionTimestamp": int(time.time() * 1000), "dataChange": True,
                  "extendedFileMetadata": True, "partitionValues": old["partitionValues"],
                  "size": old["size"]}
        if old.get("deletionVector"):
            remove["deletionVector"] = old["deletionVector"]
        add = dict(old, deletionVector=dv, dataChange=True)
        pair = [{"remove": remove}, {"add": add}]
        lines += pair if remove_first else pair[::-1]
    with open(os.path.join(table, "_delta_log", "%020d.json" % version), "x") as f:
        f.write("".join(json.dumps(a) + "\n" for a in lines))
    return version


def peer_ids(table, version=None):
    """The ids delta-rs's DataFusion reader returns (it applies deletion vectors)."""
    dt = DeltaTable(table, version=version)
    t = QueryBuilder().register("t", dt).execute("select id from t").read_all()
    return sorted(t.column("id").to_pylist())


def data_files(table):
    """The live data files' paths (relative, as the log holds them), in id order of their rows."""
    adds = live_adds(table)
    return sorted(adds, key=lambda p: pq.read_table(os.path.join(table, p), columns=["id"]).column("id")[0].as_py())


def file_ids(table, path):
    return pq.read_table(os.path.join(table, path), columns=["id"]).column("id").to_pylist()


def write_dv_tables(out, expected):
    props = WriterProperties(max_row_group_size=16, write_batch_size=16)
    cfg = {"delta.enableDeletionVectors": "true"}
    d = os.path.join(out, "delta_dv")
    write_deltalake(d, rows(range(0, 100)), configuration=cfg, writer_properties=props)
    write_deltalake(d, rows(range(100, 180)), mode="append", writer_properties=props)
    write_deltalake(d, rows(range(180, 260)), mode="append", writer_properties=props)
    f0, f1, f2 = data_files(d)
    assert pq.ParquetFile(os.path.join(d, f0)).metadata.num_row_groups > 2, "row groups of 16 expected"
    deleted = {}  # id -> deleted, the bitmaps' own view (positions in the file -> ids)

    def delete(path, positions):
        ids = file_ids(d, path)
        return sorted(positions), {ids[p] for p in positions}

    # v3: file 0 inline (rows 16-31, a whole row group, and a few more); files 1 and 2 in one
    # DV file under the random prefix "q7".
    p0, gone0 = delete(f0, list(range(16, 32)) + [0, 5, 99])
    p1, gone1 = delete(f1, [1, 2, 3, 40, 79])
    p2, gone2 = delete(f2, list(range(0, 80, 3)))
    dv1, dv2 = uuid_dvs(d, "q7", [p1, p2])
    v3 = commit_dvs(d, {f0: inline_dv(p0), f1: dv1, f2: dv2})
    # v4: file 0 deleted again (its first DV's rows and more), by absolute path.
    p0b, gone0b = delete(f0, p0 + [50, 51, 52, 98])
    v4 = commit_dvs(d, {f0: path_dv(os.path.join(d, "dvs", "deletion_vector_by_path.bin"), p0b)})
    DeltaTable(d).create_checkpoint()
    write_deltalake(d, rows(range(1000, 1020)), mode="append", writer_properties=props)
    # v6: file 2's DV replaced by an inline one, the add before the remove of the old one.
    p2b, gone2b = delete(f2, p2 + [1, 4])
    v6 = commit_dvs(d, {f2: inline_dv(p2b)}, remove_first=False)
    assert (v3, v4, v6) == (3, 4, 6), (v3, v4, v6)
    ck = json.load(open(os.path.join(d, "_delta_log", "_last_checkpoint")))["version"]
    assert ck == 4, ck
    all_ids = {0: set(range(100)), 1: set(range(180)), 2: set(range(260))}
    all_ids[3] = all_ids[2] - gone0 - gone1 - gone2
    all_ids[4] = all_ids[2] - gone0b - gone1 - gone2
    all_ids[5] = all_ids[4] | set(range(1000, 1020))
    all_ids[6] = all_ids[5] - gone2b
    versions = {}
    for v in range(7):
        got = peer_ids(d, v)
        # The peer applies the vectors: its rows are exactly what the bitmaps leave.
        assert got == sorted(all_ids[v]), "delta-rs's reader does not apply the DVs at version %d" % v
        versions[str(v)] = got
    expected["delta_dv"] = versions
    expected["delta_dv_protocol"] = sorted(DeltaTable(d).protocol().reader_features or [])
    # Row groups (per file, in the reader's path order) and rows deleted from each, at v6.
    groups = []
    for path in sorted(live_adds(d)):
        md = pq.ParquetFile(os.path.join(d, path)).metadata
        gone = {f0: p0b, f1: p1, f2: p2b}.get(path, [])
        start = 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            groups.append([n, sum(1 for p in gone if start <= p < start + n)])
            start += n
    expected["delta_dv_groups"] = groups

    # Partitioned: DVs on files of three partitions (inline, and two in one DV file).
    part = os.path.join(out, "delta_dv_part")
    write_deltalake(part, rows(range(0, 60)), partition_by=["label"], configuration=cfg)
    write_deltalake(part, rows(range(60, 90)), partition_by=["label"], mode="append")
    adds = live_adds(part)
    by_label = sorted((a["partitionValues"]["label"], p) for p, a in adds.items())
    (_, fa), (_, fb), (_, fc) = by_label[0], by_label[3], by_label[7]
    dvb, dvc = uuid_dvs(part, "", [[0, 1], [2]])
    commit_dvs(part, {fa: inline_dv([1]), fb: dvb, fc: dvc})
    t = QueryBuilder().register("t", DeltaTable(part)).execute("select id, label from t").read_all()
    expected["delta_dv_part"] = sorted(zip(t.column("id").to_pylist(), t.column("label").to_pylist()))
    gone = set(file_ids(part, fa)[1:2]) | set(file_ids(part, fb)[0:2]) | set(file_ids(part, fc)[2:3])
    assert [i for i, _ in expected["delta_dv_part"]] == sorted(set(range(90)) - gone)

    # Bad vectors: one file of 20 rows, a DV file deleting rows 3 and 7.
    bad = os.path.join(out, "delta_dv_bad")
    base = os.path.join(bad, "base")
    write_deltalake(base, rows(range(20)), configuration=cfg)
    (f,) = live_adds(base)
    (dv,) = uuid_dvs(base, "", [[3, 7]])
    commit_dvs(base, {f: dv})
    assert peer_ids(base) == sorted(set(range(20)) - {3, 7})
    dv_name = [n for n in os.listdir(base) if n.startswith("deletion_vector_")][0]
    for case in ("missing", "truncated", "crc", "magic", "cardinality"):
        shutil.copytree(base, os.path.join(bad, case))
    os.remove(os.path.join(bad, "missing", dv_name))
    raw = bytearray(open(os.path.join(base, dv_name), "rb").read())
    open(os.path.join(bad, "truncated", dv_name), "wb").write(bytes(raw[:-10]))
    crc = bytearray(raw)
    crc[-6] ^= 0x40  # a byte of the bitmap: the checksum no longer matches
    open(os.path.join(bad, "crc", dv_name), "wb").write(bytes(crc))
    magic = bytearray(raw)
    magic[5] ^= 0x01  # the magic number's first byte, then a checksum that matches again
    body = bytes(magic[5:5 + dv["sizeInBytes"]])
    magic[5 + dv["sizeInBytes"]:] = struct.pack(">I", zlib.crc32(body))
    open(os.path.join(bad, "magic", dv_name), "wb").write(bytes(magic))
    log1 = os.path.join(bad, "cardinality", "_delta_log", "%020d.json" % 1)
    text = open(log1).read().replace('"cardinality": 2', '"cardinality": 3')
    assert '"cardinality": 3' in text
    open(log1, "w").write(text)
    shutil.rmtree(base)

    # The same row counts at two versions: v1 deletes row 3, v2 deletes row 7 instead (an
    # elastic position of v1 must not restore at v2).
    moved = os.path.join(out, "delta_dv_moved")
    write_deltalake(moved, rows(range(20)), configuration=cfg)
    (f,) = live_adds(moved)
    commit_dvs(moved, {f: inline_dv([3])})
    commit_dvs(moved, {f: inline_dv([7])})
    expected["delta_dv_moved"] = {str(v): peer_ids(moved, v) for v in range(3)}
    assert len(expected["delta_dv_moved"]["1"]) == len(expected["delta_dv_moved"]["2"]) == 19

    # v2Checkpoint: delta-rs adds the feature and then writes classic-named checkpoints in the
    # V2 spec (a checkpointMetadata action; its add actions in the checkpoint, no sidecars).
    v2 = os.path.join(out, "delta_v2ck")
    write_deltalake(v2, rows(range(0, 30)), configuration=cfg)
    DeltaTable(v2).alter.add_feature([TableFeatures.V2Checkpoint], allow_protocol_versions_increase=True)
    write_deltalake(v2, rows(range(30, 60)), mode="append")
    first = [p for p, a in live_adds(v2).items() if file_ids(v2, p)[0] == 0][0]
    commit_dvs(v2, {first: inline_dv([0, 1, 2])})
    DeltaTable(v2).create_checkpoint()
    write_deltalake(v2, rows(range(60, 70)), mode="append")
    ck = os.path.join(v2, "_delta_log", "%020d.checkpoint.parquet" % 3)
    meta = pq.read_table(ck).column("checkpointMetadata")
    assert meta.length() - meta.null_count == 1, "delta-rs wrote no V2-spec checkpoint"
    assert "v2Checkpoint" in (DeltaTable(v2).protocol().reader_features or [])
    expected["delta_v2ck"] = {str(v): peer_ids(v2, v) for v in range(DeltaTable(v2).version() + 1)}
    assert expected["delta_v2ck"]["4"] == list(range(3, 70))
    # The same with a sidecar action in its checkpoint (file actions dtrain would not see).
    side = os.path.join(out, "delta_v2ck_sidecar")
    shutil.copytree(v2, side)
    ck = os.path.join(side, "_delta_log", "%020d.checkpoint.parquet" % 3)
    t = pq.read_table(ck)
    extra = {n: [None] for n in t.schema.names}
    extra["sidecar"] = [{"path": "016ae953-37a9-438e-8683-9a9a4a79a395.parquet", "sizeInBytes": 1,
                         "modificationTime": 1, "tags": None}]
    pq.write_table(pa.concat_tables([t, pa.table(extra, schema=t.schema)]), ck)

    # A variant column: the log's schema says variant (delta-rs writes the unshredded struct).
    var = os.path.join(out, "delta_variant")
    v = pa.StructArray.from_arrays([pa.array([b"\x0c\x01"] * 10, pa.binary()),
                                    pa.array([b"\x01\x00\x00"] * 10, pa.binary())],
                                   ["value", "metadata"])
    write_deltalake(var, pa.table({"id": pa.array(range(10), pa.int64()), "v": v}), configuration=cfg)
    log0 = os.path.join(var, "_delta_log", "%020d.json" % 0)
    lines = [json.loads(line) for line in open(log0)]
    for a in lines:
        if "metaData" in a:
            schema = json.loads(a["metaData"]["schemaString"])
            schema["fields"][1]["type"] = "variant"
            a["metaData"]["schemaString"] = json.dumps(schema)
    open(log0, "w").write("".join(json.dumps(a) + "\n" for a in lines))


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

    write_dv_tables(out, expected)

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
