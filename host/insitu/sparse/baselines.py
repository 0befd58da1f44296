"""What the evolutionary search is measured against: random search (the paper's Fig. 13 baseline)
and the exact optimum by enumeration (small tables: the tests' reference)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from insitu.errors import InsituError
from insitu.sparse.objective import CHOICES, Sampler, SearchResult, as_table
from insitu.sparse.scheme import Scheme

__all__ = ["random_search", "brute_force"]


def random_search(contrib, memory_fn: Callable[[Scheme], int], budget: int, evaluations: int = 5000,
                  seed: int = 0, *, progress=None,
                  keep: int = 1, min_distance: int = 0) -> SearchResult:
    """The baseline of the paper's Fig. 13: ``evaluations`` distinct random schemes
    (:meth:`Sampler.random_genome`), the best one within the budget kept."""
    table = as_table(contrib)
    s = Sampler(table, memory_fn, budget, evaluations, "random", progress)
    rng = np.random.default_rng(seed)
    while not s.done:
        s.offer(*s.random_genome(rng))
    return s.result(keep, min_distance)


def brute_force(contrib, memory_fn: Callable[[Scheme], int], budget: int) -> tuple[float, Scheme]:
    """The exact optimum of eq. 5 by enumeration of every canonical scheme (small tables only:
    ``sum_k 5**(k-1)`` schemes for L layers): per depth k, the schemes in decreasing objective
    until the first one within the budget."""
    table = as_table(contrib)
    L = table.L
    if (len(CHOICES) ** L - 1) // (len(CHOICES) - 1) > 2_000_000:
        raise ValueError(f"brute force: {L} layers is too many schemes to enumerate")
    gain = np.concatenate([np.zeros((L - 1, 1)), table.weight], axis=1)     # gene 0: frozen
    best: tuple[float, tuple] | None = None
    for k in range(1, L + 1):
        reach = np.arange(L - k, L - 1)
        combos = np.indices((len(CHOICES),) * len(reach)).reshape(len(reach), -1).T if len(reach) else \
            np.zeros((1, 0), dtype=int)
        values = table.bias[k] + gain[reach[None, :], combos].sum(axis=1)
        for j in np.argsort(-values, kind="stable"):
            if best is not None and values[j] <= best[0] - 1e-12:
                break
            genes = [0] * (L - 1)
            for i, g in zip(reach, combos[j]):
                genes[int(i)] = int(g)
            genome = (k, tuple(genes))
            if memory_fn(table.scheme(*genome)) <= budget:
                value = table.objective(*genome)
                if best is None or value > best[0]:
                    best = (value, genome)
                break
    if best is None:
        raise InsituError("brute force: no scheme within the budget")
    return best[0], table.scheme(*best[1])
