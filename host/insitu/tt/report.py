"""Reports of the TT experiment: the Table 1 layout and the figure of ranks and accuracy per epoch."""

from __future__ import annotations

import io
from pathlib import Path

from insitu.io import atomic_write

#: The paper's Table 1 (test accuracy, memory reduction), printed beside our figures.
PAPER_TABLE1 = {
    "dense": (0.8927, None),
    "float": (0.8803, 31.4),
    "fixed": (0.8667, 243.0),
    "float-prior": (0.8788, 43.1),
    "fixed-prior": (0.8486, 292.0),
}


def format_table(results: list[dict]) -> str:
    """One row per variant, as in the paper's Table 1, with the paper's figures alongside."""
    head = (f"{'variant':12s} {'train acc':>9s} {'test acc':>9s} {'params':>8s} {'memory bits':>12s} "
            f"{'reduction':>9s}  {'paper: test acc':>15s} {'reduction':>9s}  {'epochs':>6s} {'time':>7s}")
    lines = [head, "-" * len(head)]
    for r in results:
        paper_acc, paper_red = PAPER_TABLE1[r["variant"]]
        paper_red = f"{paper_red:.1f}x" if paper_red else "n/a"
        lines.append(f"{r['variant']:12s} {r['train_accuracy']:9.4f} {r['test_accuracy']:9.4f} "
                     f"{r['parameters']:8d} {r['memory_bits']:12d} {r['memory_reduction']:8.1f}x  "
                     f"{paper_acc:15.4f} {paper_red:>9s}  {r['epochs']:6d} {r['seconds']:6.0f}s")
    return "\n".join(lines)


def plot_history(results: list[dict], path) -> Path:
    """PNG: test and train accuracy per epoch (top), TT ranks per core (bottom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("plot_history: no results to plot")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    styles = ["-", "--", ":", "-."]
    for r in results:
        epochs = [h["epoch"] for h in r["history"]]
        line, = top.plot(epochs, [h["test_accuracy"] for h in r["history"]], marker="o",
                         label=f"{r['variant']} test")
        top.plot(epochs, [h["train_accuracy"] for h in r["history"]], ls="--", color=line.get_color(),
                 label=f"{r['variant']} train")
        ranks = [h["ranks"] for h in r["history"]]
        if ranks[0] is None or ranks[0] == ranks[-1]:
            continue                                   # dense, or no rank ever pruned
        # One colour per variant (as above), one line style per internal rank.
        internal = [(k, n) for k in range(len(ranks[0])) for n in range(1, len(ranks[0][k]) - 1)]
        for style, (k, n) in zip(styles * len(internal), internal):
            bottom.plot(epochs, [rk[k][n] for rk in ranks], ls=style, marker=".",
                        color=line.get_color(), label=f"{r['variant']} layer {k + 1} R{n}")
    top.set_ylabel("accuracy")
    top.set_title("TT training on FashionMNIST")
    top.legend(fontsize=7, ncol=2)
    bottom.set_ylabel("TT rank")
    bottom.set_xlabel("epoch")
    bottom.set_title("TT ranks of the runs that pruned (the others keep their initial ranks)", fontsize=9)
    if bottom.lines:
        bottom.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write(Path(path), buf.getvalue())
