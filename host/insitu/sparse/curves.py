"""The best-so-far curves of the searches (the paper's Fig. 13)."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from insitu.io import save_figure
from insitu.sparse.objective import SearchResult

__all__ = ["plot_curves"]


def plot_curves(results: Iterable[SearchResult], path, title: str = "") -> None:
    """The best-so-far curves (the paper's Fig. 13) as a PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for r in results:
        ax.plot(np.arange(1, len(r.curve) + 1), np.array([np.nan if v is None else v for v in r.curve]) * 100, label=f"{r.method} ({r.objective * 100:+.2f})")
    ax.set_xlabel("# sampled schemes (memory planned)")
    ax.set_ylabel("best Σ Δacc (percentage points)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)
