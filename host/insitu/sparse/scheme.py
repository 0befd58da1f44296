"""Sparse-update schemes (tiny-training §2.2): which biases and which weight channels train.

The classifier of a new task starts from scratch, so every preset trains its weights (the paper's
bias-only and sparse schemes do too). A scheme names the number ``bias_k`` of last layers whose biases are updated and, per layer, the
fraction of output channels whose weights are updated (one of :data:`RATIOS`). Backpropagation
has to reach the earliest updated layer anyway, and a bias update costs no saved activation, so
every layer backpropagation passes through also updates its bias (the paper: "we always update
the biases if we have backpropagated to a layer"); :meth:`Scheme.bias_layers` applies that rule.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from insitu.errors import UsageError
from insitu.sparse.graph import Conv, Graph

RATIOS = (0.125, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Scheme:
    bias_k: int = 0
    weights: dict[str, float] = field(default_factory=dict)

    def validate(self, graph: Graph) -> None:
        names = [c.name for c in graph.convs]
        if not 0 <= self.bias_k <= len(names):
            raise UsageError(f"scheme: bias_k must be in [0, {len(names)}] (the model's layers), got {self.bias_k}")
        for name, ratio in self.weights.items():
            if name not in names:
                raise UsageError(f"scheme: no layer {name!r}; the model's layers: {', '.join(names)}")
            if ratio not in RATIOS:
                raise UsageError(f"scheme: layer {name} ratio {ratio} is not one of {RATIOS}")
        if not self.bias_k and not self.weights:
            raise UsageError("scheme: nothing to train (bias_k = 0 and no weights)")

    def depth(self, graph: Graph) -> int:
        """Index (in graph.convs) of the earliest layer that backpropagation must reach."""
        convs = [c.name for c in graph.convs]
        first = [convs.index(n) for n in self.weights]
        if self.bias_k:
            first.append(len(convs) - self.bias_k)
        return min(first)

    def bias_layers(self, graph: Graph) -> list[str]:
        return [c.name for c in graph.convs[self.depth(graph):]]

    def selected_channels(self, conv: Conv) -> np.ndarray:
        """The output channels of ``conv`` that train: the ``ceil(ratio * O)`` of largest weight
        magnitude (L1 norm of the channel's int8 codes; ties to the lower index), ascending."""
        ratio = self.weights[conv.name]
        n = max(1, math.ceil(ratio * conv.out_channels))
        norms = np.abs(conv.weight.astype(np.int64)).reshape(conv.out_channels, -1).sum(axis=1)
        order = np.argsort(-norms, kind="stable")
        return np.sort(order[:n])

    def describe(self) -> str:
        parts = [f"bias of last {self.bias_k}"] if self.bias_k else []
        parts += [f"{n}@{r:g}" for n, r in self.weights.items()]
        return ", ".join(parts)

    def to_json(self) -> dict:
        return {"bias_k": self.bias_k, "weights": dict(self.weights)}

    @classmethod
    def from_json(cls, data) -> "Scheme":
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise UsageError(f"scheme: not JSON ({exc})") from None
        if not isinstance(data, dict) or set(data) - {"bias_k", "weights"}:
            raise UsageError('scheme: expected {"bias_k": int, "weights": {layer: ratio}}, '
                             f"got {data!r}")
        return cls(int(data.get("bias_k", 0)), {str(k): float(v) for k, v in data.get("weights", {}).items()})


# --------------------------------------------------------------------------- the paper's baselines

def full_update(graph: Graph) -> Scheme:
    return Scheme(len(graph.convs), {c.name: 1.0 for c in graph.convs})


def bias_only(graph: Graph, k: int) -> Scheme:
    """Biases of the last ``k`` layers, and the (new) classifier's weights."""
    return Scheme(k, {graph.convs[-1].name: 1.0})


def classifier_only(graph: Graph) -> Scheme:
    """The classifier's weights and bias (the "last layer only" baseline)."""
    return Scheme(1, {graph.convs[-1].name: 1.0})


def last_k_layers(graph: Graph, k: int) -> Scheme:
    """Weights and biases of the last ``k`` layers."""
    return Scheme(k, {c.name: 1.0 for c in graph.convs[-k:]})


def paper_scheme(graph: Graph, budget: str) -> Scheme:
    """The scheme released with the Tiny Training paper for this graph's network at ``budget``
    (e.g. ``99kb``; :data:`insitu.sparse.models.PAPER_SCHEMES`), with the classifier trained."""
    from insitu.sparse.models import PAPER_SCHEMES

    model = graph.meta.get("model")
    released = PAPER_SCHEMES.get(str(model), {})
    if budget not in released:
        known = ", ".join(f"paper-{b}" for b in released) or f"none for {model or 'this model'}; they are for " + \
            ", ".join(PAPER_SCHEMES)
        raise UsageError(f"no released scheme paper-{budget} (released: {known})")
    n_bias, weights = released[budget]
    convs = [c.name for c in graph.convs]
    backbone, classifier = convs[:-1], convs[-1]
    return Scheme(n_bias + 1, {**{backbone[i]: float(r) for i, r in weights.items()}, classifier: 1.0})


def preset(graph: Graph, name: str) -> Scheme:
    """``full``, ``classifier``, ``bias-K``, ``last-K``, ``paper-BUDGET`` (the paper's networks:
    its released schemes) or a JSON scheme."""
    if name == "full":
        return full_update(graph)
    if name == "classifier":
        return classifier_only(graph)
    if name.startswith("paper-"):
        return paper_scheme(graph, name[len("paper-"):])
    for prefix, make in (("bias-", bias_only), ("last-", last_k_layers)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return make(graph, int(name[len(prefix):]))
    if name.lstrip().startswith("{"):
        return Scheme.from_json(name)
    raise UsageError(f"unknown scheme {name!r}: use full, classifier, bias-K, last-K, paper-BUDGET or JSON "
                     '{"bias_k": K, "weights": {"layer": ratio}}')
