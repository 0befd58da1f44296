"""The int8 graph IR of the MCU path: a CNN as the microcontroller runs it (tiny-training eq. 1).

A :class:`Graph` is a list of nodes in execution order over named tensors. Every activation
tensor is int8 with one float scale (symmetric, zero point 0): ``real = scale * code``. Weights
are int8 with one scale per output channel, biases int32 with scale ``w_scale[o] * x_scale``. The
nodes are the operators of a MobileNetV2-style network:

- :class:`Conv`: convolution with ``groups`` (1: full conv, C: depthwise; 1x1 kernels are the
  pointwise convs, and a 1x1 conv on a 1x1 map is a dense layer), bias, requantization to the
  output's scale and a fused activation (``none``, ``relu``, ``relu6``): a ReLU is a clamp of the
  int8 output, so it costs nothing and is never a separate node;
- :class:`Add`: the residual add, each input rescaled to the output's scale;
- :class:`GlobalAvgPool`: mean over the spatial positions.

Tensors are ``(C, H, W)`` (a vector is ``(C, 1, 1)``), batch size 1 as on the device. The
requantization parameters every implementation uses (host simulator, firmware) are derived here,
once, from the float scales: :func:`conv_requant`, :func:`add_requant`, :func:`gap_requant`,
:func:`act_bounds`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from insitu import numerics as nx
from insitu.errors import InsituError
from insitu.io import atomic_write

ACTIVATIONS = ("none", "relu", "relu6")

#: Input convention: a uint8 pixel p becomes the int8 code p - 128, real value (p - 128) / 128.
INPUT_SCALE = 1.0 / 128


def channels_first(images: np.ndarray) -> np.ndarray:
    """uint8 images as the graph's ``(..., C, H, W)`` layout: grey ``(N, H, W)`` (or one ``(H, W)``)
    get a channel axis ``(N, 1, H, W)``; channel-last ``(N, H, W, C)`` (RGB: C = 3) are transposed
    to ``(N, C, H, W)``. One RGB image is ``(1, H, W, 3)``: ``(H, W, 3)`` reads as 3-pixel-wide grey."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"input images must be uint8, got {images.dtype}")
    if images.ndim == 4:
        return np.ascontiguousarray(np.moveaxis(images, -1, 1))
    if images.ndim not in (2, 3):
        raise ValueError(f"input images must be (N, H, W), (H, W) or (N, H, W, C), got shape {images.shape}")
    return images[..., None, :, :]


def input_codes(images: np.ndarray) -> np.ndarray:
    """uint8 images (see :func:`channels_first`) as int8 input codes ``(..., C, H, W)``."""
    return (channels_first(images).astype(np.int16) - 128).astype(np.int8)


@dataclass
class TensorInfo:
    shape: tuple[int, int, int]
    scale: float

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class Conv:
    name: str
    x: str
    y: str
    weight: np.ndarray            # int8 [O, C // groups, K, K]
    bias: np.ndarray              # int32 [O], scale w_scale[o] * x_scale
    w_scale: np.ndarray           # float64 [O]
    stride: int = 1
    pad: int = 0
    groups: int = 1
    act: str = "none"

    kind = "conv"

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    @property
    def kernel(self) -> int:
        return self.weight.shape[2]

    @property
    def is_dense(self) -> bool:
        return self.kernel == 1 and self.groups == 1


@dataclass
class Add:
    name: str
    a: str
    b: str
    y: str
    act: str = "none"

    kind = "add"


@dataclass
class GlobalAvgPool:
    name: str
    x: str
    y: str

    kind = "gap"


Node = Conv | Add | GlobalAvgPool


