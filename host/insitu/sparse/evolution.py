"""The evolutionary search of eq. 5 (tiny-training appendix D)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from insitu.errors import UsageError
from insitu.sparse.objective import CHOICES, Sampler, SearchResult, as_table
from insitu.sparse.scheme import Scheme

__all__ = ["evolutionary_search"]


def evolutionary_search(contrib, memory_fn: Callable[[Scheme], int], budget: int, evaluations: int = 5000,
                        seed: int = 0, *, population: int | None = None, parent_ratio: float = 0.25,
                        mutation_ratio: float = 0.5, mutate_prob: float = 0.05, progress=None,
                        keep: int = 1, min_distance: int = 0) -> SearchResult:
    """Evolutionary search of eq. 5 (the paper's appendix D; the evolution of OFA/MCUNet):

    * a population of ``population`` distinct feasible random schemes (default: evaluations / 20,
      within 20..100: enough generations for small budgets);
    * each generation keeps the top ``parent_ratio`` as parents, and refills the population with
      mutants (``mutation_ratio`` of it) and crossovers of random parents;
    * mutation: with probability ``mutate_prob`` per gene, ``k`` moves by ±1..3 and a layer's
      ratio changes to another value of {0, 1/8, 1/4, 1/2, 1}; crossover: each gene (and ``k``)
      from either parent;
    * a child over the budget is rejected and another drawn (the paper's setup); a child already
      sampled is rejected too.

    Every new scheme sampled (its memory planned), feasible or not, is one of ``evaluations``:
    the same unit as :func:`random_search`'s, so that both get the same planning work.
    """
    table = as_table(contrib)
    if population is None:
        population = int(np.clip(int(evaluations) // 20 if isinstance(evaluations, (int, np.integer)) else 100, 20, 100))
    if population < 2 or not 0 < parent_ratio < 1 or not 0 <= mutation_ratio <= 1 or not 0 < mutate_prob <= 1:
        raise UsageError("evolutionary search: population >= 2, 0 < parent_ratio < 1, 0 <= mutation_ratio <= 1 "
                         "and 0 < mutate_prob <= 1")
    s = Sampler(table, memory_fn, budget, evaluations, "evolutionary", progress)
    rng = np.random.default_rng(seed)
    L = table.L
    pop: list[tuple[float, tuple]] = []
    while len(pop) < population and not s.done:
        genome = s.random_genome(rng)
        value = s.offer(*genome)
        if value is not None:
            pop.append((value, table.canonical(*genome)))
    n_parents = max(1, int(round(parent_ratio * population)))
    n_mutants = int(round(mutation_ratio * population))
    n_parents = min(n_parents, population - 1)

    def mutate(genome):
        k0, genes0 = genome
        k, genes = k0, list(genes0)
        while (k, tuple(genes)) == (k0, genes0):             # at least one change
            if rng.random() < mutate_prob:
                k = int(np.clip(k + int(rng.choice((-3, -2, -1, 1, 2, 3))), 1, L))
            for i in range(L - 1):
                if rng.random() < mutate_prob:
                    genes[i] = int((genes[i] + rng.integers(1, len(CHOICES))) % len(CHOICES))
            if L == 1:
                break
        return k, tuple(genes)

    def crossover(a, b):
        k = a[0] if rng.random() < 0.5 else b[0]
        pick = rng.random(L - 1) < 0.5
        return k, tuple(int(x if p else y) for x, y, p in zip(a[1], b[1], pick))

    while not s.done and pop:
        pop.sort(key=lambda vg: (-vg[0], vg[1]))
        parents = pop[:n_parents]
        children: list[tuple[float, tuple]] = []
        stale = 0                 # draws in a row that were already sampled (a converged population)
        while len(parents) + len(children) < population and not s.done:
            if stale >= 10 * population:
                child = s.random_genome(rng)                 # an immigrant, once the neighbourhood is spent
            elif len(children) < n_mutants or len(parents) < 2:
                child = mutate(parents[int(rng.integers(len(parents)))][1])
            else:
                i, j = rng.choice(len(parents), size=2, replace=False)
                child = crossover(parents[i][1], parents[j][1])
            before = len(s.curve)
            value = s.offer(*child)
            stale = stale + 1 if len(s.curve) == before else 0
            if value is not None:
                children.append((value, table.canonical(*child)))
        pop = parents + children
    return s.result(keep, min_distance)
