"""Sparse-update scheme search (tiny-training §2.2, eq. 5 and appendix D).

Three parts:

1. **Memory** (:func:`memory_of`, :class:`MemoryModel`): the planned peak of a scheme is the
   training compiler's arena (``compile_training(...).arena_bytes``), memoized by the scheme's
   canonical key (the same scheme written two ways is planned once). A search plans thousands of
   schemes: they are planned by the compiler's own passes without code generation and with the
   scheme-independent numerics computed once per graph (~5 ms instead of ~80 ms on mbv2-28),
   cross-checked against ``compile_training`` (tests, the first plans of a model, the winners).
2. **Contribution analysis** (:func:`analyze_contributions`): the host simulator trains the new
   head with one scheme per configuration on the same samples, and measures
   ``Δacc_b[k]`` (biases of the last k layers, vs. the classifier only) and ``Δacc_W[i, r]``
   (layer i's weights at ratio r, vs. the biases backpropagation reaches anyway).
3. **Search** (:func:`evolutionary_search`, :func:`random_search`): maximize the summed
   contributions ``Δacc_b[k] + Σ_i Δacc_W[i, r_i]`` subject to ``memory(scheme) <= budget``.

The search space. A scheme is ``(k, r_1 .. r_{L-1})``: ``k`` in ``1..L`` the number of last layers
whose biases train, ``r_i`` in ``{0, 1/8, 1/4, 1/2, 1}`` the weight ratio of layer ``i`` (0: frozen);
the classifier (layer ``L``) always trains its weights (:mod:`insitu.mcu.scheme`). Backpropagation
must reach the earliest layer with trained weights and every bias it passes trains too
(:meth:`Scheme.bias_layers`), so the scheme that runs has ``k_eff = max(k, L - i_min)``: schemes
are kept in that canonical form, and the objective uses ``Δacc_b[k_eff]``, the biases that really
train (and whose memory the compiler plans).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from insitu.errors import InsituError, UsageError
from insitu.mcu import abi
from insitu.mcu import compiler as C
from insitu.mcu.compiler import Options, compile_training
from insitu.mcu.graph import Graph, grad_bounds
from insitu.mcu.scheme import RATIOS, Scheme, bias_only, classifier_only

__all__ = ["CHOICES", "parse_size", "format_size", "scheme_key", "canonical", "MemoryModel", "memory_of",
           "min_memory", "Bundle", "Contributions", "contribution_configs", "analyze_contributions",
           "score_schemes", "ContributionTable", "SearchResult", "evolutionary_search", "random_search",
           "brute_force", "compare", "plot_curves", "run_search"]

#: A layer's weight ratio in the search: 0 (frozen) or one of the scheme ratios.
CHOICES = (0.0, *RATIOS)


# --------------------------------------------------------------------------- sizes

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)(i?[bB])?\s*$")


def parse_size(text) -> int:
    """``"128K"``, ``"128KB"``, ``"128KiB"``, ``"0.25M"``, ``"131072"`` -> bytes (K = 1024, as
    microcontroller datasheets count SRAM). Anything else is a UsageError."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise UsageError(f"not a memory size: {text!r} (use bytes, or K / M suffixes: 128K, 0.5M)")
        number, unit = float(m.group(1)), m.group(2).upper()
        value = number * {"": 1, "K": 1024, "M": 1024 ** 2}[unit]
        if value != int(value):
            raise UsageError(f"not a whole number of bytes: {text!r}")
        value = int(value)
    if value <= 0:
        raise UsageError(f"a memory size must be positive, got {text!r}")
    return value


def format_size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


# --------------------------------------------------------------------------- schemes

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


# --------------------------------------------------------------------------- memory

