"""Best accuracy so far over wall time, dtrain::tune vs Ray Tune, from tune_time_to_best.py.

    python bench/tune_time_to_best.py > out.txt; python bench/tune_time_plot.py out.txt OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def staircase(reports):
    xs, ys, best = [0.0], [None], None
    for s, acc in reports:
        if best is None or acc > best:
            best = acc
            xs.append(s)
            ys.append(best)
    return xs[1:], ys[1:]


def main():
    text, out = sys.argv[1], sys.argv[2]
    data = json.loads([l for l in open(text) if l.startswith('{"machine"')][-1])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in (("dtrain", "dtrain::tune (C++ trials)"), ("ray", "Ray Tune 2.60 (PyTorch trials)")):
        d = data[key]
        xs, ys = staircase(d["reports"])
        xs.append(d["seconds"])
        ys.append(ys[-1])
        ax.step(xs, ys, where="post", label=f"{label}: search {d['seconds']:.0f} s, {d['epochs']} epochs")
    ax.axhline(data["target_accuracy"], color="gray", ls=":", lw=1, label=f"target {data['target_accuracy']:.4f}")
    ax.set_xlabel("seconds since the search started")
    ax.set_ylabel("best validation accuracy so far")
    ax.set_ylim(bottom=0.75)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"ASHA over 27 configs, 2-process trials ({data['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
