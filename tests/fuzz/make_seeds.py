#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (tests/fuzz/corpus/TARGET/NAME): small valid
inputs that take each parser down its main paths, so fuzzing starts from what real peers send.

    python3 tests/fuzz/make_seeds.py [--tables DIR]
      (the elastic commit seed needs `import torch`; the deletion_vector and delta_log seeds
      are taken from the data tests' tables, which tests/data/make_tables.py writes with
      delta-rs and pyroaring - DIR, by default build-torch2/tests/data_tables, where the data
      tests leave them)

The files are committed; run this again only when a format changes.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def u8(v): return struct.pack("<B", v)
def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def i64(v): return struct.pack("<q", v)
def s(b): b = b.encode() if isinstance(b, str) else b; return u64(len(b)) + b
def keys(*ks): return u64(len(ks)) + b"".join(s(k) for k in ks)


MAGIC = 0x3C85F7CE
V2 = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7,
          DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13,
          QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16, LIST_KEYS=17, AUTH=0xD7)
V1 = dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, WATCH_KEY=7,
          DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12)


def chunks(stream, conn):
    """The store_server harness's framing: header (length-1)<<2 | conn, then the bytes."""
    out = b""
    for i in range(0, len(stream), 64):
        piece = stream[i:i + 64]
        out += u8(((len(piece) - 1) << 2) | conn) + piece
    return out


def store_seeds():
    v2 = (u8(0) + u32(MAGIC) + u8(V2["PING"]) + u32(7) + u8(V2["SET"]) + s("/a") + s("1") +
          u8(V2["GET"]) + s("/a") + u8(V2["ADD"]) + s("/n") + i64(5) + u8(V2["CHECK"]) +
          keys("/a", "/b") + u8(V2["COMPARE_SET"]) + s("/a") + s("1") + s("2") +
          u8(V2["MULTI_SET"]) + u64(2) + s("/x") + s("X") + s("/y") + s("Y") +
          u8(V2["MULTI_GET"]) + keys("/x", "/y") + u8(V2["APPEND"]) + s("/x") + s("more") +
          u8(V2["QUEUE_PUSH"]) + s("/q") + s("item") + u8(V2["QUEUE_LEN"]) + s("/q") +
          u8(V2["QUEUE_POP"]) + s("/q") + u8(V2["GETNUMKEYS"]) + u8(V2["LIST_KEYS"]) +
          u8(V2["DELETE_KEY"]) + s("/x"))
    waiter = u8(0) + u32(MAGIC) + u8(V2["WAIT"]) + keys("/later", "/a") + u8(V2["CANCEL_WAIT"])
    setter = u8(0) + u32(MAGIC) + u8(V2["SET"]) + s("/later") + s("now")
    write("store_server", "v2_session", u8(0) + chunks(v2, 0))
    write("store_server", "v2_wait_wakes", u8(0) + chunks(waiter[:-1], 1) + chunks(setter, 2) +
          chunks(waiter[-1:], 1))
    v1 = (u8(V1["SET"]) + s("/a") + s("1") + u8(V1["WATCH_KEY"]) + s("/a") + u8(V1["ADD"]) +
          s("/n") + i64(1) + u8(V1["GET"]) + s("/a") + u8(V1["WAIT"]) + keys("/a") +
          u8(V1["DELETE_KEY"]) + s("/a") + u8(V1["GETNUMKEYS"]))
    write("store_server", "v1_session", u8(0) + chunks(v1, 0) + chunks(u8(V1["SET"]) + s("/a") +
                                                                        s("2"), 1))
    token = u8(0) + u32(MAGIC) + u8(V2["AUTH"]) + s("fuzz-token") + u8(V2["SET"]) + s("/k") + s("v")
    write("store_server", "token_accepted", u8(1) + chunks(token, 0))
    wrong = u8(0) + u32(MAGIC) + u8(V2["AUTH"]) + s("guess") + u8(V2["SET"]) + s("/k") + s("v")
    write("store_server", "token_refused", u8(1) + chunks(wrong, 1) + u8(3))
    write("store_server", "stranger", u8(1) + chunks(u8(V1["SET"]) + s("/k") + s("v"), 2))

    # store_client: the server's answers to set, get (WAIT + GET), add, compare_set, check,
    # wait, delete_key, num_keys, wait.
    replies = (u8(0) + s("value") + i64(3) + s("w") + u8(0) + u8(0) + i64(1) + i64(2) + u8(1) +
               u8(0) + u8(1))
    write("store_client", "v2_all_ok", u8(1) + replies)
    write("store_client", "v1_all_ok", u8(0) + replies)
    write("store_client", "huge_length", u8(1) + u8(0) + u64(1 << 62) + b"abc")


