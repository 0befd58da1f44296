"""Eq. 5 of tiny-training as a search problem: the objective, the search space, the bookkeeping.

Maximize the summed contributions ``Δacc_b[k] + Σ_i Δacc_W[i, r_i]`` subject to
``memory(scheme) <= budget``. A scheme is ``(k, r_1 .. r_{L-1})``: ``k`` in ``1..L`` the number of
last layers whose biases train, ``r_i`` in ``{0, 1/8, 1/4, 1/2, 1}`` the weight ratio of layer
``i`` (0: frozen); the classifier (layer ``L``) always trains its weights
(:mod:`insitu.sparse.scheme`). Backpropagation must reach the earliest layer with trained weights
and every bias it passes trains too (:meth:`Scheme.bias_layers`), so the scheme that runs has
``k_eff = max(k, L - i_min)``: schemes are kept in that canonical form, and the objective uses
``Δacc_b[k_eff]``, the biases that really train (and whose memory the compiler plans).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from insitu.errors import InsituError, UsageError
from insitu.sparse.scheme import RATIOS, Scheme

__all__ = ["CHOICES", "Candidate", "ContributionTable", "SearchResult", "Sampler", "as_table", "distance", "shortlist"]

#: A layer's weight ratio in the search: 0 (frozen) or one of the scheme ratios.
CHOICES = (0.0, *RATIOS)


@dataclass
class ContributionTable:
    """Eq. 5's objective: ``bias[k]`` = Δacc_b[:k] (``bias[0]`` unused), ``weight[i, j]`` =
    Δacc_W of layer ``layers[i]`` at ``RATIOS[j]``; the last layer (classifier) always trains."""

    layers: list[str]
    bias: np.ndarray          # (L + 1,)
    weight: np.ndarray        # (L - 1, len(RATIOS))

    def __post_init__(self):
        self.bias = np.asarray(self.bias, dtype=np.float64)
        self.weight = np.asarray(self.weight, dtype=np.float64)
        L = len(self.layers)
        if L < 1 or self.bias.shape != (L + 1,) or self.weight.shape != (L - 1, len(RATIOS)):
            raise ValueError(f"contribution table: {L} layers need bias ({L + 1},) and weight "
                             f"({L - 1}, {len(RATIOS)}), got {self.bias.shape} and {self.weight.shape}")

    @property
    def L(self) -> int:
        return len(self.layers)

    # A genome is (k, genes): genes[i] in 0..4 indexes CHOICES for layer i < L - 1.
    def canonical(self, k: int, genes: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        trained = [i for i, g in enumerate(genes) if g]
        return max(int(k), self.L - trained[0] if trained else 1), tuple(genes)

    def objective(self, k: int, genes: tuple[int, ...]) -> float:
        k, genes = self.canonical(k, genes)
        return float(self.bias[k] + sum(self.weight[i, g - 1] for i, g in enumerate(genes) if g))

    def scheme(self, k: int, genes: tuple[int, ...]) -> Scheme:
        k, genes = self.canonical(k, genes)
        weights = {self.layers[i]: CHOICES[g] for i, g in enumerate(genes) if g}
        weights[self.layers[-1]] = 1.0
        return Scheme(k, weights)

    def genome(self, scheme: Scheme) -> tuple[int, tuple[int, ...]]:
        genes = [0] * (self.L - 1)
        for name, r in scheme.weights.items():
            i = self.layers.index(name)
            if i < self.L - 1:
                genes[i] = CHOICES.index(float(r))
        return self.canonical(max(1, scheme.bias_k), tuple(genes))


@dataclass
class Candidate:
    """A feasible scheme a search evaluated: its eq. 5 objective (Σ Δacc) and planned memory."""

    scheme: Scheme
    objective: float
    memory: int

    def to_json(self) -> dict:
        return {"scheme": self.scheme.to_json(), "scheme_text": self.scheme.describe(),
                "objective": self.objective, "memory_bytes": self.memory}


def distance(a: tuple, b: tuple) -> int:
    """Genes in which two genomes differ (the bias depth ``k`` counting as one gene)."""
    return int(a[0] != b[0]) + sum(1 for x, y in zip(a[1], b[1]) if x != y)


def shortlist(values: dict, keep: int, min_distance: int = 0, first: tuple | None = None) -> list:
    """The ``keep`` genomes of ``values`` (genome -> objective) to validate by training, best first:
    in decreasing objective, each genome that differs in at least ``min_distance`` genes
    (:func:`distance`) from every one already taken; places left over are filled by objective.

    Why a distance: eq. 5 adds contributions each measured alone, and the top of its ranking is
    crowded with near-copies of one large scheme (an evolutionary population converges), whose
    trainings all share the same misprediction; candidates a few genes apart give the training
    real alternatives to choose from. ``min_distance=0`` is the plain top ``keep``. ``first``: the
    genome to start from (a search's best-so-far, which a tie may rank second); it stays first."""
    if not isinstance(keep, (int, np.integer)) or keep < 1:
        raise UsageError(f"keep must be a positive integer, got {keep!r}")
    ranked = sorted(values, key=lambda g: (-values[g], g))
    picks: list = [first] if first is not None else []
    for g in ranked:
        if len(picks) >= keep:
            break
        if g not in picks and all(distance(g, p) >= min_distance for p in picks):
            picks.append(g)
    if len(picks) < keep:
        taken = set(picks)
        picks += [g for g in ranked if g not in taken][:keep - len(picks)]
    head = picks[:1] if first is not None else []
    return head + sorted(picks[len(head):], key=lambda g: (-values[g], g))


@dataclass
class SearchResult:
    """One search's outcome. An evaluation is one distinct scheme sampled and planned (its memory
    checked against the budget, the cost of a search): ``curve[n-1]`` is the best objective among
    the feasible schemes of the first ``n`` evaluations (None before the first feasible one), the
    x axis of the paper's Fig. 13. ``feasible`` counts the schemes within the budget."""

    method: str
    scheme: Scheme
    objective: float
    memory: int
    curve: list
    evaluations: int
    feasible: int
    seconds: float
    budget: int
    candidates: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"method": self.method, "scheme": self.scheme.to_json(), "scheme_text": self.scheme.describe(),
                "objective": self.objective, "memory_bytes": self.memory, "budget_bytes": self.budget,
                "evaluations": self.evaluations, "feasible": self.feasible, "seconds": self.seconds,
                "curve": list(self.curve), "candidates": [c.to_json() for c in self.candidates]}