class _PlanTables:
    """What a compile of one (graph, gradient scales, lr) computes the same way for every scheme:
    each layer's :class:`compiler._Layer` (its requantization and blob pack) and the numeric
    tables of its backward ops (channel-scale ratios, update scales), by the compiler's own
    helpers. The memory plan depends on these only through the byte-identity of constant tables
    (the compiler shares identical ones), so they are kept as the compiler would encode them."""

    def __init__(self, graph: Graph, grad_scales: dict[str, float], lr: float):
        graph.validate()
        self.graph, self.lr = graph, float(lr)
        T = graph.tensors
        scales = dict(grad_scales)
        scales[graph.output] = C.LOSS_GRAD_SCALE
        self.layers = {c.name: C._Layer(c, T[c.x].scale, T[c.y].scale) for c in graph.convs}
        self.backward = {}
        for n in graph.convs:
            if n.y not in scales:
                continue                      # a layer no gradient reaches: the compiler fails the same way
            o = n.out_channels
            s_gy = scales[n.y]
            live = [s for s, row in zip(n.w_scale, n.weight.reshape(o, -1)) if row.any()] or list(n.w_scale)
            s_max = float(max(live))
            t = {}
            t["g"] = _try(lambda: C._rq_arrays([C._rq(min(1.0, s / s_max), f"the channel scales of {n.name}")
                                                 for s in n.w_scale]))
            s_g, s_x = s_gy * s_max, T[n.x].scale
            u = [_try(lambda i=i: C._rq(C.weight_update_scale(self.lr, s_g, s_x, float(n.w_scale[i])),
                                        f"the weight update of {n.name}")) for i in range(o)]
            failed = [v for v in u if isinstance(v, _Failed)]
            t["u"] = (failed[0] if failed else
                      (np.array([v.multiplier for v in u], np.int32), np.array([v.shift for v in u], np.int32),
                       C._rq_arrays(u)))
            t["u_list"] = u
            t["b"] = _try(lambda: C._rq_arrays([C._rq(self.lr * s_g / (float(s) ** 2 * s_x), f"the bias update of {n.name}")
                                                 for s in n.w_scale]))
            t["x"] = (None if n.x == graph.input or n.x not in scales else
                      _try(lambda: C._rq(s_g / scales[n.x], f"the input gradient of {n.name}")))
            self.backward[n.name] = t


class _Failed:
    def __init__(self, exc):
        self.exc = exc


def _try(fn):
    try:
        return fn()
    except InsituError as exc:
        return _Failed(exc)


def _ok(value):
    if isinstance(value, _Failed):
        raise value.exc
    return value


class _PlanBuilder(C._Builder):
    """The compiler's builder with the per-scheme-invariant numerics taken from
    :class:`_PlanTables`; every buffer and op is the compiler's (its forward, loss, backward
    traversal, pruning, DCE, reordering and planner run unchanged)."""

    def __init__(self, tables: _PlanTables, scheme: Scheme, grad_scales: dict[str, float], options: Options):
        graph = tables.graph
        self.tables = tables
        self.g, self.scheme, self.opts = graph, scheme, options
        self.grad_scales = dict(grad_scales)
        self.grad_scales[graph.output] = C.LOSS_GRAD_SCALE
        self.buffers = []
        self.consts = {}
        self.layers = {name: copy.copy(layer) for name, layer in tables.layers.items()}
        self.acts = {name: self.buf(f"act:{name}", t.size, "act") for name, t in graph.tensors.items()}
        self.acts[graph.input].kind = "input"
        self.io = self.buf("io", 4 * abi.IO_WORDS, "io", persistent=True)

    def _conv_backward(self, n, gy, s_gy, ops, applies, contribute) -> None:
        # compiler._Builder._conv_backward with the numeric tables looked up (same ops, same buffers)
        T = self.g.tensors
        L = self.layers[n.name]
        t = self.tables.backward[n.name]
        (c, h, w), (o, oh, ow) = T[n.x].shape, T[n.y].shape
        geom = C._geometry(n, T)
        passes = grad_bounds(n.act, T[n.y].scale)
        if passes is not None:
            ops.append(C.Op("act_bwd", {"y_off": C.Ref(self.acts[n.y]), "g_off": C.Ref(gy), "n": o * oh * ow,
                                  "lo": passes[0], "hi": passes[1]}, n.name, "bwd"))
        m, sh = _ok(t["g"])
        ops.append(C.Op("grad_scale_ch", {"g_off": C.Ref(gy), "C": o, "HW": oh * ow,
                                          "m_off": C.Ref(self.const(f"gm:{n.name}", m)),
                                          "sh_off": C.Ref(self.const(f"gsh:{n.name}", sh))}, n.name, "bwd"))
        idx = L.idx if L.idx is not None else np.arange(o)
        um, ush = self._update_scales(t, idx, o)
        gw = self.buf(f"gw:{n.name}", 4 * len(idx) * L.row_bytes, "gradbuf")
        wr = C.Ref(L.w_ram) if L.w_ram else None
        sel = C.Ref(L.idx_buf) if L.idx_buf else None
        ops.append(C.Op("conv_grad_w", {"gy_off": C.Ref(gy), "x_off": C.Ref(self.acts[n.x]), "gw_off": C.Ref(gw),
                                        "idx_off": sel, "n_sel": len(idx), **geom}, n.name, "bwd", (n.name, "w")))
        applies.append(C.Op("apply_w", {"gw_off": C.Ref(gw), "w_off": wr, "n_sel": len(idx), "row_len": L.row_bytes,
                                        "um_off": C.Ref(self.const(f"um:{n.name}", um)),
                                        "ush_off": C.Ref(self.const(f"ush:{n.name}", ush)),
                                        "io_off": C.Ref(self.io), "salt": self.salt(n)},
                            n.name, "update", (n.name, "w"), sink=True))
        bm, bsh = _ok(t["b"])
        gb = self.buf(f"gb:{n.name}", 4 * o, "gradbuf")
        ops.append(C.Op("bias_grad", {"gy_off": C.Ref(gy), "gb_off": C.Ref(gb), "O": o, "HW": oh * ow},
                        n.name, "bwd", (n.name, "b")))
        applies.append(C.Op("apply_b", {"gb_off": C.Ref(gb), "b_off": C.Ref(L.b_ram) if L.b_ram else None, "O": o,
                                        "um_off": C.Ref(self.const(f"bm:{n.name}", bm)),
                                        "ush_off": C.Ref(self.const(f"bsh:{n.name}", bsh))},
                            n.name, "update", (n.name, "b"), sink=True))
        if n.x == self.g.input:
            return
        gx = self.buf(f"grad:{n.x}@{n.name}", 2 * c * h * w, "grad")
        s = _ok(t["x"])
        ops.append(C.Op("conv_bwd_x", {"gy_off": C.Ref(gy), "w_off": ("weights", L), "gx_off": C.Ref(gx), **geom,
                                       "m": s.multiplier, "sh": s.shift}, n.name, "bwd"))
        contribute(n.x, gx, self.grad_scales[n.x], n.name)


    @staticmethod
    def _update_scales(t: dict, idx: np.ndarray, o: int) -> tuple[bytes, bytes]:
        if isinstance(t["u"], _Failed):        # some channel's scale is out of range: fails if selected
            return C._rq_arrays([_ok(t["u_list"][i]) for i in idx])
        m, sh, whole = t["u"]
        if len(idx) == o:
            return whole
        return C._codes(m[idx], np.int32), C._codes(sh[idx], np.int32)