def config_seeds():
    for name in ("ds_zero2.json", "ds_bf16_stage3.json"):
        with open(os.path.join(HERE, "..", "..", "examples", "fashion_mnist", name), "rb") as f:
            write("deepspeed_config", name, u8(1) + f.read())
    full = {
        "train_batch_size": 32, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_num_steps": 10, "total_num_steps": 100}},
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 8},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "overlap_comm": True,
                              "offload_optimizer": {"device": "cpu"},
                              "stage3_max_live_parameters": 1e6},
    }
    write("deepspeed_config", "full", u8(3) + json.dumps(full).encode())
    write("deepspeed_config", "typo", u8(0) + b'{"train_batch_size": 8, "zero_optimisation": {}}')


NAMES = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MPI_LOCALNRANKS",
         "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
         "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE",
         "SLURMD_NODENAME", "SLURM_JOBID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_LOCALID",
         "SLURM_NNODES", "SLURM_NODEID", "SLURM_NODELIST", "SLURM_NPROCS", "SLURM_NTASKS",
         "SLURM_PROCID", "SLURM_STEPID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST",
         "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
         "SLURM_TASKS_PER_NODE", "HOSTNAME"]


def env(**kv):
    out = b""
    for k, v in kv.items():
        v = v.encode()
        out += u8(NAMES.index(k)) + u8(len(v)) + v
    return out


def engine_seeds():
    write("engine_env", "slurm_step", env(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="5",
                                          SLURM_LOCALID="1", SLURM_NTASKS="8",
                                          SLURM_STEP_NODELIST="n[1-3,7]",
                                          SLURM_STEP_NUM_NODES="4", SLURMD_NODENAME="n2",
                                          SLURM_STEP_TASKS_PER_NODE="2(x4)"))
    write("engine_env", "openmpi", env(OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="4",
                                       OMPI_COMM_WORLD_LOCAL_RANK="1",
                                       OMPI_COMM_WORLD_LOCAL_SIZE="2", MASTER_ADDR="10.0.0.1"))
    write("engine_env", "mpich", env(PMI_RANK="1", PMI_SIZE="2", MPI_LOCALRANKID="1",
                                     MPI_LOCALNRANKS="2", MASTER_PORT="29400"))
    write("engine_env", "hostlist", env(SLURM_JOB_NODELIST="gpu[08-10]-a,login,n[1,3-4]",
                                        SLURM_TASKS_PER_NODE="2(x3),1"))


def host_seeds():
    write("hostfile", "slots", "# two nodes\nnode1 slots=2\nnode2 slots=4 max_slots=4\n\n"
                               "10.0.0.3\n[::1] slots=1\nh1:2,h2,h3:4")
    write("hostfile", "list", "\nuser@node1:2,node2")


def spec_seeds():
    kMagic, kMagicWarm = 0x33465444, 0x34465444
    def strs(*e): return u32(len(e)) + b"".join(u32(len(x)) + x for x in e)
    def ints(*v): return u32(len(v)) + b"".join(u32(x) for x in v)
    # Per worker: environment, own argv (none: the server's), CPUs, memory policy and nodes.
    cold = u32(kMagic) + u32(2) + u32(1234)
    cold += u32(5) + u32(6) + strs(b"RANK=0", b"WORLD_SIZE=2") + strs() + ints() + u32(0) + ints()
    cold += u32(7) + u32(8) + strs(b"RANK=1", b"WORLD_SIZE=2", b"")
    cold += strs(b"prog", b"--local_rank=1") + ints(2, 3) + u32(2) + ints(0)
    write("forkserver_spec", "cold_two_ranks", u8(0) + cold)
    warm = u32(kMagicWarm) + u32(1) + u32(99) + u32(2) + u32(4) + b"prog" + u32(3) + b"--x"
    warm += strs(b"RANK=0") + strs() + ints(1) + u32(0) + ints()
    write("forkserver_spec", "warm_one_rank", u8(1 | (2 << 1)) + warm)


