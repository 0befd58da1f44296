"""The float reference of int8 sparse-update training: float SGD on the dequantized graph.

What the int8 program (:mod:`insitu.sparse.compiler`, run by :class:`insitu.sparse.simulate.Simulator`)
approximates, with nothing quantized: the same graph with its weights and biases dequantized
(``W = s_w * W_code``, ``b = s_w * s_x * b_code``), a float64 forward (ReLU / ReLU6 as the graph's
fused activations, no int8 range), the softmax cross-entropy gradient, a float backward, and SGD
of batch 1 with the same learning rate on the same tensors the scheme trains (the selected output
channels of each weight, the biases of :meth:`Scheme.bias_layers`), sample by sample in the same
order. QAS (tiny-training eq. 4) makes the int8 update ``W_code -= lr * G / s_w`` equal to this
one in real units, so the gap between the two is what quantization costs (activations, int16
gradients, int8 weights and their rounding).

``act_range=True`` clamps every activation to the real range of its int8 codes (``scale *
[lo, hi]`` of the fused activation) and passes the gradient straight through the clamp as the
int8 backward does: the float counterpart of the int8 forward's saturation, for measurements.

The reference is a measuring stick, not something the device runs.
"""

from __future__ import annotations

import numpy as np

from insitu import nn
from insitu.errors import InsituError
from insitu.sparse.graph import Add, Conv, Graph, act_bounds
from insitu.sparse.models import FastDepthwiseConv2d, FastPointwiseConv2d
from insitu.sparse.scheme import Scheme


def _layer(n: Conv, c: int) -> nn.Conv2d | nn.DepthwiseConv2d:
    o, cg, k, _ = n.weight.shape
    if n.groups == 1 and k == 1 and n.pad == 0:
        return FastPointwiseConv2d(c, o, stride=n.stride)
    if n.groups == 1:
        return nn.Conv2d(c, o, k, stride=n.stride, padding=n.pad)
    if n.groups == c == o:
        return FastDepthwiseConv2d(c, k, stride=n.stride, padding=n.pad)
    raise InsituError(f"reference: conv {n.name} has groups={n.groups} (only 1 or depthwise are supported)")


