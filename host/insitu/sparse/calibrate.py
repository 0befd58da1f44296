"""Static scales of the int16 activation gradients, calibrated on a few samples of the new task.

The device has no room (nor time) to find a gradient's range at run time, so every gradient
tensor gets a fixed scale at compile time, as every activation does. They come from a float
shadow of the int8 graph (the dequantized weights in insitu.nn layers, on real inputs and labels
of the task): the largest gradient seen, times a headroom, maps to the int16 limit.
"""

from __future__ import annotations

import numpy as np

from insitu import nn
from insitu.errors import InsituError
from insitu.sparse.graph import Add, Conv, GlobalAvgPool, Graph

#: The largest calibration gradient lands at 1/HEADROOM of the int16 range: gradients grow when
#: the task shifts or the loss spikes, and a saturated gradient is worse than a coarse one.
HEADROOM = 4.0
INT16_MAX = 32767


def _float_layer(n: Conv, x_shape, rng) -> nn.Layer:
    c = x_shape[0]
    o, cg, k, _ = n.weight.shape
    codes = n.weight.astype(np.float64)
    if not codes.any():          # a fresh zero head: calibrate with weights of a trained one's size
        codes = rng.integers(-64, 65, size=codes.shape).astype(np.float64)
    if n.groups == 1:
        layer = nn.Conv2d(c, o, k, stride=n.stride, padding=n.pad)
    elif n.groups == c == o:
        layer = nn.DepthwiseConv2d(c, k, stride=n.stride, padding=n.pad)
    else:
        raise InsituError(f"calibrate: conv {n.name} has groups={n.groups} (only 1 or depthwise are supported)")
    layer.params["weight"][...] = codes * n.w_scale.reshape(-1, 1, 1, 1)
    layer.params["bias"][...] = 0.0        # set per call (needs the input scale)
    return layer


def calibrate_gradients(graph: Graph, x_codes: np.ndarray, labels: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Gradient scale of every tensor (but the input and the logits) from ``x_codes`` (N,1,H,W)."""
    rng = np.random.default_rng(seed)
    T = graph.tensors
    acts = {graph.input: x_codes.astype(np.float64) * T[graph.input].scale}
    layers, masks = {}, {}
    for n in graph.nodes:
        if isinstance(n, Conv):
            layer = _float_layer(n, T[n.x].shape, rng)
            layer.params["bias"][...] = n.bias * n.w_scale * T[n.x].scale
            pre = layer.forward(acts[n.x], train=True)
            layers[n.name] = layer
            y, masks[n.name] = _activation(pre, n.act)
        elif isinstance(n, Add):
            y, masks[n.name] = _activation(acts[n.a] + acts[n.b], n.act)
        elif isinstance(n, GlobalAvgPool):
            y = acts[n.x].mean(axis=(2, 3), keepdims=True)
        else:
            raise InsituError(f"calibrate: a graph node of unknown kind {type(n).__name__}")
        acts[n.y] = y
    logits = acts[graph.output].reshape(len(x_codes), -1)
    p = nn.functional.softmax(logits, axis=1)
    p[np.arange(len(labels)), labels] -= 1.0
    grads = {graph.output: p.reshape(acts[graph.output].shape)}
    for n in reversed(graph.nodes):
        g = grads.get(n.y)
        if g is None:
            continue
        if isinstance(n, Conv):
            gx = layers[n.name].backward(g * masks[n.name])
            _accumulate(grads, n.x, gx)
        elif isinstance(n, Add):
            g = g * masks[n.name]
            _accumulate(grads, n.a, g)
            _accumulate(grads, n.b, g)
        else:
            _accumulate(grads, n.x, np.broadcast_to(g / (acts[n.x].shape[2] * acts[n.x].shape[3]), acts[n.x].shape))
    scales = {}
    for name, g in grads.items():
        if name in (graph.input, graph.output):
            continue
        peak = float(np.max(np.abs(g)))
        if not peak > 0:
            raise InsituError(f"calibrate: the gradient of {name} is zero on every calibration sample; "
                              "use more (or other) calibration samples")
        scales[name] = peak * HEADROOM / INT16_MAX
    return scales


def _activation(pre: np.ndarray, act: str):
    if act == "relu":
        return np.maximum(pre, 0), pre > 0
    if act == "relu6":
        return np.clip(pre, 0, 6), (pre > 0) & (pre < 6)
    return pre, np.ones(pre.shape, dtype=bool)


def _accumulate(grads: dict, name: str, g: np.ndarray) -> None:
    grads[name] = grads[name] + g if name in grads else np.array(g)
