"""The contribution analysis of the scheme search (tiny-training §2.2).

The host simulator trains the new head with one scheme per configuration on the same samples, and
measures ``Δacc_b[k]`` (biases of the last k layers, vs. the classifier only) and ``Δacc_W[i, r]``
(layer i's weights at ratio r, vs. the biases backpropagation reaches anyway). The tables are
cached per settings and graph (:func:`load_or_analyze`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from insitu.errors import InsituError, UsageError
from insitu.io import atomic_write_json, exclusive
from insitu.sparse.compiler import Options, compile_training
from insitu.sparse.graph import Graph
from insitu.sparse.memory import scheme_key
from insitu.sparse.objective import ContributionTable
from insitu.sparse.scheme import RATIOS, Scheme, bias_only
from insitu.sparse.simulate import Simulator

__all__ = ["Bundle", "lr_scale_of", "with_lr_scale", "Contributions", "contribution_configs", "analyze_contributions", "score_schemes",
           "ratio_label", "contributions_key", "graph_digest", "CONTRIBUTIONS_VERSION", "contributions_path",
           "load_or_analyze"]

#: Bump when the analysis changes what it measures (cached tables of older versions are redone).
CONTRIBUTIONS_VERSION = 2


@dataclass
class Bundle:
    """What the contribution analysis needs: the model with its new head, its gradient scales, the
    task's samples as input codes, and the training stream (a platform's prepared run, e.g.
    :class:`insitu.mcu.board_runs.Prepared`, has all but the stream and lr). ``lr_scale``: the
    per-layer factors on ``lr`` (:attr:`insitu.sparse.compiler.Options.lr_scale`; empty: one rate).

    ``sample_order(n_train, seed, start, count)``: the indices of the training samples
    ``start .. start+count`` of the stream for ``seed``, as the platform's training loop orders
    them, so that a configuration trains on the samples a device would."""

    graph: Graph
    grad_scales: dict[str, float]
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    sample_order: Callable[[int, int, int, int], np.ndarray]
    lr: float = 0.05
    lr_scale: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_prepared(cls, prep, lr: float, sample_order: Callable[[int, int, int, int], np.ndarray],
                      lr_scale: dict[str, float] | None = None) -> "Bundle":
        return cls(prep.graph, prep.grad_scales, prep.x_train, prep.y_train, prep.x_test, prep.y_test,
                   sample_order, lr, dict(lr_scale or {}))


def lr_scale_of(bundle, lr_scale: dict | None = None) -> dict[str, float]:
    """The per-layer lr factors a training of ``bundle`` uses: ``lr_scale`` if given, else the
    bundle's (none: ``{}``, one rate), as ``{layer: float}``."""
    scale = lr_scale if lr_scale is not None else (getattr(bundle, "lr_scale", None) or {})
    return {str(k): float(v) for k, v in scale.items()}


def with_lr_scale(bundle, lr_scale: dict | None):
    """``bundle`` training with the per-layer lr factors ``lr_scale`` (None: as it is)."""
    return bundle if lr_scale is None else replace(bundle, lr_scale=lr_scale_of(bundle, lr_scale))


def ratio_label(r: float) -> str:
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
            configs.append((f"{name}@{ratio_label(r)}", Scheme(ref.bias_k, {**ref.weights, name: r})))
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
        return self.weight_accuracy[layer][ratio_label(ratio)] - self.bias_accuracy[len(self.layers) - i - 1]

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
    w = _WORK
    compiled = compile_training(w["graph"], Scheme.from_json(scheme_json), w["grad_scales"],
                                Options(lr=w["lr"], lr_scale=w["lr_scale"]))
    sim = Simulator(compiled)
    sim.train(w["x_train"], w["y_train"])
    return float(sim.accuracy(w["x_eval"], w["y_eval"])), int(compiled.arena_bytes)


def _payload(bundle, lr: float, train_samples: int, eval_samples: int, seed: int,
             lr_scale: dict[str, float] | None = None) -> dict:
    order = bundle.sample_order(len(bundle.y_train), seed, 0, int(train_samples))
    return {"graph": bundle.graph, "grad_scales": dict(bundle.grad_scales), "lr": float(lr),
            "lr_scale": dict(lr_scale or {}),
            "x_train": np.ascontiguousarray(bundle.x_train[order]),
            "y_train": np.ascontiguousarray(bundle.y_train[order]),
            "x_eval": np.ascontiguousarray(bundle.x_test[:eval_samples]),
            "y_eval": np.ascontiguousarray(bundle.y_test[:eval_samples])}


def score_schemes(bundle, schemes: list[Scheme], *, train_samples: int, eval_samples: int, seed: int = 0,
                  lr: float | None = None, lr_scale: dict | None = None) -> list[tuple[float, int]]:
    """``(accuracy, planned arena)`` of each scheme trained exactly as the contribution analysis
    trains its configurations (same samples, same order, same test samples, same rates): what a
    searched scheme really reaches, to set against the sum of contributions that chose it."""
    lr = float(lr if lr is not None else getattr(bundle, "lr"))
    _init_worker(_payload(bundle, lr, train_samples, eval_samples, seed, lr_scale_of(bundle, lr_scale)))
    try:
        return [_run_config(s.to_json()) for s in schemes]
    finally:
        _WORK.clear()