def _plan_arena(tables: _PlanTables, scheme: Scheme, grad_scales: dict[str, float], options: Options) -> int:
    """``compile_training(...).arena_bytes`` without the parts that do not change the plan (the
    blob, the records, the generated module): compile_training and the planning part of
    compiler._lower, on a :class:`_PlanBuilder`."""
    graph = tables.graph
    scheme.validate(graph)
    b = _PlanBuilder(tables, scheme, grad_scales, options)
    b.place_trained()
    fwd = b.forward()
    loss, argmax, g_out = b.loss()
    bwd, applies = b.backward(g_out)
    trained = {(n, "w") for n in scheme.weights} | {(n, "b") for n in scheme.bias_layers(graph)}
    bwd, applies = C.prune(bwd, applies, trained)
    body = C.eliminate_dead_code(bwd + applies)
    bwd = [op for op in body if op.phase != "update"]
    applies = [op for op in body if op.phase == "update"]
    body = C.reorder_in_place(bwd, applies, b) if options.reorder else bwd + applies
    body = C.materialize_weights(body, b)
    train_ops = fwd + [loss] + body
    timeline = fwd + [argmax] + train_ops[len(fwd):]
    used = set().union(*(C.reads(op) | C.writes(op) for op in timeline))
    init_bufs = [x for x in b.buffers if x.persistent and x.init is not None and (x in used or x.kind == "param")]
    words = (sum(1 + len(abi.OPS[op.kind]) for op in train_ops) + len(init_bufs) * (1 + len(abi.OPS["load"]))
             + 1 + len(abi.OPS["argmax"]))
    return C.plan_memory(b.buffers, timeline, first_offset=4 * words)