def mlflow_seeds():
    write("mlflow_response", "experiment_created", '{"experiment_id": "7"}')
    write("mlflow_response", "experiment_found",
          '{"experiment": {"experiment_id": "7", "name": "x", "lifecycle_stage": "active"}}')
    write("mlflow_response", "run", json.dumps({"run": {"info": {
        "run_id": "abc", "experiment_id": "7", "artifact_uri": "mlflow-artifacts:/7/abc",
        "status": "RUNNING"}, "data": {}}}))


def codec_seeds():
    write("codec", "string", u8(0) + s("hello"))
    write("codec", "vector_int64", u8(1) + u64(3) + i64(1) + i64(-2) + i64(3))
    write("codec", "vector_string", u8(2) + u64(2) + s("a") + s("bc"))
    write("codec", "map_string_doubles", u8(3) + u64(1) + s("lr") + u64(2) +
          struct.pack("<dd", 0.1, 0.01))
    write("codec", "tuple", u8(4) + struct.pack("<i", 7) + u8(1) + s("opt") + u8(1))
    write("codec", "set_int32", u8(5) + u64(2) + struct.pack("<ii", 1, 5))
    tensor = u8(6) + u8(3) + u64(2) + i64(2) + i64(2) + struct.pack("<4f", 1, 2, 3, 4)
    write("codec", "tensor_float_grad", u8(6) + tensor)
    write("codec", "tensor_undefined", u8(6) + u8(0) + u8(0))
    write("codec", "state_dict", u8(7) + u64(2) + s("w") + tensor + s("b") +
          u8(4) + u8(1) + u64(1) + i64(2) + i64(5) + i64(6))
    write("codec", "vector_tensor", u8(8) + u64(1) + u8(2) + u8(1) + u64(0) + struct.pack("<h", 9))
    write("codec", "map_pairs", u8(9) + u64(1) + struct.pack("<i", 3) + struct.pack("<f", 0.5) +
          s("x"))


def elastic_seed():
    try:
        import torch
    except ImportError:
        print("make_seeds: no torch here, the elastic_commit seed is left as it is", file=sys.stderr)
        return
    import io
    meta = {"dtrain.elastic.step": "12", "dtrain.elastic.epoch": "1",
            "dtrain.elastic.offset": "48", "dtrain.elastic.samples_seen": "112",
            "dtrain.elastic.world_size": "2", "dtrain.elastic.dataset_size": "64"}
    commit = {"format": "dtrain.elastic.zero/1",
              "model": {"fc.weight": torch.ones(2, 2), "fc.bias": torch.zeros(2)},
              "optim": [{"exp_avg": torch.zeros(3), "step": 4}, {"exp_avg": torch.zeros(3)}],
              "metadata": json.dumps(meta), "rng": torch.get_rng_state()}
    buf = io.BytesIO()
    torch.save(commit, buf)
    write("elastic_commit", "zero_commit", buf.getvalue())


def delta_commits(table):
    """The table's commits (version order) as lists of actions, without the per-file stats and
    commitInfo (they are read by nobody here and make the seeds longer than fuzz.sh's
    -max_len)."""
    log = os.path.join(table, "_delta_log")
    commits = []
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
        actions = []
        for line in open(os.path.join(log, name)):
            a = json.loads(line)
            if "commitInfo" in a:
                continue
            for kind in ("add", "remove"):
                if kind in a:
                    a[kind].pop("stats", None)
                    a[kind].pop("tags", None)
            actions.append(a)
        commits.append(actions)
    return commits


def commit_text(actions):
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)