class Sampler:
    """Shared bookkeeping of both searches: distinct schemes, the budget, the best-so-far curve.

    A candidate already sampled is rejected for free (its plan is known); a new one costs one
    evaluation whether or not it fits. ``max_tries`` bounds the draws (a small or tightly
    constrained space may hold fewer schemes than the evaluations asked for)."""

    def __init__(self, table: ContributionTable, memory_fn, budget: int, evaluations: int, method: str,
                 progress, max_tries: int | None = None):
        if not isinstance(evaluations, (int, np.integer)) or isinstance(evaluations, bool) or evaluations < 1:
            raise UsageError(f"evaluations must be a positive integer, got {evaluations!r}")
        if not isinstance(budget, (int, np.integer)) or budget < 1:
            raise UsageError(f"the budget must be a positive number of bytes, got {budget!r}")
        self.t, self.memory_fn, self.budget, self.evaluations = table, memory_fn, int(budget), int(evaluations)
        self.max_tries = int(max_tries if max_tries is not None else 100 * self.evaluations)
        self.tries = 0
        self.method, self.progress = method, progress
        self.seen: set = set()
        self.memory: dict = {}
        self.values: dict = {}            # feasible genome -> objective
        self.curve: list = []
        self.feasible = 0
        self.best: tuple[float, tuple] | None = None
        self.started = time.perf_counter()
        base = memory_fn(table.scheme(1, (0,) * (table.L - 1)))
        if base > self.budget:
            raise UsageError(f"budget {self.budget:,} B is below what any scheme needs: training the "
                             f"classifier alone plans {base:,} B")

    @property
    def done(self) -> bool:
        return len(self.curve) >= self.evaluations or self.tries >= self.max_tries

    def offer(self, k: int, genes: tuple[int, ...]) -> float | None:
        """Sample a candidate: None if already sampled (free) or over the budget (one evaluation,
        rejected), else its objective (one evaluation)."""
        self.tries += 1
        genome = self.t.canonical(k, genes)
        if genome in self.seen:
            return None
        self.seen.add(genome)
        mem = self.memory_fn(self.t.scheme(*genome))
        value = None
        if mem <= self.budget:
            value = self.t.objective(*genome)
            self.memory[genome] = mem
            self.values[genome] = value
            self.feasible += 1
            if self.best is None or value > self.best[0]:
                self.best = (value, genome)
        self.curve.append(self.best[0] if self.best else None)
        if self.progress:
            self.progress(1)
        return value

    def random_genome(self, rng: np.random.Generator) -> tuple[int, tuple[int, ...]]:
        """Depth uniform in 1..L, then each layer within reach trains its weights with a density
        drawn per scheme, at a uniform ratio: sparse and dense schemes at every depth."""
        L = self.t.L
        k = int(rng.integers(1, L + 1))
        p = rng.random()
        genes = [0] * (L - 1)
        for i in range(L - k, L - 1):
            if rng.random() < p:
                genes[i] = int(rng.integers(1, len(CHOICES)))
        return k, tuple(genes)

    def result(self, keep: int = 1, min_distance: int = 0) -> SearchResult:
        """The best scheme, and in ``candidates`` the :func:`shortlist` of ``keep`` distinct feasible
        schemes evaluated (the best first) for validation by training."""
        if self.best is None:
            raise InsituError(f"{self.method} search: none of the {len(self.curve)} schemes sampled fits the "
                              f"budget of {self.budget:,} B; raise the budget or the evaluations")
        value, genome = self.best
        picks = shortlist(self.values, keep, min_distance, first=genome)
        candidates = [Candidate(self.t.scheme(*g), self.values[g], self.memory[g]) for g in picks]
        return SearchResult(self.method, self.t.scheme(*genome), value, self.memory[genome], self.curve,
                            len(self.curve), self.feasible, time.perf_counter() - self.started, self.budget,
                            candidates)


def as_table(contrib) -> ContributionTable:
    """A search's objective from :class:`~insitu.sparse.contributions.Contributions` or a table."""
    return contrib if isinstance(contrib, ContributionTable) else contrib.table()