class FloatReference:
    """Float SGD on the dequantized ``graph`` for ``scheme`` (see the module docstring)."""

    def __init__(self, graph: Graph, scheme: Scheme, lr: float, act_range: bool = False,
                 lr_scale: dict[str, float] | None = None):
        scheme.validate(graph)
        self.graph, self.scheme, self.lr, self.act_range = graph, scheme, float(lr), act_range
        self.lr_scale = dict(lr_scale or {})
        T = graph.tensors
        self.layers: dict[str, nn.Layer] = {}
        self.w_mask: dict[str, np.ndarray] = {}
        biases = set(scheme.bias_layers(graph))
        self.b_train = {n.name for n in graph.convs if n.name in biases}
        for n in graph.convs:
            layer = _layer(n, T[n.x].shape[0])
            layer.params["weight"][...] = n.weight.astype(np.float64) * n.w_scale.reshape(-1, 1, 1, 1)
            layer.params["bias"][...] = n.bias.astype(np.float64) * n.w_scale * T[n.x].scale
            layer.compute_weight_grad = n.name in scheme.weights
            self.layers[n.name] = layer
            if n.name in scheme.weights:
                mask = np.zeros(n.out_channels, dtype=bool)
                mask[scheme.selected_channels(n)] = True
                self.w_mask[n.name] = mask
        depth = scheme.depth(graph)
        self.trained_nodes = {c.name for c in graph.convs[depth:]}
        self.bounds = {}
        for n in graph.nodes:
            if isinstance(n, (Conv, Add)):
                lo, hi = act_bounds(n.act, T[n.y].scale)
                self.bounds[n.name] = (lo * T[n.y].scale, hi * T[n.y].scale)

    # ------------------------------------------------------------------ forward / backward

    def _act(self, n, pre: np.ndarray):
        if self.act_range:
            lo, hi = self.bounds[n.name]
            if n.act == "none":
                return np.clip(pre, lo, hi), None
            y = np.clip(pre, lo, hi)
            return y, pre > 0 if n.act == "relu" else (pre > 0) & (pre < 6)
        if n.act == "relu":
            return np.maximum(pre, 0), pre > 0
        if n.act == "relu6":
            return np.clip(pre, 0, 6), (pre > 0) & (pre < 6)
        return pre, None

    def forward(self, x: np.ndarray, train: bool = False) -> np.ndarray:
        """Logits ``(N, classes)`` of float inputs ``(N, 1, H, W)``."""
        g = self.graph
        acts = {g.input: x}
        self._masks = {}
        for n in g.nodes:
            if isinstance(n, Conv):
                y, self._masks[n.name] = self._act(n, self.layers[n.name].forward(acts[n.x], train=train))
            elif isinstance(n, Add):
                y, self._masks[n.name] = self._act(n, acts[n.a] + acts[n.b])
            else:
                y = acts[n.x].mean(axis=(2, 3), keepdims=True)
            acts[n.y] = y
        self._acts = acts
        return acts[g.output].reshape(len(x), -1)

    def backward(self, g_logits: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of every tensor down to the deepest trained layer (weights in layer.grads)."""
        g = self.graph
        grads = {g.output: g_logits.reshape(self._acts[g.output].shape)}
        for n in reversed(g.nodes):
            gy = grads.get(n.y)
            if gy is None:
                continue
            mask = self._masks.get(n.name)
            if mask is not None:
                gy = gy * mask
            if isinstance(n, Conv):
                if n.name not in self.trained_nodes:
                    continue
                grads[n.y] = gy          # the gradient as the layer's update sees it
                layer = self.layers[n.name]
                layer.zero_grad()
                gx = layer.backward(gy)
                if n.x != g.input:
                    _add(grads, n.x, gx)
            elif isinstance(n, Add):
                _add(grads, n.a, gy)
                _add(grads, n.b, gy)
            else:
                hw = self._acts[n.x].shape[2] * self._acts[n.x].shape[3]
                _add(grads, n.x, np.broadcast_to(gy / hw, self._acts[n.x].shape))
        return grads

    def train_step(self, x: np.ndarray, label: int) -> int:
        """One SGD step on one float sample ``(1, 1, H, W)``; the class predicted before it."""
        logits = self.forward(x, train=True)
        p = nn.functional.softmax(logits, axis=1)
        predicted = int(np.argmax(logits[0]))
        p[0, int(label)] -= 1.0
        self.backward(p)
        for name in self.trained_nodes:
            layer, lr = self.layers[name], self.lr * self.lr_scale.get(name, 1.0)
            if name in self.w_mask:
                layer.params["weight"][self.w_mask[name]] -= lr * layer.grads["weight"][self.w_mask[name]]
            if name in self.b_train:
                layer.params["bias"] -= lr * layer.grads["bias"]
        return predicted

    # ------------------------------------------------------------------ the Simulator's interface, on codes

    def train(self, x_codes: np.ndarray, labels: np.ndarray) -> None:
        s = self.graph.tensors[self.graph.input].scale
        for x, y in zip(x_codes, labels):
            self.train_step(x.astype(np.float64)[None] * s, int(y))

    def predict_all(self, x_codes: np.ndarray, batch: int = 256) -> np.ndarray:
        s = self.graph.tensors[self.graph.input].scale
        out = [np.argmax(self.forward(x_codes[i:i + batch].astype(np.float64) * s), axis=1)
               for i in range(0, len(x_codes), batch)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def accuracy(self, x_codes: np.ndarray, labels: np.ndarray) -> float:
        return float(np.mean(self.predict_all(x_codes) == np.asarray(labels))) if len(labels) else 0.0


def _add(grads: dict, name: str, g: np.ndarray) -> None:
    grads[name] = grads[name] + g if name in grads else np.array(g)
