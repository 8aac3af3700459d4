#!/usr/bin/env python3
"""Data loading: samples/s delivered to the training loop by dtrain::data (bench/data_bench,
C++), by Petastorm's PyTorch reader and by a PyTorch DataLoader over pyarrow
(bench/data_bench_peer.py), from the same Parquet files (Fashion-MNIST, written by
examples/fashion_mnist/write_tables.py: 60 row groups of 1000 rows), 2 ranks at once; then
the example's MLP trained from that table (--data parquet:DIR) against from memory (the IDX
files), and the reader's headroom: its delivery rate over the MLP's training rate. Each
figure is the sum over the ranks of each rank's samples/s. The runs are interleaved (--repeat),
medians printed, and the machine and its load named. Never fails on timing.

    python3 bench/data_bench.py [--build-dir build] [--repeat 3] [--epochs 2] [--tables DIR]

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


def two_ranks(dtrain, argv):
    """Global samples/s of a 2-rank `dtrain run` of argv (sum of the ranks' rates)."""
    lines = [j for j in json_lines(run([dtrain, "run", "--nproc-per-node", "2"] + argv))
             if "rank" in j]
    if len(lines) != 2:
        sys.exit("expected 2 rank results from %s, got %s" % (argv, lines))
    return sum(j["samples_per_s"] for j in lines), max(j["peak_rss_mb"] for j in lines)


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
    ap.add_argument("--tables", help="write_tables.py's OUT (written to a temporary dir if absent)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    dtrain = os.path.join(build, "tools", "dtrain")
    py = venv_python()
    pst = subprocess.run([os.path.join(HERE, "petastorm_env.sh")], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    tmp = None
    tables = a.tables
    if not tables:
        tmp = tempfile.TemporaryDirectory(prefix="dtrain-data-bench-")
        tables = tmp.name
        run([py, os.path.join(ROOT, "examples", "fashion_mnist", "write_tables.py"), tables])
    train = os.path.join(tables, "parquet", "train")
    ep = ["--epochs", str(a.epochs)]
    rows = {"dtrain::data": [], "petastorm": [], "dataloader+pyarrow": [], "mlp_parquet": [],
            "mlp_memory": []}
    rss = {}
    print("machine:", machine(), flush=True)
    for i in range(a.repeat):
        r, m = two_ranks(dtrain, [os.path.join(build, "bench", "data_bench"), "--data",
                                  "parquet:" + train] + ep)
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
        fm = [os.path.join(build, "examples", "fashion_mnist"), "--epochs", "1", "--no-eval",
              "--log-every", "0"]
        for key, extra in (("mlp_parquet", ["--data", "parquet:" + train]), ("mlp_memory", [])):
            out = run([dtrain, "run", "--nproc-per-node", "2"] + fm + extra)
            rows[key].append([j for j in json_lines(out) if "samples_per_s" in j][-1]["samples_per_s"])
        print("round %d: %s" % (i + 1, {k: round(v[-1]) for k, v in rows.items()}), flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    d = med["dtrain::data"]
    print("\nsamples/s delivered to the training loop, 2 ranks, batch 64, %d epochs of 60000 rows"
          " (median of %d; %s)" % (a.epochs, a.repeat, machine()))
    for k in ("dtrain::data", "petastorm", "dataloader+pyarrow"):
        print("  %-20s %9.0f  (dtrain/%s %.2fx; peak RSS per rank %.0f MB)"
              % (k, med[k], k, d / med[k], rss[k]))
    print("MLP (784-512-256-10) training, 2 ranks: from Parquet %.0f samples/s, from memory %.0f"
          " (ratio %.2f); reader headroom: it delivers %.1fx what the MLP trains on"
          % (med["mlp_parquet"], med["mlp_memory"], med["mlp_parquet"] / med["mlp_memory"],
             d / med["mlp_parquet"]))
    if a.json:
        json.dump({"median": med, "runs": rows, "peak_rss_mb": rss, "machine": machine()},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