def analyze_contributions(bundle, *, train_samples: int = 300, eval_samples: int = 300, seed: int = 0,
                          lr: float | None = None, lr_scale: dict | None = None, workers: int = 1,
                          progress=None, settings: dict | None = None) -> Contributions:
    """The contribution analysis of tiny-training §2.2 on the host simulator (bit-exact with the
    device): every configuration of :func:`contribution_configs` trains a fresh copy of
    ``bundle.graph`` (its new head) on the same ``train_samples`` (the stream of ``seed``, as
    ``insitu train`` orders them) and is scored on the first ``eval_samples`` test samples.

    ``bundle``: a :class:`Bundle` or anything with its attributes (``lr`` and ``lr_scale``, the
    per-layer factors on it, may come as arguments).
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
    lr_scale = lr_scale_of(bundle, lr_scale)
    graph = bundle.graph
    n_test = len(bundle.y_test)
    if not isinstance(train_samples, (int, np.integer)) or train_samples < 1:
        raise UsageError(f"train_samples must be a positive integer, got {train_samples!r}")
    if not isinstance(eval_samples, (int, np.integer)) or not 1 <= eval_samples <= n_test:
        raise UsageError(f"eval_samples must be in [1, {n_test}] (the task's test samples), got {eval_samples!r}")
    if not isinstance(workers, (int, np.integer)) or workers < 1:
        raise UsageError(f"workers must be a positive integer, got {workers!r}")
    payload = _payload(bundle, lr, train_samples, eval_samples, seed, lr_scale)
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
    weight_acc = {n: {ratio_label(r): acc[f"{n}@{ratio_label(r)}"] for r in RATIOS} for n in names[:-1]}
    info = {"lr": lr, "lr_scale": lr_scale, "train_samples": int(train_samples), "eval_samples": int(eval_samples), "seed": int(seed),
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


def contributions_path(cache_dir, model: str, task: str, settings: dict) -> Path:
    """``<model label>-<task>-<settings digest>.json``: an ONNX model is named by its file's stem and
    sha256 (:func:`insitu.sparse.model_source.model_label`), a task by a file-name-safe form."""
    from insitu.sparse.model_source import file_safe, model_label

    return Path(cache_dir) / f"{model_label(model)}-{file_safe(task)}-{contributions_key(**settings)}.json"


def load_or_analyze(bundle: Bundle, model: str, task: str, train_samples: int, eval_samples: int, seed: int,
                    workers: int, cache_dir, refresh: bool = False, progress=None) -> tuple[Contributions, str, bool]:
    """The contribution analysis of ``model`` on ``task`` (``bundle``: their prepared graph and
    samples), from the cache when it holds one for the same settings and graph (else run and
    cached): ``(contributions, path, cached)``. Per-layer lr factors (``bundle.lr_scale``) are
    part of the settings when there are any (one rate keeps the key it always had)."""
    from insitu.sparse.model_source import model_label
    from insitu.sparse.tasks import task_key

    # The data's key: an edited folder of the user's is analysed again, not served from the cache.
    settings = {"model": model_label(model), "task": task_key(task), "lr": float(bundle.lr),
                "train_samples": int(train_samples), "eval_samples": int(eval_samples), "seed": int(seed),
                "graph": graph_digest(bundle.graph), "version": CONTRIBUTIONS_VERSION}
    lr_scale = lr_scale_of(bundle)
    if lr_scale:
        settings["lr_scale"] = lr_scale
    path = contributions_path(cache_dir, model, task, settings)

    def cached() -> Contributions | None:
        if path.is_file() and not refresh:
            try:
                c = Contributions.from_json(json.loads(path.read_text()))
                if all(c.settings.get(k) == v for k, v in settings.items()):
                    return c
            except (OSError, ValueError, InsituError):
                pass                                       # unreadable or stale: redo it
        return None

    c = cached()
    if c is not None:
        return c, str(path), True
    lock = path.with_suffix(".lock")
    try:                                  # before minutes of analysis: can its result be kept?
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
    except OSError as exc:
        raise InsituError(f"cannot write the contribution cache {path}: {exc.strerror}") from None
    with exclusive(lock):                 # one analysis per key at a time; who waited finds it done
        c = None if refresh else cached()
        if c is not None:
            return c, str(path), True
        c = analyze_contributions(bundle, train_samples=train_samples,
                                  eval_samples=eval_samples, seed=seed, workers=workers, progress=progress,
                                  settings=settings)
        try:
            atomic_write_json(path, c.to_json())
        except OSError as exc:
            raise InsituError(f"cannot write the contribution cache {path}: {exc.strerror}") from None
        return c, str(path), False
