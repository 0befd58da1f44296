"""The memory side of the scheme search: the planned peak of a scheme, memoized.

The planned peak of a scheme is the training compiler's arena (``compile_training(...).arena_bytes``),
memoized by the scheme's canonical key (the same scheme written two ways is planned once). A search
plans thousands of schemes: they are planned by the compiler's own passes without code generation
(:func:`insitu.sparse.compiler.plan_arena`) and with the scheme-independent numerics computed once
per graph (:class:`insitu.sparse.compiler.LayerTables`; ~5 ms instead of ~80 ms on mbv2-28),
cross-checked against ``compile_training`` (tests, the first plans of a model, the winners).
"""

from __future__ import annotations

import collections
import hashlib
import json
import time
from typing import Callable

from insitu.errors import InsituError
from insitu.sparse.compiler import LayerTables, Options, compile_training, plan_arena
from insitu.sparse.graph import Graph
from insitu.sparse.scheme import Scheme, classifier_only

__all__ = ["scheme_key", "canonical", "MemoryModel", "memory_of", "min_memory"]


def scheme_key(scheme: Scheme) -> tuple:
    """A hashable key of a scheme as written (see :func:`canonical` for the one that runs)."""
    return (int(scheme.bias_k), tuple(sorted((str(k), float(v)) for k, v in scheme.weights.items())))


def canonical(graph: Graph, scheme: Scheme) -> Scheme:
    """The scheme as it runs: ``bias_k`` raised to every layer backpropagation reaches (those
    biases train anyway, :meth:`Scheme.bias_layers`), weights in layer order."""
    names = [c.name for c in graph.convs]
    k = len(names) - scheme.depth(graph)
    order = {n: i for i, n in enumerate(names)}
    return Scheme(k, {n: float(scheme.weights[n]) for n in sorted(scheme.weights, key=lambda n: order.get(n, -1))})


class MemoryModel:
    """``scheme -> planned peak bytes`` of one (graph, gradient scales, lr and its per-layer
    factors ``lr_scale``), memoized.

    The key is the canonical scheme (:func:`canonical`): two writings of the same trained set
    share one plan. A plan is computed by :func:`~insitu.sparse.compiler.plan_arena` (the compiler's passes without
    code generation, with the scheme-independent numerics computed once: ~10x faster than
    ``compile_training`` on mbv2-28); the first ``verify`` plans are also compiled for real and
    must agree, else (or on any error of the fast path) the model falls back to
    ``compile_training`` for good and says so in ``fallback``. ``fast=False`` compiles always.
    ``queries``, ``compiles`` and ``compile_seconds`` count the work done. The graph must not
    change while the model is used.
    """

    def __init__(self, graph: Graph, grad_scales: dict[str, float], lr: float, reorder: bool = True,
                 fast: bool = True, verify: int = 3, lr_scale: dict[str, float] | None = None):
        self.graph, self.grad_scales, self.lr, self.reorder = graph, dict(grad_scales), float(lr), reorder
        self.lr_scale = dict(lr_scale or {})
        self.options = Options(lr=self.lr, reorder=reorder, lr_scale=self.lr_scale)
        self.layers = [c.name for c in graph.convs]
        self._index = {n: i for i, n in enumerate(self.layers)}
        self.cache: dict[tuple, int] = {}
        self.queries = self.compiles = 0
        self.compile_seconds = 0.0
        self.fast, self.verify, self.fallback = fast, int(verify), None
        self._tables: LayerTables | None = None

    def key(self, scheme: Scheme) -> tuple:
        first = [self._index[n] for n in scheme.weights if n in self._index]
        if scheme.bias_k:
            first.append(len(self.layers) - scheme.bias_k)
        k = len(self.layers) - min(first) if first else scheme.bias_k
        return (k, tuple(sorted((self._index.get(n, -1), float(r)) for n, r in scheme.weights.items())))

    def compile(self, scheme: Scheme) -> int:
        """The arena of the real compiler (no memo)."""
        return int(compile_training(self.graph, scheme, self.grad_scales, self.options).arena_bytes)

    def _fast(self, scheme: Scheme) -> int | None:
        try:
            if self._tables is None:
                self._tables = LayerTables(self.graph, self.grad_scales, self.lr, self.lr_scale)
            return int(plan_arena(self._tables, scheme, self.options))
        except InsituError:
            raise
        except Exception as exc:             # the compiler changed under the fast path
            self.fallback = f"fast plan failed ({exc!r}); compiling every scheme"
            return None

    def __call__(self, scheme: Scheme) -> int:
        self.queries += 1
        key = self.key(scheme)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        started = time.perf_counter()
        arena = self._fast(scheme) if self.fast and self.fallback is None else None
        if arena is None:
            arena = self.compile(scheme)
        elif self.verify > 0:
            self.verify -= 1
            real = self.compile(scheme)
            if real != arena:
                self.fallback = (f"fast plan {arena} B != compile_training {real} B for "
                                 f"{scheme.describe()}; compiling every scheme")
                arena = real
        self.compile_seconds += time.perf_counter() - started
        self.compiles += 1
        self.cache[key] = int(arena)
        return int(arena)


#: memory_of's models of the last few (graph, scales, lr) (held: a search's graph stays alive).
_MODELS: "collections.OrderedDict[tuple, MemoryModel]" = collections.OrderedDict()
_MAX_MODELS = 4


def _scales_digest(grad_scales: dict[str, float]) -> str:
    return hashlib.sha1(json.dumps(sorted((str(k), float(v)) for k, v in grad_scales.items())).encode()).hexdigest()


def memory_of(graph: Graph, scheme: Scheme, grad_scales: dict[str, float], lr: float,
              reorder: bool = True) -> int:
    """The planned peak (``compile_training(...).arena_bytes``) of ``scheme``, memoized per graph
    object, gradient scales, lr and canonical scheme (the models of the last four graphs are
    kept; a search holds its own :class:`MemoryModel`)."""
    key = (id(graph), _scales_digest(grad_scales), float(lr), bool(reorder))
    model = _MODELS.get(key)
    if model is None or model.graph is not graph:
        model = _MODELS[key] = MemoryModel(graph, grad_scales, lr, reorder)
        while len(_MODELS) > _MAX_MODELS:
            _MODELS.popitem(last=False)
    _MODELS.move_to_end(key)
    return model(scheme)


def min_memory(graph: Graph, memory_fn: Callable[[Scheme], int]) -> int:
    """The smallest plan of the search space: the classifier alone (every other scheme trains a
    superset of its tensors)."""
    return memory_fn(classifier_only(graph))