@dataclass
class Graph:
    tensors: dict[str, TensorInfo]
    nodes: list[Node]
    input: str
    output: str                   # the logits, (classes, 1, 1)
    meta: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return self.tensors[self.output].shape[0]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the graph; its nodes: {[n.name for n in self.nodes]}")

    @property
    def convs(self) -> list[Conv]:
        """The layers with weights, in execution order (the paper's layer index)."""
        return [n for n in self.nodes if isinstance(n, Conv)]

    def inputs_of(self, node: Node) -> tuple[str, ...]:
        return (node.a, node.b) if isinstance(node, Add) else (node.x,)

    def validate(self) -> None:
        """Shapes, dtypes and order; raises InsituError naming the first problem."""
        defined = {self.input}
        for n in self.nodes:
            for t in self.inputs_of(n):
                if t not in defined:
                    raise InsituError(f"graph: node {n.name} reads {t!r} before it is computed")
            if n.y in defined:
                raise InsituError(f"graph: tensor {n.y!r} is written twice (node {n.name})")
            defined.add(n.y)
            if isinstance(n, Conv):
                _check_conv(n, self.tensors[n.x].shape, self.tensors[n.y].shape)
            elif isinstance(n, Add):
                if not self.tensors[n.a].shape == self.tensors[n.b].shape == self.tensors[n.y].shape:
                    raise InsituError(f"graph: add {n.name} joins tensors of different shapes")
            act = getattr(n, "act", "none")
            if act not in ACTIVATIONS:
                raise InsituError(f"graph: node {n.name} has unknown activation {act!r}")
        if self.output not in defined or self.tensors[self.output].shape[1:] != (1, 1):
            raise InsituError(f"graph: output {self.output!r} must be a computed (classes, 1, 1) tensor")

    # ------------------------------------------------------------------ files

    def save(self, path: str | Path) -> Path:
        """One .npz file: the arrays, and the structure as JSON (written atomically)."""
        arrays, nodes = {}, []
        for n in self.nodes:
            d = {"kind": n.kind, **{k: v for k, v in asdict(n).items() if not isinstance(v, np.ndarray)}}
            if isinstance(n, Conv):
                for key in ("weight", "bias", "w_scale"):
                    arrays[f"{n.name}.{key}"] = getattr(n, key)
            nodes.append(d)
        structure = {"tensors": {k: {"shape": list(v.shape), "scale": v.scale} for k, v in self.tensors.items()},
                     "nodes": nodes, "input": self.input, "output": self.output, "meta": self.meta}
        import io
        buf = io.BytesIO()
        np.savez(buf, __graph__=np.frombuffer(json.dumps(structure).encode(), dtype=np.uint8), **arrays)
        return atomic_write(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "Graph":
        try:
            with np.load(path) as z:
                structure = json.loads(bytes(z["__graph__"]).decode())
                arrays = {k: z[k] for k in z.files if k != "__graph__"}
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
            raise InsituError(f"cannot read the model {path}: {exc}; rebuild it") from None
        tensors = {k: TensorInfo(tuple(v["shape"]), float(v["scale"])) for k, v in structure["tensors"].items()}
        nodes = []
        for d in structure["nodes"]:
            kind = d.pop("kind")
            if kind == "conv":
                nodes.append(Conv(**d, **{k: arrays[f"{d['name']}.{k}"] for k in ("weight", "bias", "w_scale")}))
            elif kind == "add":
                nodes.append(Add(**d))
            elif kind == "gap":
                nodes.append(GlobalAvgPool(**d))
            else:
                raise InsituError(f"model {path}: unknown node kind {kind!r}")
        graph = cls(tensors, nodes, structure["input"], structure["output"], structure.get("meta", {}))
        graph.validate()
        return graph


def _check_conv(n: Conv, x_shape, y_shape) -> None:
    c, h, w = x_shape
    o, cg, k, k2 = n.weight.shape
    if n.weight.dtype != np.int8 or n.bias.dtype != np.int32 or n.bias.shape != (o,) or n.w_scale.shape != (o,):
        raise InsituError(f"graph: conv {n.name} needs int8 weight [O,C/g,K,K], int32 bias [O], "
                          f"w_scale [O]; got {n.weight.dtype}{n.weight.shape}, {n.bias.dtype}{n.bias.shape}")
    if k != k2 or c % n.groups or o % n.groups or cg != c // n.groups:
        raise InsituError(f"graph: conv {n.name}: weight {n.weight.shape} does not fit input "
                          f"{x_shape} with groups={n.groups}")
    oh, ow = conv_out(h, k, n.stride, n.pad), conv_out(w, k, n.stride, n.pad)
    if tuple(y_shape) != (o, oh, ow):
        raise InsituError(f"graph: conv {n.name} makes {(o, oh, ow)}, its output tensor says {y_shape}")


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


# --------------------------------------------------------------------------- quantization rules

def quantize_weight(w: np.ndarray, scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel symmetric int8: ``(codes, scales)`` with max |code| = 127 per channel, or
    the codes of the given per-channel ``scale`` (a graph's own, e.g. read back from a file)."""
    w = np.asarray(w, dtype=np.float64)
    if scale is None:
        peak = np.abs(w.reshape(len(w), -1)).max(axis=1)
        scale = np.where(peak > 0, peak / 127, 1.0)
    scale = np.asarray(scale, np.float64)
    codes = nx.saturate(nx.round_half_up(w / scale.reshape(-1, *([1] * (w.ndim - 1)))), 8)
    return codes.astype(np.int8), scale


def quantize_bias(b: np.ndarray, w_scale: np.ndarray, x_scale: float) -> np.ndarray:
    return nx.saturate(nx.round_half_up(np.asarray(b, np.float64) / (w_scale * x_scale)), 32).astype(np.int32)


def act_bounds(act: str, y_scale: float) -> tuple[int, int]:
    """The clamp of a fused activation on int8 codes of scale ``y_scale``."""
    if act == "none":
        return -128, 127
    if act == "relu":
        return 0, 127
    if act == "relu6":
        return 0, int(min(127, nx.round_half_up(6.0 / y_scale)))
    raise ValueError(f"unknown activation {act!r}; known: {ACTIVATIONS}")


def grad_bounds(act: str, y_scale: float) -> tuple[int, int] | None:
    """The open interval of output codes through which a fused activation passes its gradient
    (act_bwd's ``lo < y < hi``), or None when it passes everywhere.

    Only the activation's own flat parts stop the gradient (ReLU below 0, ReLU6 above 6); where
    the int8 range alone clips an output, the gradient passes straight through, as it does in the
    float network the update follows. Masking there would be a trap: a logit pushed into the
    clip gets no gradient to pull it back, and training collapses once the logits saturate.
    """
    if act == "none":
        return None
    if act == "relu":
        return 0, 128
    if act == "relu6":
        six = nx.round_half_up(6.0 / y_scale)
        return 0, int(six) if six <= 127 else 128
    raise ValueError(f"unknown activation {act!r}; known: {ACTIVATIONS}")


def conv_requant(n: Conv, x_scale: float, y_scale: float) -> list[nx.RequantScale]:
    """Per-output-channel scales ``s_w[o] * s_x / s_y`` of eq. 1."""
    return [nx.RequantScale.from_float(float(s) * x_scale / y_scale) for s in n.w_scale]


def gap_requant(x_scale: float, y_scale: float, positions: int) -> nx.RequantScale:
    return nx.RequantScale.from_float(x_scale / (positions * y_scale))


def add_requant(a_scale: float, b_scale: float, y_scale: float) -> tuple[int, int, int]:
    """``(ma, mb, shift)``: ``y = round((a*ma + b*mb) * 2**-shift)`` with one shift for both."""
    big = nx.RequantScale.from_float(max(a_scale, b_scale) / y_scale)
    small = int(nx.round_half_up(math.ldexp(min(a_scale, b_scale) / y_scale, big.shift)))
    ma, mb = (big.multiplier, small) if a_scale >= b_scale else (small, big.multiplier)
    return ma, mb, big.shift


def random_graph(seed: int, classes: int | None = None) -> Graph:
    """A random valid MobileNetV2-style graph (random sizes, strides, codes and scales): the
    one-spec tests run every implementation on shapes like these, not on one hand-picked net."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(5, 11))
    c1, e, f = (int(v) for v in rng.integers(2, 7, size=3))
    classes = classes or int(rng.integers(2, 6))
    stride = int(rng.integers(1, 3))
    tensors = {"x": TensorInfo((1, size, size), INPUT_SCALE)}
    nodes: list[Node] = []

    def conv(name, x, o, k, stride=1, groups=1, act="relu6"):
        c, h, w = tensors[x].shape
        weight = rng.integers(-127, 128, size=(o, c // groups, k, k)).astype(np.int8)
        w_scale = rng.uniform(0.2, 1.0, size=o) / (127 * np.sqrt(c // groups * k * k))
        bias = rng.integers(-2000, 2000, size=o).astype(np.int32)
        pad = k // 2
        tensors[name] = TensorInfo((o, conv_out(h, k, stride, pad), conv_out(w, k, stride, pad)),
                                   float(rng.uniform(0.01, 0.05)))
        nodes.append(Conv(name, x, name, weight, bias, w_scale, stride, pad, groups, act))
        return name

    stem = conv("stem", "x", c1, 3, stride)
    ex = conv("b1.expand", stem, e, 1)
    dw = conv("b1.dw", ex, e, 3, groups=e)
    pr = conv("b1.project", dw, c1, 1, act="none")
    tensors["b1.add"] = TensorInfo(tensors[stem].shape, float(rng.uniform(0.02, 0.06)))
    nodes.append(Add("b1.add", stem, pr, "b1.add"))
    head = conv("head", "b1.add", f, 1, act="relu")
    tensors["pool"] = TensorInfo((f, 1, 1), float(rng.uniform(0.01, 0.05)))
    nodes.append(GlobalAvgPool("pool", head, "pool"))
    conv("classifier", "pool", classes, 1, act="none")
    graph = Graph(tensors, nodes, "x", "classifier")
    graph.validate()
    return graph
