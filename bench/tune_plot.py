"""Plots the accuracy of every trial over its epochs for the example's two searches.

    python bench/tune_plot.py STORAGE OUT.png   (STORAGE: tune_example's --storage)

Reads STORAGE/{grid,asha}/tuner_state.json (written by dtrain::tune) - no re-run needed.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    storage, out = sys.argv[1], sys.argv[2]
    names = [n for n in ("grid", "asha") if os.path.exists(os.path.join(storage, n, "tuner_state.json"))]
    # One colour per learning rate, one line style per hidden width (27 trials: no legend per trial).
    lrs, hiddens = set(), set()
    for name in names:
        for t in json.load(open(os.path.join(storage, name, "tuner_state.json")))["trials"]:
            lrs.add(t["config"]["lr"])
            hiddens.add(t["config"]["hidden"])
    colours = dict(zip(sorted(lrs), ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]))
    styles = dict(zip(sorted(hiddens), ["-", "--", ":", "-."]))
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        state = json.load(open(os.path.join(storage, name, "tuner_state.json")))
        epochs = 0
        for t in state["trials"]:
            h = t["history"]
            epochs += len(h)
            c = t["config"]
            ax.plot([r["training_iteration"] for r in h], [r["accuracy"] for r in h], marker="o", ms=2.5,
                    color=colours.get(c["lr"], "gray"), linestyle=styles.get(c["hidden"], "-"), lw=1, alpha=0.8)
        best = max((r["accuracy"] for t in state["trials"] for r in t["history"]), default=0)
        title = f"full grid (FIFO, {len(state['trials'])} trials)" if name == "grid" else "ASHA"
        ax.set_title(f"{title}: {epochs} epochs, best {best:.4f}")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation accuracy")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=c, label=f"lr={lr:g}") for lr, c in colours.items()]
    handles += [Line2D([], [], color="black", linestyle=s, label=f"hidden={h}") for h, s in styles.items()]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="lower right")
    fig.suptitle("dtrain::tune on Fashion-MNIST, 2-process trials (2-core Debian 12 VM, shared)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
