"""The E²-Train figure: accuracy vs energy per row (the paper's Fig. 4) and test accuracy vs the
energy spent so far (its Fig. 5, the convergence curves in energy)."""

from __future__ import annotations

from pathlib import Path

from insitu.io import save_figure


def plot_experiment(summary: dict, path) -> Path:
    """Write one PNG with both panels; energies are relative to the 32-bit SGD baseline's total."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base_j = summary["runs"]["sgd32"]["counted"]["energy_j"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for row in summary["rows"]:
        ratio = row["energy_j"] / base_j
        left.scatter(ratio, 100 * row["accuracy"], s=60)
        left.annotate(row["row"], (ratio, 100 * row["accuracy"]), textcoords="offset points", xytext=(5, 4))
        history = summary["runs"][row["row"]]["history"]
        right.plot([h["energy_j"] / base_j for h in history], [100 * h["test_accuracy"] for h in history],
                   marker="o", label=row["row"])
    left.set_xlabel("training energy / 32-bit SGD (estimated)")
    left.set_ylabel("test accuracy (%)")
    left.set_title("accuracy vs energy")
    left.set_xlim(left=0)
    right.set_xlabel("energy spent so far / 32-bit SGD total (estimated)")
    right.set_ylabel("test accuracy (%)")
    right.set_title("convergence in energy (per epoch)")
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)