def data_seeds(tables):
    """delta_log: real tables' logs, version 0 and one later commit at a time (whole logs run
    past -max_len), those of 4096 bytes at most; deletion_vector: every vector of the DV tables, inline and in its file."""
    if not os.path.isdir(os.path.join(tables, "delta_dv")):
        print("make_seeds: no data tables in %s (run the data tests, or give --tables); the "
              "deletion_vector and delta_log seeds are left as they are" % tables, file=sys.stderr)
        return
    for name in ("delta", "delta_part", "delta_mapped", "delta_mapped_id", "delta_dv",
                 "delta_dv_part", "delta_dv_moved", "delta_v2ck", "delta_variant"):
        commits = delta_commits(os.path.join(tables, name))
        for v in range(len(commits)):
            picked = [commits[0]] if v == 0 else [commits[0], commits[v]]
            text = "\0".join(commit_text(c) for c in picked)
            if len(text) <= 4096:  # libFuzzer cuts longer inputs at fuzz.sh's -max_len
                write("delta_log", "%s_v%d" % (name, v), text)
        whole = "\0".join(commit_text(c) for c in commits)
        if len(whole) <= 4096:
            write("delta_log", "%s_all" % name, whole)

    def descriptor_head(dv, stored):
        offset = dv.get("offset")
        return (u8(1 if stored else 0) + u32(dv["sizeInBytes"]) + u32(dv["cardinality"]) +
                u32(0xFFFFFFFF if offset is None else offset))

    def dv_path(table, dv):
        if dv["storageType"] == "p":
            return dv["pathOrInlineDv"].replace("file://", "", 1)
        text = dv["pathOrInlineDv"]
        prefix, code = text[:-20], text[-20:]
        raw = b""
        Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
        for i in range(0, 20, 5):
            v = 0
            for ch in code[i:i + 5]:
                v = v * 85 + Z85.index(ch)
            raw += struct.pack(">I", v)
        import uuid
        return os.path.join(table, prefix, "deletion_vector_%s.bin" % uuid.UUID(bytes=raw))

    n = 0
    dirs = [os.path.join(tables, t) for t in ("delta_dv", "delta_dv_part", "delta_dv_moved")]
    bad = os.path.join(tables, "delta_dv_bad")
    dirs += [os.path.join(bad, c) for c in ("crc", "magic", "truncated", "cardinality")]
    for table in dirs:
        for actions in delta_commits(table):
            for a in actions:
                dv = (a.get("add") or {}).get("deletionVector")
                if not dv:
                    continue
                if dv["storageType"] == "i":
                    data = descriptor_head(dv, False) + dv["pathOrInlineDv"].encode()
                else:
                    data = descriptor_head(dv, True) + open(dv_path(table, dv), "rb").read()
                write("deletion_vector", "%s_%d" % (os.path.basename(table), n), data)
                n += 1
    # The tables' vectors are small (array containers): pyroaring's bitset and run containers
    # too, framed as a DV file (a bitset container is 8 KiB: fuzz.sh lets this target's
    # inputs be that long).
    import pyroaring
    import zlib
    for name, rows in (("pyroaring_bitset", range(0, 10000, 2)), ("pyroaring_runs", range(70000, 200000))):
        bitmap = struct.pack("<I", 1681511377) + pyroaring.BitMap64(rows).serialize()
        framed = b"\x01" + struct.pack(">I", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))
        dv = {"sizeInBytes": len(bitmap), "cardinality": len(rows), "offset": 1}
        write("deletion_vector", name, descriptor_head(dv, True) + framed)


if __name__ == "__main__":
    tables = os.path.join(HERE, "..", "..", "build-torch2", "tests", "data_tables")
    if len(sys.argv) == 3 and sys.argv[1] == "--tables":
        tables = sys.argv[2]
    elif len(sys.argv) != 1:
        sys.exit("usage: make_seeds.py [--tables DIR]")
    data_seeds(os.path.abspath(tables))
    store_seeds()
    config_seeds()
    engine_seeds()
    host_seeds()
    spec_seeds()
    mlflow_seeds()
    codec_seeds()
    elastic_seed()
