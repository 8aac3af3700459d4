#!/usr/bin/env python3
"""Data loading: samples/s delivered to the training loop by dtrain::data (bench/data_bench,
C++), by Petastorm's PyTorch reader and by a PyTorch DataLoader over pyarrow
(bench/data_bench_peer.py), from the same Parquet files (Fashion-MNIST, written by
examples/fashion_mnist/write_tables.py: 60 row groups of 1000 rows), 2 ranks at once; then
the example's MLP trained from that table (--data parquet:DIR) against from memory (the IDX
files), and the reader's headroom: its delivery rate over the MLP's training rate. Each
figure is the sum over the ranks of each rank's samples/s. The peers have no cache, so
dtrain::data is compared with its cache off (--cache-bytes 0); then again with its defaults
(the cache on: the first epoch decodes, later ones gather from memory). The MLP trains
--mlp-epochs epochs (default 3): the ratio Parquet / memory is given for the whole run, for
the first epoch (every row decoded) and for the later ones, with the share of the training
loop's time spent waiting for batches (data_seconds), and the job's wall time as its user
waits for it (data loading included). The runs are interleaved (--repeat; the MLP's two
in alternating order),
medians printed, and the machine and its load named with every round. Never fails on timing.

    python3 bench/data_bench.py [--build-dir build] [--repeat 3] [--epochs 2] [--mlp-epochs 3]
                                [--tables DIR] [--only-mlp]

Petastorm runs in its own venv (bench/petastorm_env.sh makes it: Petastorm 0.13.1 needs
pyarrow < 16 and so cannot live beside the project's pyarrow 25 / numpy 2).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def venv_python():
    return subprocess.run([os.path.join(ROOT, "scripts", "python_env.sh")], capture_output=True,
                          text=True, check=True).stdout.strip().splitlines()[-1]


def json_lines(text):
    out = []
    for line in text.splitlines():
        b = line.find("{")
        if b >= 0:
            try:
                out.append(json.loads(line[b:]))
            except json.JSONDecodeError:
                pass
    return out


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        sys.exit("benchmark run failed (%d): %s\n%s\n%s" % (r.returncode, " ".join(cmd),
                                                             r.stdout[-3000:], r.stderr[-3000:]))
    return r.stdout


def rank_lines(dtrain, argv):
    lines = [j for j in json_lines(run([dtrain, "run", "--nproc-per-node", "2"] + argv))
             if "rank" in j]
    if len(lines) != 2:
        sys.exit("expected 2 rank results from %s, got %s" % (argv, lines))
    return lines


def two_ranks(dtrain, argv):
    """Global samples/s of a 2-rank `dtrain run` of argv (sum of the ranks' rates)."""
    lines = rank_lines(dtrain, argv)
    return sum(j["samples_per_s"] for j in lines), max(j["peak_rss_mb"] for j in lines)


def per_epoch(lines, epochs):
    """bench/data_bench's ranks: global samples/s of the first epoch and of the later ones,
    and the largest rank's peak RSS."""
    first = sum(j["samples"] / epochs / j["epoch_seconds"][0] for j in lines)
    later = sum(j["samples"] / epochs * (epochs - 1) / sum(j["epoch_seconds"][1:])
                for j in lines) if epochs > 1 else float("nan")
    return first, later, max(j["peak_rss_mb"] for j in lines)


def mlp(dtrain, fm, extra):
    """The example's JSON line: overall, first-epoch and later-epochs samples/s, data wait share."""
    t0 = time.monotonic()
    out = run([dtrain, "run", "--nproc-per-node", "2"] + fm + extra)
    wall = time.monotonic() - t0
    j = [j for j in json_lines(out) if "samples_per_s" in j][-1]
    es = j["epoch_seconds"]
    n = j["samples_per_s"] * j["seconds"] / len(es)  # samples per epoch, all ranks
    return {"all": j["samples_per_s"], "first": n / es[0],
            "later": n * (len(es) - 1) / sum(es[1:]) if len(es) > 1 else float("nan"),
            "wait": j["data_seconds"] / j["seconds"], "wall": wall}


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return "%s, %d cores (%s), load average %.1f" % (platform.node(), os.cpu_count(), cpu,
                                                     os.getloadavg()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--mlp-epochs", type=int, default=3)
    ap.add_argument("--tables", help="write_tables.py's OUT (written to a temporary dir if absent)")
    ap.add_argument("--only-mlp", action="store_true",
                    help="only the MLP from Parquet vs from memory and dtrain::data's own rates")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    if a.epochs < 2 or a.mlp_epochs < 2:
        sys.exit("--epochs and --mlp-epochs must be >= 2 (the first epoch decodes, later ones "
                 "show the cache)")
    build = os.path.abspath(a.build_dir)
    dtrain = os.path.join(build, "tools", "dtrain")
    py = venv_python()
    pst = None
    if not a.only_mlp:
        pst = subprocess.run([os.path.join(HERE, "petastorm_env.sh")], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
    tmp = None
    tables = a.tables
    if not tables:
        tmp = tempfile.TemporaryDirectory(prefix="dtrain-data-bench-")
        tables = tmp.name
        run([py, os.path.join(ROOT, "examples", "fashion_mnist", "write_tables.py"), tables])
    train = os.path.join(tables, "parquet", "train")
    ep = ["--epochs", str(a.epochs)]
    bench = [os.path.join(build, "bench", "data_bench"), "--data", "parquet:" + train] + ep
    rows = {k: [] for k in ("dtrain::data", "petastorm", "dataloader+pyarrow", "cached_first",
                            "cached_later", "private_first", "private_later", "mlp_parquet", "mlp_memory", "mlp_parquet_first",
                            "mlp_memory_first", "mlp_parquet_later", "mlp_memory_later",
                            "mlp_parquet_wait", "mlp_memory_wait", "mlp_parquet_wall",
                            "mlp_memory_wall")}
    rss = {}
    loads = []
    print("machine:", machine(), flush=True)
    fm = [os.path.join(build, "examples", "fashion_mnist"), "--epochs", str(a.mlp_epochs),
          "--no-eval", "--log-every", "0"]
    for i in range(a.repeat):
        load = [os.getloadavg()[0]]
        if not a.only_mlp:
            r, m = two_ranks(dtrain, bench + ["--cache-bytes", "0"])
            rows["dtrain::data"].append(r)
            rss["dtrain::data"] = m
            r, m = two_ranks(dtrain, [pst, os.path.join(HERE, "data_bench_peer.py"), "petastorm",
                                      train] + ep)
            rows["petastorm"].append(r)
            rss["petastorm"] = m
            r, m = two_ranks(dtrain, [py, os.path.join(HERE, "data_bench_peer.py"), "dataloader",
                                      train] + ep)
            rows["dataloader+pyarrow"].append(r)
            rss["dataloader+pyarrow"] = m
        for key, share in (("cached", "1"), ("private", "0")):
            first, later, m = per_epoch(rank_lines(dtrain, bench + ["--share-cache", share]),
                                        a.epochs)
            rows[key + "_first"].append(first)
            rows[key + "_later"].append(later)
            rss[key] = m
        runs = [("mlp_parquet", ["--data", "parquet:" + train]), ("mlp_memory", [])]
        for key, extra in runs if i % 2 == 0 else runs[::-1]:  # neither always goes first
            load.append(os.getloadavg()[0])
            f = mlp(dtrain, fm, extra)
            rows[key].append(f["all"])
            for part in ("first", "later", "wait", "wall"):
                rows[key + "_" + part].append(f[part])
        loads.append(load)
        print("round %d (load average %s): %s" % (
            i + 1, "/".join("%.1f" % x for x in load),
            {k: round(v[-1], 3 if k.endswith(("wait", "wall")) else 0)
             for k, v in rows.items() if v}),
            flush=True)
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    print("\n%s; median of %d interleaved rounds, load average per round %s"
          % (machine(), a.repeat, ", ".join("/".join("%.1f" % x for x in l) for l in loads)))
    if not a.only_mlp:
        d = med["dtrain::data"]
        print("samples/s delivered to the training loop, 2 ranks, batch 64, %d epochs of 60000 "
              "rows (dtrain::data with its cache off, as the peers have none)" % a.epochs)
        for k in ("dtrain::data", "petastorm", "dataloader+pyarrow"):
            print("  %-20s %9.0f  (dtrain/%s %.2fx; peak RSS per rank %.0f MB)"
                  % (k, med[k], k, d / med[k], rss[k]))
    print("dtrain::data with its defaults (cache on, shared by the host's ranks): first epoch %.0f"
          " samples/s (decoding), later epochs %.0f (row groups gathered from the cache); peak RSS"
          " per rank %.0f MB"
          % (med["cached_first"], med["cached_later"], rss["cached"]))
    print("  the cache shared by the host's ranks (the default under a launcher) / private to each"
          " rank: first epoch %.0f / %.0f samples/s (%.2fx), later epochs %.0f / %.0f (%.2fx); peak"
          " RSS per rank %.0f / %.0f MB (RSS counts every shared page a rank maps: the host holds"
          " them once)"
          % (med["cached_first"], med["private_first"], med["cached_first"] / med["private_first"],
             med["cached_later"], med["private_later"], med["cached_later"] / med["private_later"],
             rss["cached"], rss["private"]))
    print("MLP (784-512-256-10) training, 2 ranks, %d epochs, Parquet / memory samples/s:"
          % a.mlp_epochs)
    for part, what in (("", "whole run"), ("_first", "first epoch"), ("_later", "later epochs")):
        p, m = med["mlp_parquet" + part], med["mlp_memory" + part]
        print("  %-13s %7.0f / %7.0f  ratio %.2f  (rounds: %s)" % (
            what, p, m, p / m, ", ".join("%.2f" % (x / y) for x, y in
                                         zip(rows["mlp_parquet" + part], rows["mlp_memory" + part]))))
    print("  waiting for batches: %.1f%% of the loop's time from Parquet, %.1f%% from memory"
          % (100 * med["mlp_parquet_wait"], 100 * med["mlp_memory_wait"]))
    print("  the job as the user waits for it (dtrain run's start to its exit, data loading and"
          " process start included): %.2f s from Parquet, %.2f s from memory, memory / Parquet"
          " %.2f (rounds: %s)" % (
              med["mlp_parquet_wall"], med["mlp_memory_wall"],
              med["mlp_memory_wall"] / med["mlp_parquet_wall"],
              ", ".join("%.2f" % (m / p) for p, m in zip(rows["mlp_parquet_wall"],
                                                         rows["mlp_memory_wall"]))))
    print("reader headroom (its samples/s alone / what the MLP trains from Parquet): %.1fx while"
          " decoding (first epoch), %.1fx in later epochs"
          % (med["cached_first"] / med["mlp_parquet_first"],
             med["cached_later"] / med["mlp_parquet_later"]))
    if a.json:
        json.dump({"median": med, "runs": rows, "peak_rss_mb": rss, "load": loads,
                   "machine": machine()}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