class MemoryModel:
    """``scheme -> planned peak bytes`` of one (graph, gradient scales, lr), memoized.

    The key is the canonical scheme (:func:`canonical`): two writings of the same trained set
    share one plan. A plan is computed by :func:`_plan_arena` (the compiler's passes without
    code generation, with the scheme-independent numerics computed once: ~10x faster than
    ``compile_training`` on mbv2-28); the first ``verify`` plans are also compiled for real and
    must agree, else (or on any error of the fast path) the model falls back to
    ``compile_training`` for good and says so in ``fallback``. ``fast=False`` compiles always.
    ``queries``, ``compiles`` and ``compile_seconds`` count the work done. The graph must not
    change while the model is used.
    """

    def __init__(self, graph: Graph, grad_scales: dict[str, float], lr: float, reorder: bool = True,
                 fast: bool = True, verify: int = 3):
        self.graph, self.grad_scales, self.lr, self.reorder = graph, dict(grad_scales), float(lr), reorder
        self.options = Options(lr=self.lr, reorder=reorder)
        self.layers = [c.name for c in graph.convs]
        self._index = {n: i for i, n in enumerate(self.layers)}
        self.cache: dict[tuple, int] = {}
        self.queries = self.compiles = 0
        self.compile_seconds = 0.0
        self.fast, self.verify, self.fallback = fast, int(verify), None
        self._tables: _PlanTables | None = None

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
                self._tables = _PlanTables(self.graph, self.grad_scales, self.lr)
            return int(_plan_arena(self._tables, scheme, self.grad_scales, self.options))
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


# --------------------------------------------------------------------------- contribution analysis

@dataclass
class Bundle:
    """What the contribution analysis needs (a :class:`insitu.mcu.train.Prepared` has all but lr)."""

    graph: Graph
    grad_scales: dict[str, float]
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    lr: float = 0.05

    @classmethod
    def from_prepared(cls, prep, lr: float) -> "Bundle":
        return cls(prep.graph, prep.grad_scales, prep.x_train, prep.y_train, prep.x_test, prep.y_test, lr)


def _ratio_label(r: float) -> str:
    return f"{r:g}"


def contribution_configs(graph: Graph) -> list[tuple[str, Scheme]]:
    """The configurations the analysis trains, ``(label, scheme)``: ``bias-k`` for k = 1..L
    (``bias-1`` is the classifier-only reference) and ``LAYER@r`` for every layer but the
    classifier and every ratio r: layer i's weights at r on top of ``bias-(L-i)``."""
    names = [c.name for c in graph.convs]
    L = len(names)
    configs = [(f"bias-{k}", bias_only(graph, k)) for k in range(1, L + 1)]
    for i, name in enumerate(names[:-1]):
        ref = bias_only(graph, L - i)
        for r in RATIOS:
            configs.append((f"{name}@{_ratio_label(r)}", Scheme(ref.bias_k, {**ref.weights, name: r})))
    return configs


