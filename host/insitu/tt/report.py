"""Reports of the TT experiment: the Table 1 layout and the figure of ranks and accuracy per epoch."""

from __future__ import annotations

from pathlib import Path

from insitu.io import save_figure

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


def _rank_text(ranks) -> str:
    return ", ".join("-".join(str(r) for r in layer) for layer in ranks)


def history_figure(results: list[dict]):
    """The figure of :func:`plot_history` (a matplotlib Figure, Agg backend; the caller closes it).

    Each run's history may hold any number (>= 1) of epochs. The ranks panel draws the internal TT
    ranks per epoch of every run whose history records them for two or more epochs; the others
    (dense runs, single-epoch runs) are named there in text, so the panel is never left blank.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    if not results:
        raise ValueError("plot_history: no results to plot")
    for r in results:
        if not r.get("history"):
            raise ValueError(f"plot_history: the {r.get('variant', '?')} run has no epochs in its history")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    styles = ["-", "--", ":", "-."]
    variant_handles, rank_styles, notes = [], {}, []
    all_epochs = []
    for r in results:
        history = r["history"]
        epochs = [h["epoch"] for h in history]
        all_epochs += epochs
        line, = top.plot(epochs, [h["test_accuracy"] for h in history], marker="o",
                         label=f"{r['variant']} test")
        top.plot(epochs, [h["train_accuracy"] for h in history], ls="--", marker=".",
                 color=line.get_color(), label=f"{r['variant']} train")
        ranks = [h.get("ranks") for h in history]
        if any(rk is None for rk in ranks):
            notes.append(f"{r['variant']}: dense layers, no TT ranks")
            continue
        if len(ranks) < 2:
            notes.append(f"{r['variant']}: ranks of one epoch only ({_rank_text(ranks[-1])})")
            continue
        # One colour per variant (as above), one line style per internal rank.
        internal = [(k, n) for k in range(len(ranks[0])) for n in range(1, len(ranks[0][k]) - 1)]
        for i, (k, n) in enumerate(internal):
            style = styles[i % len(styles)]
            bottom.plot(epochs, [rk[k][n] for rk in ranks], ls=style, marker=".",
                        color=line.get_color())
            rank_styles.setdefault(f"layer {k + 1} R{n}", style)
        variant_handles.append(Line2D([], [], color=line.get_color(), label=r["variant"]))
    top.set_ylabel("accuracy")
    top.set_title("TT training on FashionMNIST")
    top.legend(fontsize=7, ncol=2)
    bottom.set_ylabel("TT rank")
    bottom.set_xlabel("epoch")
    bottom.set_title("internal TT ranks per epoch", fontsize=9)
    if bottom.lines:
        style_handles = [Line2D([], [], color="grey", ls=s, label=name) for name, s in rank_styles.items()]
        bottom.legend(handles=variant_handles + style_handles, fontsize=7, ncol=2, loc="lower right")
        bottom.set_ylim(bottom=0)                      # so integer rank ticks exist even when flat
        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
        if notes:
            bottom.text(0.01, 0.02, "\n".join(notes), transform=bottom.transAxes, fontsize=7,
                        va="bottom", ha="left", bbox=dict(facecolor="white", alpha=0.8, lw=0))
    else:
        bottom.set_yticks([])
        bottom.text(0.5, 0.5, "no rank history to draw (needs two or more epochs of a TT run)\n"
                    + "\n".join(notes), transform=bottom.transAxes, fontsize=8,
                    ha="center", va="center")
    for ax in (top, bottom):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if min(all_epochs) == max(all_epochs):             # one epoch: one tick, the axis around it
        bottom.set_xlim(all_epochs[0] - 0.5, all_epochs[0] + 0.5)
        bottom.set_xticks([all_epochs[0]])
    fig.tight_layout()
    return fig


def plot_history(results: list[dict], path) -> Path:
    """PNG: test and train accuracy per epoch (top), TT ranks per core (bottom)."""
    fig = history_figure(results)
    import matplotlib.pyplot as plt                    # after history_figure chose the backend

    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)
