#!/usr/bin/env python3
"""Renders a dtrain timeline (Chrome-trace JSON, one pid per rank) to a PNG with matplotlib:
one lane per rank and thread, a bar per span (nested spans drawn thinner on top), coloured
by name. An offline stand-in for Perfetto's UI, which needs the network.

    python tools/timeline_render.py TIMELINE.json OUT.png [--from-ms MS] [--window-ms MS]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float, default=None, help="start of the window (default: the 5th forward)")
    ap.add_argument("--window-ms", type=float, default=None, help="length of the window (default: two steps)")
    a = ap.parse_args()
    with open(a.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in events)
    if a.from_ms is None:
        fwd = sorted(e["ts"] for e in events if e["name"] == "forward" and e["pid"] == 0)
        start = (fwd[min(4, len(fwd) - 1)] - t0) / 1000.0 if fwd else 0.0
    else:
        start = a.from_ms
    window = a.window_ms
    if window is None:
        fwd = sorted(e["ts"] for e in events if e["name"] == "forward" and e["pid"] == 0)
        window = (fwd[min(6, len(fwd) - 1)] - fwd[min(4, len(fwd) - 1)]) / 1000.0 if len(fwd) > 1 else 150.0
        window = window if window > 0 else 150.0
    end = start + window
    lanes = sorted({(e["pid"], e["tid"]) for e in events})
    names = sorted({e["name"] for e in events})
    cmap = plt.get_cmap("tab10")
    color = {n: cmap(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(14, 1.1 + 0.8 * len(lanes)))
    for lane, (pid, tid) in enumerate(lanes):
        spans = sorted((e for e in events if e["pid"] == pid and e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in spans:
            b = (e["ts"] - t0) / 1000.0
            d = e["dur"] / 1000.0
            while open_ends and open_ends[-1] <= b:
                open_ends.pop()
            depth = len(open_ends)
            open_ends.append(b + d)
            if b + d < start or b > end:
                continue
            h = 0.7 * (0.75 ** depth)
            ax.broken_barh([(b, max(d, 0.01))], (lane - h / 2, h), facecolors=color[e["name"]], edgecolor="black",
                           linewidth=0.2)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {p} / thread {t}" for p, t in lanes])
    ax.set_xlim(start, end)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first span")
    ax.set_title(f"dtrain timeline: {a.trace.split('/')[-1]} ({len(events)} spans, {len(lanes)} lanes)")
    ax.legend(handles=[Patch(color=color[n], label=n) for n in names], loc="upper center",
              bbox_to_anchor=(0.5, -0.45), ncol=min(5, len(names)), fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    main()