@dataclass
class Contributions:
    """The accuracies of the contribution analysis and what they cost (JSON-able).

    ``bias_accuracy[k-1]`` is the accuracy after training ``bias_only(k)`` (k = 1 is the
    classifier-only reference), ``weight_accuracy[layer][r]`` after training the layer's weights
    at ratio ``r`` (a string: ``"0.125"``) on top of the biases backpropagation to it reaches.
    ``memory[label]`` is the planned peak of each configuration (labels of
    :func:`contribution_configs`)."""

    layers: list[str]
    reference_accuracy: float
    bias_accuracy: list[float]
    weight_accuracy: dict[str, dict[str, float]]
    memory: dict[str, int]
    settings: dict = field(default_factory=dict)
    seconds: float = 0.0

    def delta_bias(self, k: int) -> float:
        """Δacc_b[:k]: biases of the last k layers vs. the classifier only."""
        return self.bias_accuracy[k - 1] - self.reference_accuracy

    def delta_weight(self, layer: str, ratio: float) -> float:
        """Δacc_W[i, r]: layer i's weights at ratio r vs. the bias-only update reaching layer i."""
        i = self.layers.index(layer)
        return self.weight_accuracy[layer][_ratio_label(ratio)] - self.bias_accuracy[len(self.layers) - i - 1]

    def table(self) -> "ContributionTable":
        L = len(self.layers)
        bias = np.zeros(L + 1)
        bias[1:] = [self.delta_bias(k) for k in range(1, L + 1)]
        weight = np.array([[self.delta_weight(n, r) for r in RATIOS] for n in self.layers[:-1]]).reshape(L - 1, len(RATIOS))
        return ContributionTable(list(self.layers), bias, weight)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Contributions":
        try:
            c = cls(list(data["layers"]), float(data["reference_accuracy"]),
                    [float(v) for v in data["bias_accuracy"]],
                    {str(k): {str(r): float(a) for r, a in v.items()} for k, v in data["weight_accuracy"].items()},
                    {str(k): int(v) for k, v in data["memory"].items()}, dict(data.get("settings", {})),
                    float(data.get("seconds", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InsituError(f"contributions: malformed data ({exc!r})") from None
        if len(c.bias_accuracy) != len(c.layers) or set(c.weight_accuracy) != set(c.layers[:-1]):
            raise InsituError("contributions: the table does not match its layers")
        return c


# Worker state of the process pool (set once per worker by the initializer).
_WORK: dict = {}


def _init_worker(payload: dict) -> None:
    _WORK.clear()
    _WORK.update(payload)


def _run_config(scheme_json: dict) -> tuple[float, int]:
    """Train a fresh simulator with one scheme on the shared sample order; (accuracy, arena)."""
    from insitu.mcu.simulate import Simulator

    w = _WORK
    compiled = compile_training(w["graph"], Scheme.from_json(scheme_json), w["grad_scales"], Options(lr=w["lr"]))
    sim = Simulator(compiled)
    sim.train(w["x_train"], w["y_train"])
    return float(sim.accuracy(w["x_eval"], w["y_eval"])), int(compiled.arena_bytes)


def _payload(bundle, lr: float, train_samples: int, eval_samples: int, seed: int) -> dict:
    from insitu.training import sample_order

    order = sample_order(len(bundle.y_train), seed, 0, int(train_samples))
    return {"graph": bundle.graph, "grad_scales": dict(bundle.grad_scales), "lr": float(lr),
            "x_train": np.ascontiguousarray(bundle.x_train[order]),
            "y_train": np.ascontiguousarray(bundle.y_train[order]),
            "x_eval": np.ascontiguousarray(bundle.x_test[:eval_samples]),
            "y_eval": np.ascontiguousarray(bundle.y_test[:eval_samples])}


def score_schemes(bundle, schemes: list[Scheme], *, train_samples: int, eval_samples: int, seed: int = 0,
                  lr: float | None = None) -> list[tuple[float, int]]:
    """``(accuracy, planned arena)`` of each scheme trained exactly as the contribution analysis
    trains its configurations (same samples, same order, same test samples): what a searched
    scheme really reaches, to set against the sum of contributions that chose it."""
    lr = float(lr if lr is not None else getattr(bundle, "lr"))
    _init_worker(_payload(bundle, lr, train_samples, eval_samples, seed))
    try:
        return [_run_config(s.to_json()) for s in schemes]
    finally:
        _WORK.clear()


def analyze_contributions(bundle, *, train_samples: int = 300, eval_samples: int = 300, seed: int = 0,
                          lr: float | None = None, workers: int = 1, progress=None,
                          settings: dict | None = None) -> Contributions:
    """The contribution analysis of tiny-training §2.2 on the host simulator (bit-exact with the
    device): every configuration of :func:`contribution_configs` trains a fresh copy of
    ``bundle.graph`` (its new head) on the same ``train_samples`` (the stream of ``seed``, as
    ``insitu train`` orders them) and is scored on the first ``eval_samples`` test samples.

    ``bundle``: a :class:`Bundle` or anything with its attributes (``lr`` may come as argument).
    ``workers > 1`` trains configurations in parallel processes. ``progress(n)`` is called as
    configurations finish.

    Why the weights are measured on top of ``bias-(L-i)`` and not on top of the classifier only:
    training layer i's weights needs backpropagation down to layer i, and every bias on the way
    trains with it (:meth:`Scheme.bias_layers`); a "weights of layer i only" scheme does not
    exist. Measured against the classifier only, Δacc_W would include the contribution of those
    biases, which the objective already counts in Δacc_b[k_eff]; measured against the bias-only
    scheme reaching layer i, it is the weight's own contribution, so the sum of eq. 5 does not
    count the biases twice.
    """
    lr = float(lr if lr is not None else getattr(bundle, "lr"))
    graph = bundle.graph
    n_test = len(bundle.y_test)
    if not isinstance(train_samples, (int, np.integer)) or train_samples < 1:
        raise UsageError(f"train_samples must be a positive integer, got {train_samples!r}")
    if not isinstance(eval_samples, (int, np.integer)) or not 1 <= eval_samples <= n_test:
        raise UsageError(f"eval_samples must be in [1, {n_test}] (the task's test samples), got {eval_samples!r}")
    if not isinstance(workers, (int, np.integer)) or workers < 1:
        raise UsageError(f"workers must be a positive integer, got {workers!r}")
    payload = _payload(bundle, lr, train_samples, eval_samples, seed)
    configs = contribution_configs(graph)
    unique: dict[tuple, dict] = {}
    for _, scheme in configs:
        unique.setdefault(scheme_key(scheme), scheme.to_json())
    keys = list(unique)
    started = time.perf_counter()
    results: dict[tuple, tuple[float, int]] = {}
    if workers == 1 or len(keys) == 1:
        _init_worker(payload)
        try:
            for key in keys:
                results[key] = _run_config(unique[key])
                if progress:
                    progress(1)
        finally:
            _WORK.clear()
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(int(workers), len(keys)), initializer=_init_worker,
                                 initargs=(payload,)) as pool:
            # deepest backpropagation (the longest trainings) first: the pool ends together
            futures = {pool.submit(_run_config, unique[key]): key for key in sorted(keys, key=lambda k: -k[0])}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(1)
    names = [c.name for c in graph.convs]
    L = len(names)
    acc = {label: results[scheme_key(s)][0] for label, s in configs}
    memory = {label: results[scheme_key(s)][1] for label, s in configs}
    weight_acc = {n: {_ratio_label(r): acc[f"{n}@{_ratio_label(r)}"] for r in RATIOS} for n in names[:-1]}
    info = {"lr": lr, "train_samples": int(train_samples), "eval_samples": int(eval_samples), "seed": int(seed),
            "configurations": len(configs), "trainings": len(keys), "workers": int(workers), **(settings or {})}
    return Contributions(names, acc["bias-1"], [acc[f"bias-{k}"] for k in range(1, L + 1)], weight_acc,
                         memory, info, time.perf_counter() - started)


def contributions_key(**settings) -> str:
    """A file-name-safe digest of the settings a cached analysis depends on."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def graph_digest(graph: Graph) -> str:
    """A digest of a graph's structure and codes (a cached analysis is valid for this graph only)."""
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(repr((n.kind, n.name)).encode())
        for key in ("weight", "bias", "w_scale"):
            if hasattr(n, key):
                h.update(np.ascontiguousarray(getattr(n, key)).tobytes())
    h.update(json.dumps({k: [list(v.shape), v.scale] for k, v in graph.tensors.items()}, sort_keys=True).encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- the search (eq. 5)

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

    def to_json(self) -> dict:
        return {"method": self.method, "scheme": self.scheme.to_json(), "scheme_text": self.scheme.describe(),
                "objective": self.objective, "memory_bytes": self.memory, "budget_bytes": self.budget,
                "evaluations": self.evaluations, "feasible": self.feasible, "seconds": self.seconds,
                "curve": list(self.curve)}


class _Sampler:
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

    def result(self) -> SearchResult:
        if self.best is None:
            raise InsituError(f"{self.method} search: none of the {len(self.curve)} schemes sampled fits the "
                              f"budget of {self.budget:,} B; raise the budget or the evaluations")
        value, genome = self.best
        return SearchResult(self.method, self.t.scheme(*genome), value, self.memory[genome], self.curve,
                            len(self.curve), self.feasible, time.perf_counter() - self.started, self.budget)


def _as_table(contrib) -> ContributionTable:
    return contrib.table() if isinstance(contrib, Contributions) else contrib


def random_search(contrib, memory_fn: Callable[[Scheme], int], budget: int, evaluations: int = 5000,
                  seed: int = 0, *, progress=None) -> SearchResult:
    """The baseline of the paper's Fig. 13: ``evaluations`` distinct random schemes
    (:meth:`_Sampler.random_genome`), the best one within the budget kept."""
    table = _as_table(contrib)
    s = _Sampler(table, memory_fn, budget, evaluations, "random", progress)
    rng = np.random.default_rng(seed)
    while not s.done:
        s.offer(*s.random_genome(rng))
    return s.result()


def evolutionary_search(contrib, memory_fn: Callable[[Scheme], int], budget: int, evaluations: int = 5000,
                        seed: int = 0, *, population: int | None = None, parent_ratio: float = 0.25,
                        mutation_ratio: float = 0.5, mutate_prob: float = 0.05, progress=None) -> SearchResult:
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
    table = _as_table(contrib)
    if population is None:
        population = int(np.clip(int(evaluations) // 20 if isinstance(evaluations, (int, np.integer)) else 100, 20, 100))
    if population < 2 or not 0 < parent_ratio < 1 or not 0 <= mutation_ratio <= 1 or not 0 < mutate_prob <= 1:
        raise UsageError("evolutionary search: population >= 2, 0 < parent_ratio < 1, 0 <= mutation_ratio <= 1 "
                         "and 0 < mutate_prob <= 1")
    s = _Sampler(table, memory_fn, budget, evaluations, "evolutionary", progress)
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
    return s.result()


def brute_force(contrib, memory_fn: Callable[[Scheme], int], budget: int) -> tuple[float, Scheme]:
    """The exact optimum of eq. 5 by enumeration of every canonical scheme (small tables only:
    ``sum_k 5**(k-1)`` schemes for L layers): per depth k, the schemes in decreasing objective
    until the first one within the budget."""
    table = _as_table(contrib)
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


def compare(contrib, memory_fn, budget: int, evaluations: int, seed: int = 0,
            progress=None) -> dict[str, SearchResult]:
    """Both searches with the same number of evaluations (and seed)."""
    return {"evolutionary": evolutionary_search(contrib, memory_fn, budget, evaluations, seed, progress=progress),
            "random": random_search(contrib, memory_fn, budget, evaluations, seed, progress=progress)}


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
        fig.savefig(path)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- `insitu mcu search`

#: Bump when the analysis changes what it measures (cached tables of older versions are redone).
CONTRIBUTIONS_VERSION = 2
DEFAULT_EVALUATIONS = 5000
DEFAULT_TRAIN_SAMPLES = 500
DEFAULT_EVAL_SAMPLES = 500


def contributions_path(cache_dir, model: str, task: str, settings: dict):
    from pathlib import Path

    return Path(cache_dir) / f"{model}-{task}-{contributions_key(**settings)}.json"


def load_or_analyze(prep, model: str, task: str, lr: float, train_samples: int, eval_samples: int, seed: int,
                    workers: int, cache_dir, refresh: bool = False, progress=None) -> tuple[Contributions, str, bool]:
    """The contribution analysis of a prepared model and task, from the cache when it holds one
    for the same settings and graph (else run and cached): ``(contributions, path, cached)``."""
    from insitu.io import atomic_write_json

    settings = {"model": model, "task": task, "lr": float(lr), "train_samples": int(train_samples),
                "eval_samples": int(eval_samples), "seed": int(seed), "graph": graph_digest(prep.graph),
                "version": CONTRIBUTIONS_VERSION}
    path = contributions_path(cache_dir, model, task, settings)
    if path.is_file() and not refresh:
        try:
            c = Contributions.from_json(json.loads(path.read_text()))
            if all(c.settings.get(k) == v for k, v in settings.items()):
                return c, str(path), True
        except (OSError, ValueError, InsituError):
            pass                                           # unreadable or stale: redo it
    c = analyze_contributions(Bundle.from_prepared(prep, lr), train_samples=train_samples,
                              eval_samples=eval_samples, seed=seed, workers=workers, progress=progress,
                              settings=settings)
    try:
        atomic_write_json(path, c.to_json())
    except OSError as exc:
        raise InsituError(f"cannot write the contribution cache {path}: {exc.strerror}") from None
    return c, str(path), False


def run_search(model: str, task: str, budget, *, evaluations: int = DEFAULT_EVALUATIONS,
               train_samples: int = DEFAULT_TRAIN_SAMPLES, eval_samples: int | None = None, lr: float = 0.05,
               seed: int = 0, workers: int = 1, cache_dir=None, refresh: bool = False, validate: bool = True,
               progress_factory=None, say=None) -> dict:
    """`insitu mcu search`: contribution analysis of ``model`` on ``task`` (cached), then the
    evolutionary and random searches of eq. 5 under ``budget`` bytes with the same number of
    evaluations. Returns the report as a dict (``scheme`` holds the searched scheme's JSON); with
    ``validate``, ``validation`` holds the accuracy each search's scheme really reaches when
    trained as the analysis's configurations were (the sum of contributions only predicts it)."""
    from insitu.mcu.models import model_config
    from insitu.mcu.quantize import cache_root
    from insitu.mcu.tasks import TASKS

    budget = parse_size(budget)
    model_config(model)                                # unknown model: UsageError before any work
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    for name, value in (("evaluations", evaluations), ("train samples", train_samples), ("workers", workers)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise UsageError(f"{name} must be a positive integer, got {value!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise UsageError(f"lr must be a positive number, got {lr!r}")
    say = say or (lambda msg: None)
    progress_factory = progress_factory or (lambda what, total: contextlib.nullcontext(lambda n=1: None))
    from insitu.mcu.train import Prepared

    started = time.perf_counter()
    prep = Prepared(model, task, "classifier", lr, seed)
    memory = MemoryModel(prep.graph, prep.grad_scales, lr)
    floor = min_memory(prep.graph, memory)
    if budget < floor:
        raise UsageError(f"budget {budget:,} B is below what any scheme needs: training the classifier of "
                         f"{model} alone plans {floor:,} B ({format_size(floor)})")
    n_test = len(prep.y_test)
    eval_samples = min(DEFAULT_EVAL_SAMPLES, n_test) if eval_samples is None else eval_samples
    if not isinstance(eval_samples, (int, np.integer)) or not 1 <= eval_samples <= n_test:
        raise UsageError(f"eval samples must be in [1, {n_test}] ({task}'s test samples), got {eval_samples!r}")
    folder = cache_dir if cache_dir is not None else cache_root() / "mcu" / "contributions"
    configs = len({scheme_key(s) for _, s in contribution_configs(prep.graph)})
    with progress_factory(f"contribution analysis ({configs} trainings)", configs) as advance:
        contrib, path, cached = load_or_analyze(prep, model, task, lr, train_samples, eval_samples, seed, workers,
                                                folder, refresh, advance)
    say(f"contributions {'from the cache' if cached else 'measured'}: {path}")
    table = contrib.table()
    results = {}
    for name, fn in (("evolutionary", evolutionary_search), ("random", random_search)):
        with progress_factory(f"{name} search", evaluations) as advance:
            results[name] = fn(table, memory, budget, evaluations, seed, progress=advance)
    # The winners compiled by the real compiler (the plans the search used are its own passes).
    checked = {name: memory.compile(r.scheme) for name, r in results.items()}
    for name, r in results.items():
        if checked[name] != r.memory:
            raise InsituError(f"{name} search: the compiler plans {checked[name]:,} B for {r.scheme.describe()}, "
                              f"the search's plan said {r.memory:,} B; rerun (the fast plan is now off)")
    best = max(results.values(), key=lambda r: (r.objective, r.method == "evolutionary"))
    validation = None
    if validate:
        # Eq. 5 assumes contributions add up; train the winners as the analysis trained each
        # configuration and report what they really reach.
        say("training the searched schemes to check the sum of contributions")
        scored = score_schemes(Bundle.from_prepared(prep, lr), [r.scheme for r in results.values()],
                               train_samples=train_samples, eval_samples=eval_samples, seed=seed)
        validation = {name: {"accuracy": acc, "predicted": contrib.reference_accuracy + r.objective,
                             "reference_accuracy": contrib.reference_accuracy}
                      for (name, r), (acc, _) in zip(results.items(), scored)}
    L = len(contrib.layers)
    return {
        "model": model, "task": task, "budget_bytes": budget, "lr": float(lr), "seed": int(seed),
        "min_memory_bytes": floor,
        "contributions": {"path": path, "cached": cached, "reference_accuracy": contrib.reference_accuracy,
                          "delta_bias": {str(k): contrib.delta_bias(k) for k in range(1, L + 1)},
                          "delta_weight": {n: {_ratio_label(r): contrib.delta_weight(n, r) for r in RATIOS}
                                           for n in contrib.layers[:-1]},
                          "memory": contrib.memory, "seconds": contrib.seconds,
                          "train_samples": int(train_samples), "eval_samples": int(eval_samples)},
        "searches": {name: r.to_json() for name, r in results.items()},
        "validation": validation,
        "scheme": best.scheme.to_json(),
        "scheme_text": best.scheme.describe(),
        "scheme_from": best.method,
        "objective": best.objective,
        "memory_bytes": best.memory,
        "memory": {"plans": memory.compiles, "queries": memory.queries, "plan_seconds": memory.compile_seconds,
                   "fast_plan": memory.fallback is None, "fallback": memory.fallback},
        "seconds": time.perf_counter() - started,
    }
