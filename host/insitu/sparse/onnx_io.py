"""ONNX models on the MCU path: a float ONNX CNN imported as insitu's int8 graph, and an int8 graph
exported as a float ONNX model that imports back to the identical graph.

**Import** (:func:`import_onnx`) maps the float graph node by node onto a
:class:`~insitu.sparse.graph.Graph`, then quantizes it as :mod:`insitu.sparse.quantize` quantizes
the built-in models: per-channel int8 weights (:func:`~insitu.sparse.graph.quantize_weight`), int32
biases (:func:`~insitu.sparse.graph.quantize_bias`) and one scale per activation tensor, calibrated
on uint8 images with the rule of the built-in models (:func:`~insitu.sparse.quantize.activation_scale`).
The operators it takes (:data:`SUPPORTED`):

* ``Conv``: groups 1, or depthwise (groups = input channels = output channels: the only grouped
  conv the training path's gradient calibration and float reference take), square kernels, equal
  strides, one pad on every side (``auto_pad`` SAME when that comes out symmetric), dilation 1;
* ``BatchNormalization`` right after a Conv (or Gemm / MatMul): folded into it (inference mode);
* ``Relu`` and ``Clip`` with min 0 and max 6 (relu6; min/max as attributes before opset 11, as
  inputs after) right after a Conv (or a folded BN): fused into the conv, as the int8 graph's
  activation is a clamp of the conv's output. An activation after an ``Add`` is refused: the
  training compiler passes the add's gradient on unmasked;
* ``Add`` of two tensors of one shape (a residual); ``Add`` of a per-channel constant right after
  a Conv, Gemm or MatMul (a MatMul's bias): folded into its bias;
* ``GlobalAveragePool``; ``Flatten`` / ``Reshape`` of the pooled ``(C, 1, 1)`` map to a vector;
* ``Gemm`` (transA 0, any alpha, beta, transB) and ``MatMul`` (+ ``Add`` bias) on that vector:
  a 1x1 conv on the pooled 1x1 map, as :func:`~insitu.sparse.quantize.build_graph` makes the
  built-in classifier; the model's output must be the last of them, the logits (nothing after it:
  the training loss applies its own softmax);
* ``Identity``, ``Dropout`` (inference no-ops) and ``Constant``.

Anything else, or a supported operator used in a way the int8 graph cannot express, is a
:class:`~insitu.errors.UsageError` naming the operator, the node and the supported list.

**Input convention.** The model takes one NCHW float input with 1 or 3 channels and a fixed
height and width (the batch dimension may be symbolic), in insitu's range: a uint8 pixel ``p`` is
``(p - 128) / 128`` (:data:`~insitu.sparse.graph.INPUT_SCALE`; the int8 input code is ``p - 128``).
A model trained on another normalization (``p / 255``, ImageNet mean and std) must have it
folded into its first conv before export.

**Names.** Every conv, add and pool node keeps its ONNX node name (``/`` becomes ``.``, other
characters outside ``[A-Za-z0-9_.-]`` become ``_``, duplicates get ``_2``...; an unnamed node is
``conv3``, ``add1``...); a conv's output tensor is named after its node, the input and the logits
after the ONNX graph's input and output.

**Export** (:func:`export_onnx`) writes dequantized weights (``code * w_scale``) and biases
(``code * w_scale * x_scale``) as float32 Conv (+ Relu / Clip), Add, GlobalAveragePool, and the
classifier as Flatten + Gemm (opset 13), and keeps the int8 graph's own numbers in the model's
``metadata_props`` (:data:`METADATA_KEY`): every activation scale, every weight scale (float64: a
float32 weight cannot carry it exactly), the bias codes of a layer whose float32 biases would not
round back to them, and a digest of the graph. Imported without recalibration, such a file gives
the identical graph (the digest is checked; an edited file is calibrated as any other).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import insitu.nn as nn
from insitu.errors import InsituError, UsageError
from insitu.sparse import graph as g
from insitu.sparse.calibrate import _activation
from insitu.sparse.models import Unit, _conv_float, fold_bn

__all__ = ["SUPPORTED", "METADATA_KEY", "INPUT_CONVENTION", "FloatNode", "FloatNet", "read_onnx", "import_onnx",
           "export_onnx", "file_sha256"]

SUPPORTED = ("Conv", "BatchNormalization", "Relu", "Clip", "Add", "GlobalAveragePool", "Flatten", "Reshape",
             "Gemm", "MatMul", "Identity", "Dropout", "Constant")
#: The metadata_props key of the int8 graph's own numbers in an exported file.
METADATA_KEY = "insitu.int8"
METADATA_FORMAT = 1
EXPORT_OPSET = 13
#: IR version 8 (ONNX 1.10+) is read by every onnxruntime the project supports.
EXPORT_IR_VERSION = 8
INPUT_CONVENTION = ("one NCHW float input, 1 or 3 channels, fixed height and width, taking a uint8 pixel p "
                    "as (p - 128) / 128")
#: What every refusal ends with: what the importer takes.
_TAKES = (f"insitu's int8 graph takes {', '.join(SUPPORTED)} (see insitu.sparse.onnx_io; the model's input: "
          f"{INPUT_CONVENTION})")
_CALIBRATION_BATCH = 250


def _onnx():
    try:
        import onnx
    except ImportError:
        raise InsituError("reading or writing .onnx models needs the onnx package: "
                          "pip install 'insitu[host]'") from None
    return onnx


def file_sha256(path: str | Path) -> str:
    """The sha256 of a model file (a UsageError naming it if it is missing or unreadable)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"model {path}: no such file" if not path.exists() else f"model {path}: not a file")
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UsageError(f"model {path}: cannot read it ({exc.strerror})") from None


# --------------------------------------------------------------------------- the float network


@dataclass
class FloatNode:
    """One node of the float network, on the int8 graph's tensor names: ``conv`` (its float
    :class:`~insitu.sparse.models.Unit`, BN folded, activation fused), ``add`` or ``gap``."""

    kind: str
    name: str
    inputs: tuple[str, ...]
    y: str
    unit: Unit | None = None

    @property
    def conv_unit(self) -> Unit:
        """A conv node's unit (every conv node has one)."""
        assert self.unit is not None, f"{self.kind} node {self.name} has no unit"
        return self.unit


@dataclass
class FloatNet:
    """A float CNN read from ONNX, node for node the int8 graph it becomes: shapes ``(C, H, W)``
    by tensor (a vector of ONNX is a ``(C, 1, 1)`` map here, as in the int8 graph);
    ``metadata``: the file's ``metadata_props``."""

    input: str
    output: str
    shapes: dict[str, tuple[int, int, int]]
    nodes: list[FloatNode]
    metadata: dict[str, str] = field(default_factory=dict)

    def forward(self, x: np.ndarray, record: dict | None = None) -> np.ndarray:
        """Float forward (float64) on inputs ``(N, C, H, W)``: the logits ``(N, classes)``, the
        function the int8 graph approximates. ``record`` receives every tensor by name."""
        vals = {self.input: np.asarray(x, np.float64)}
        for n in self.nodes:
            if n.kind == "conv":
                u = n.conv_unit
                y = _activation(_conv_float(vals[n.inputs[0]], u.weight, u.bias, u.stride, u.pad, u.groups), u.act)[0]
            elif n.kind == "add":
                y = vals[n.inputs[0]] + vals[n.inputs[1]]
            else:
                y = vals[n.inputs[0]].mean(axis=(2, 3), keepdims=True)
            vals[n.y] = y
        if record is not None:
            record.update(vals)
        return vals[self.output].reshape(len(vals[self.output]), -1)


def _clean(name: str) -> str:
    """An ONNX name as an insitu layer or tensor name (usable in a scheme and ``--lr-scale``)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("/", ".").replace("::", "."))
    return re.sub(r"\.{2,}", ".", name).strip("._")


class _Reader:
    """The ONNX graph walked once, in its (topological) node order, into a :class:`FloatNet`."""

    def __init__(self, model, path: Path):
        onnx = _onnx()
        self.path, self.numpy_helper, self.helper = path, onnx.numpy_helper, onnx.helper
        graph = model.graph
        self.consts = {t.name: np.asarray(self.numpy_helper.to_array(t), np.float64) for t in graph.initializer}
        self.consumers: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers[name] = self.consumers.get(name, 0) + 1
        for out in graph.output:
            self.consumers[out.name] = self.consumers.get(out.name, 0) + 1
        self.tensor: dict[str, str] = {}           # ONNX tensor -> int8 graph tensor
        self.shapes: dict[str, tuple[int, int, int]] = {}
        self.flat: set[str] = set()                # ONNX tensors that are vectors (N, C)
        self.nodes: list[FloatNode] = []
        self.made_by: dict[str, FloatNode] = {}    # int8 tensor -> its node
        # A conv's output may still take a BN ("bn"), an activation ("act"), a bias Add ("bias"),
        # until its activation: int8 tensor -> what it takes, and the ONNX tensor it is now.
        self.open: dict[str, set[str]] = {}
        self.head: dict[str, str] = {}
        self.node_names: set[str] = set()
        self.counts: dict[str, int] = {}
        self._input(graph)
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                raise self.refuse(node, f"operator of domain {node.domain!r} not supported")
            handler = getattr(self, f"_op_{node.op_type}", None)
            if handler is None:
                raise self.refuse(node, "operator not supported" + self._after_classifier_hint(node))
            handler(node, {a.name: self.helper.get_attribute_value(a) for a in node.attribute})
        self.output = self._output(graph)

    # ------------------------------------------------------------------ errors and names

    def refuse(self, node, why: str) -> UsageError:
        return UsageError(f"model {self.path}: {node.op_type} node {node.name or '(unnamed)'}: {why}; {_TAKES}")

    def _after_classifier_hint(self, node) -> str:
        if any(i in self.flat for i in node.input):
            return " (nothing may follow the classifier: the int8 graph ends in its logits)"
        return ""

    def _unique(self, base: str, taken: set[str]) -> str:
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    def _node_name(self, node, prefix: str) -> str:
        base = _clean(node.name)
        if not base:
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            base = f"{prefix}{self.counts[prefix]}"
        return self._unique(base, self.node_names)

    # ------------------------------------------------------------------ inputs and operands

    def _input(self, graph) -> None:
        inputs = [i for i in graph.input if i.name not in self.consts]
        if len(inputs) != 1:
            raise UsageError(f"model {self.path}: {len(inputs)} graph inputs ({', '.join(i.name for i in inputs)}); "
                             f"the MCU path takes {INPUT_CONVENTION}")
        x = inputs[0]
        t = x.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        c, h, w = dims[1:] if len(dims) == 4 else (None, None, None)
        if t.elem_type != _onnx().TensorProto.FLOAT or c not in (1, 3) or not (h and h > 0 and w and w > 0):
            raise UsageError(f"model {self.path}: input {x.name} is {self._describe_input(t, dims)}; the MCU path "
                             f"takes {INPUT_CONVENTION}")
        self.input = self._unique(_clean(x.name) or "input", set())
        self.tensor[x.name] = self.input
        self.shapes[self.input] = (c, h, w)

    def _describe_input(self, t, dims) -> str:
        kind = _onnx().helper.tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else "untyped"
        return f"{kind} of shape {['?' if d is None else d for d in dims]}"

    def _taken(self) -> set[str]:
        return set(self.shapes)

    def act(self, node, i: int, flat: bool | None = False) -> str:
        """The int8 tensor of input ``i`` (an activation: not a constant); ``flat``: must it be a
        vector (True), a map (False), or either (None)."""
        name = node.input[i] if i < len(node.input) else ""
        if name in self.consts or name not in self.tensor:
            raise self.refuse(node, f"input {i} ({name or 'missing'}) must be an activation tensor, not a constant")
        if flat is not None and (name in self.flat) != flat:
            raise self.refuse(node, f"input {name} is {'a vector' if name in self.flat else 'a (C, H, W) map'}; "
                                    f"{node.op_type} takes {'the flattened pooled vector' if flat else 'a map'} here")
        return self.tensor[name]

    def const(self, node, i: int, what: str) -> np.ndarray:
        """The constant input ``i``, or a refusal if it is missing or computed."""
        value = self.optional_const(node, i, what)
        if value is None:
            raise self.refuse(node, f"its {what} is missing")
        return value

    def optional_const(self, node, i: int, what: str) -> np.ndarray | None:
        """The constant input ``i``, None if it is absent, or a refusal if it is computed."""
        name = node.input[i] if i < len(node.input) else ""
        if not name:
            return None
        if name not in self.consts:
            raise self.refuse(node, f"its {what} ({name}) must be a constant (an initializer), not computed")
        return self.consts[name]

    def alias(self, node, t: str, flat: bool | None = None) -> None:
        """``node``'s output is its input's int8 tensor ``t`` (a vector if ``flat``, else as the input)."""
        src, out = node.input[0], node.output[0]
        self.tensor[out] = t
        if flat or (flat is None and src in self.flat):
            self.flat.add(out)
        if self.head.get(t) == src:
            self.head[t] = out

    def extra_outputs(self, node) -> None:
        if any(o and self.consumers.get(o) for o in node.output[1:]):
            raise self.refuse(node, "its extra outputs (training mode) are used")

    # ------------------------------------------------------------------ node kinds

    def add_conv(self, node, x: str, weight, bias, stride=1, pad=0, groups=1) -> None:
        name = self._node_name(node, "conv")
        o = weight.shape[0]
        c, h, w = self.shapes[x]
        y = self._unique(name, self._taken())
        self.shapes[y] = (o, g.conv_out(h, weight.shape[2], stride, pad), g.conv_out(w, weight.shape[3], stride, pad))
        unit = Unit(name, np.asarray(weight, np.float64), np.asarray(bias, np.float64).reshape(o), stride, pad,
                    groups, "none")
        self.emit(node, FloatNode("conv", name, (x,), y, unit), y)
        self.open[y], self.head[y] = {"bn", "act", "bias"}, node.output[0]

    def emit(self, node, n: FloatNode, y: str) -> None:
        self.nodes.append(n)
        self.made_by[y] = n
        self.tensor[node.output[0]] = y

    def fusing(self, node, what: str) -> FloatNode:
        """The conv whose output ``node`` (a BN, an activation, a bias) folds into, or a refusal."""
        src = node.input[0]
        t = self.tensor.get(src)
        made = self.made_by.get(t) if t is not None else None
        op = {"bn": "a BatchNormalization", "act": "an activation", "bias": "a bias Add"}[what]
        if t is None or made is None or made.kind != "conv":
            after = "the model's input" if t == self.input else (f"a {made.kind} node ({made.name})" if made else src)
            note = (" (an activation after Add is not supported: the training compiler passes the add's gradient "
                    "on unmasked)") if made is not None and made.kind == "add" and what == "act" else ""
            raise self.refuse(node, f"{op} must follow a Conv, Gemm or MatMul, into which it is folded; this one "
                                    f"follows {after}{note}")
        if self.head.get(t) != src or self.consumers.get(src, 0) != 1:
            raise self.refuse(node, f"its input {src} is also read elsewhere, so it cannot be folded into {made.name}")
        if what not in self.open[t]:
            why = {"bn": "a BatchNormalization after the activation (or a second one)",
                   "act": "a second activation", "bias": "a bias Add after the activation"}[what]
            raise self.refuse(node, f"{why} cannot be folded into {made.name}")
        self.alias(node, t)
        return made

    def _op_Conv(self, node, a) -> None:
        x = self.act(node, 0)
        weight = self.const(node, 1, "weight")
        bias = self.optional_const(node, 2, "bias")
        c, h, w = self.shapes[x]
        if weight.ndim != 4:
            raise self.refuse(node, f"a {weight.ndim - 2}-D conv (the int8 graph's convs are 2-D)")
        o, cg, kh, kw = weight.shape
        group = int(a.get("group", 1))
        if kh != kw:
            raise self.refuse(node, f"kernel {kh}x{kw}: the int8 graph's kernels are square")
        if any(d != 1 for d in a.get("dilations", [1, 1])):
            raise self.refuse(node, f"dilations {list(a['dilations'])}: the int8 graph's convs have dilation 1")
        strides = list(a.get("strides", [1, 1]))
        if len(set(strides)) != 1:
            raise self.refuse(node, f"strides {strides}: the int8 graph's convs have one stride for both axes")
        pad = self._pad(node, a, (h, w), kh, strides[0])
        if cg * group != c:
            raise self.refuse(node, f"weight {list(weight.shape)} with group={group} does not fit {c} input channels")
        if group != 1 and not (group == c == o):
            raise self.refuse(node, f"group={group} with {c} input and {o} output channels: the int8 graph trains "
                                    "full (group=1) and depthwise (group = input = output channels) convs only")
        self.add_conv(node, x, weight, np.zeros(o) if bias is None else bias, strides[0], pad, group)

    def _pad(self, node, a, hw, k: int, stride: int) -> int:
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        if auto == "VALID":
            return 0
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            totals = {max((math.ceil(n / stride) - 1) * stride + k - n, 0) for n in hw}
            if len(totals) != 1 or next(iter(totals)) % 2:
                raise self.refuse(node, f"auto_pad {auto} pads asymmetrically here; the int8 graph's convs pad "
                                        "every side alike")
            return next(iter(totals)) // 2
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if len(set(pads)) != 1:
            raise self.refuse(node, f"pads {pads} are asymmetric; the int8 graph's convs pad every side alike")
        return int(pads[0])

    def _op_BatchNormalization(self, node, a) -> None:
        if int(a.get("training_mode", 0)):
            raise self.refuse(node, "training_mode=1 (only inference-mode BatchNormalization folds)")
        self.extra_outputs(node)
        conv = self.fusing(node, "bn")
        gamma, beta, mean, var = (self.const(node, i, what) for i, what in
                                  enumerate(("scale", "bias", "mean", "variance"), start=1))
        bn = nn.BatchNorm(gamma.size, eps=float(a.get("epsilon", 1e-5)))
        bn.params.update(gamma=gamma, beta=beta)
        bn.buffers.update(running_mean=mean, running_var=var)
        unit = conv.conv_unit
        unit.weight, unit.bias = fold_bn(unit.weight, unit.bias, bn)
        self.open[conv.y].discard("bn")

    def _op_Relu(self, node, a) -> None:
        self._activate(node, "relu")

    def _op_Clip(self, node, a) -> None:
        lo, hi = a.get("min"), a.get("max")
        if len(node.input) > 1 and node.input[1]:
            lo = float(self.const(node, 1, "min"))
        if len(node.input) > 2 and node.input[2]:
            hi = float(self.const(node, 2, "max"))
        if lo == 0 and hi == 6:
            self._activate(node, "relu6")
        elif lo == 0 and (hi is None or hi >= np.finfo(np.float32).max):
            self._activate(node, "relu")
        else:
            raise self.refuse(node, f"Clip(min={lo}, max={hi}): only Clip(0, 6) (relu6) and Clip(0) (relu) are "
                                    "int8 activations")

    def _activate(self, node, act: str) -> None:
        conv = self.fusing(node, "act")
        conv.conv_unit.act = act
        self.open[conv.y].clear()

    def _op_Add(self, node, a) -> None:
        consts = [i for i in (0, 1) if node.input[i] in self.consts]
        if consts:
            if len(consts) == 2:
                raise self.refuse(node, "an Add of two constants")
            src = node.input[1 - consts[0]]
            c, o = self.consts[node.input[consts[0]]], self.shapes[self.act(node, 1 - consts[0], None)][0]
            # A per-channel constant: (O,) on a vector, (O, 1, 1) on a map (leading 1s allowed).
            channel_axis = -1 if src in self.flat else -3
            if c.size != 1 and (c.size != o or c.ndim < -channel_axis or c.shape[channel_axis] != o):
                raise self.refuse(node, f"a constant of shape {list(c.shape)} added to a tensor of {o} channels "
                                        "(only a per-channel bias folds into the conv before it)")
            conv = self.fusing(SimpleNamespace(input=[src], output=node.output, op_type="Add", name=node.name), "bias")
            unit = conv.conv_unit
            unit.bias = unit.bias + np.broadcast_to(c.reshape(-1), (o,))
            return
        ta, tb = self.act(node, 0, None), self.act(node, 1, None)
        flat = node.input[0] in self.flat
        if self.shapes[ta] != self.shapes[tb] or flat != (node.input[1] in self.flat):
            raise self.refuse(node, f"it joins tensors of shapes {self.shapes[ta]} and {self.shapes[tb]}; the int8 "
                                    "graph's Add (a residual) joins two tensors of one shape")
        name = self._node_name(node, "add")
        y = self._unique(name, self._taken())
        self.shapes[y] = self.shapes[ta]
        self.emit(node, FloatNode("add", name, (ta, tb), y), y)
        if flat:
            self.flat.add(node.output[0])

    def _op_GlobalAveragePool(self, node, a) -> None:
        x = self.act(node, 0)
        name = self._node_name(node, "pool")
        y = self._unique(name, self._taken())
        self.shapes[y] = (self.shapes[x][0], 1, 1)
        self.emit(node, FloatNode("gap", name, (x,), y), y)

    def _flatten(self, node, ok: bool, what: str) -> None:
        t = self.act(node, 0, None)
        if self.shapes[t][1:] != (1, 1) or not ok:
            raise self.refuse(node, f"{what}; it is supported only to make the pooled (C, 1, 1) map "
                                    f"(here {self.shapes[t]}) a vector")
        # The vector is the map's own int8 tensor; a conv's output stays open to what may follow.
        self.alias(node, t, flat=True)

    def _op_Flatten(self, node, a) -> None:
        axis = int(a.get("axis", 1))
        self._flatten(node, axis == 1, f"axis={axis}")

    def _op_Reshape(self, node, a) -> None:
        shape = [int(v) for v in self.const(node, 1, "shape")]
        c = self.shapes[self.act(node, 0, None)][0]
        ok = len(shape) == 2 and (shape[1] == c or (shape[1] == -1 and shape[0] in (-1, 0, 1)))
        self._flatten(node, ok, f"shape {shape}")

    def _classifier(self, node, weight, bias) -> None:
        x = self.act(node, 0, flat=True)
        c = self.shapes[x][0]
        if weight.ndim != 2 or weight.shape[1] != c:
            raise self.refuse(node, f"weight of shape {list(weight.shape)} on a vector of {c}")
        self.add_conv(node, x, weight[:, :, None, None], bias)
        self.flat.add(node.output[0])

    def _op_Gemm(self, node, a) -> None:
        if int(a.get("transA", 0)):
            raise self.refuse(node, "transA=1")
        b = self.const(node, 1, "weight (B)")
        w = float(a.get("alpha", 1.0)) * (b if int(a.get("transB", 0)) else b.T)
        c = self.optional_const(node, 2, "bias (C)")
        o = w.shape[0]
        if c is not None and c.size not in (1, o):
            raise self.refuse(node, f"bias C of shape {list(c.shape)} for {o} outputs")
        bias = np.zeros(o) if c is None else float(a.get("beta", 1.0)) * np.broadcast_to(c.reshape(-1), (o,))
        self._classifier(node, w, bias)

    def _op_MatMul(self, node, a) -> None:
        b = self.const(node, 1, "weight (B)")
        self._classifier(node, b.T, np.zeros(b.shape[-1]))

    def _op_Identity(self, node, a) -> None:
        if node.input[0] in self.consts:
            self.consts[node.output[0]] = self.consts[node.input[0]]
        else:
            self.alias(node, self.act(node, 0, None))

    def _op_Dropout(self, node, a) -> None:
        self.extra_outputs(node)
        self._op_Identity(node, a)

    def _op_Constant(self, node, a) -> None:
        if "value" in a:
            value = self.numpy_helper.to_array(a["value"])
        else:
            keys = [k for k in ("value_float", "value_floats", "value_int", "value_ints") if k in a]
            if not keys:
                raise self.refuse(node, f"a Constant of {sorted(a)} (only tensors and numbers)")
            value = a[keys[0]]
        self.consts[node.output[0]] = np.asarray(value, np.float64)

    # ------------------------------------------------------------------ the end

    def _output(self, graph) -> str:
        outs = list(graph.output)
        t = self.tensor.get(outs[0].name) if len(outs) == 1 else None
        made = self.made_by.get(t) if t is not None else None
        if made is None or made.kind != "conv" or made.conv_unit.weight.shape[2] != 1 \
                or made.conv_unit.groups != 1 or self.shapes[made.inputs[0]][1:] != (1, 1):
            what = (f"{len(outs)} outputs" if len(outs) != 1 else
                    f"its output {outs[0].name} is made by {'a ' + made.kind + ' node' if made else 'no supported node'}")
            raise UsageError(f"model {self.path}: the model must end in a classifier on the pooled vector "
                             f"(GlobalAveragePool, Flatten, then Gemm or MatMul), whose output (the logits) is the "
                             f"model's one output; {what}; {_TAKES}")
        if any(made.y in n.inputs for n in self.nodes):
            raise UsageError(f"model {self.path}: the logits ({outs[0].name}) are read by other nodes; nothing "
                             "may follow the classifier")
        # The logits take the ONNX output's name (insitu's own: "logits").
        name = _clean(outs[0].name)
        if name and name != made.y and name not in self.shapes:
            self.shapes[name] = self.shapes.pop(made.y)
            made.y = name
        return made.y


def read_onnx(path: str | Path) -> FloatNet:
    """The float network of an ONNX file (see the module docstring for what it takes); a
    :class:`~insitu.errors.UsageError` naming the file if it is missing, unreadable, not ONNX, or
    uses what the int8 graph cannot express."""
    path = Path(path)
    file_sha256(path)                                   # missing / unreadable: named
    onnx = _onnx()
    try:
        model = onnx.load(str(path))
        if model.graph.node:                            # (an empty file parses as an empty model)
            onnx.checker.check_model(model)
    except Exception as exc:                            # DecodeError, ValidationError, ...: not usable ONNX
        raise UsageError(f"model {path}: not an ONNX model ({type(exc).__name__}: {str(exc).strip()[:300]})") from None
    if not model.graph.node:
        raise UsageError(f"model {path}: not an ONNX model (its graph has no nodes)")
    reader = _Reader(model, path)
    return FloatNet(reader.input, reader.output, reader.shapes, reader.nodes,
                    {p.key: p.value for p in model.metadata_props})


# --------------------------------------------------------------------------- import


def calibrate(net: FloatNet, images: np.ndarray, percentile: float) -> dict[str, float]:
    """Every activation tensor's scale from uint8 ``images`` (``(N, H, W)`` grey or ``(N, H, W, C)``),
    by the built-in models' rule (:func:`insitu.sparse.quantize.activation_scale`)."""
    from insitu.sparse.quantize import activation_scale
    from insitu.sparse.tasks import float_inputs

    x = float_inputs(images, np.float64)
    if x.shape[1:] != net.shapes[net.input] or not len(x):
        raise UsageError(f"calibration images of shape {x.shape[1:]} (C, H, W) for a model that takes "
                         f"{net.shapes[net.input]}")
    # The max (percentile 100, the default) needs each batch's max only, not every activation.
    keep = (lambda v: np.abs(v).max(keepdims=True)) if percentile >= 100 else (lambda v: v)
    records: dict[str, list[np.ndarray]] = {}
    for i in range(0, len(x), _CALIBRATION_BATCH):
        rec: dict[str, np.ndarray] = {}
        net.forward(x[i:i + _CALIBRATION_BATCH], rec)
        for name, v in rec.items():
            records.setdefault(name, []).append(keep(v))
    scales = {name: activation_scale(parts, percentile) for name, parts in records.items()}
    scales[net.input] = g.INPUT_SCALE
    return scales


def int8_graph(net: FloatNet, scales: dict[str, float], meta: dict | None = None,
               weight_scales: dict[str, np.ndarray] | None = None,
               bias_codes: dict[str, np.ndarray] | None = None) -> g.Graph:
    """The int8 graph of ``net`` with activation ``scales``; ``weight_scales`` / ``bias_codes``:
    a graph's own per-layer numbers (an export's), else quantized by the built-in models' rule."""
    T = net.shapes
    tensors = {net.input: g.TensorInfo(T[net.input], g.INPUT_SCALE)}
    nodes: list[g.Node] = []
    for n in net.nodes:
        tensors[n.y] = g.TensorInfo(T[n.y], float(scales[n.y]))
        if n.kind == "conv":
            u = n.conv_unit
            weight, w_scale = g.quantize_weight(u.weight, (weight_scales or {}).get(n.name))
            bias = (bias_codes or {}).get(n.name)
            if bias is None:
                bias = g.quantize_bias(u.bias, w_scale, tensors[n.inputs[0]].scale)
            nodes.append(g.Conv(n.name, n.inputs[0], n.y, weight, np.asarray(bias, np.int32), w_scale,
                                u.stride, u.pad, u.groups, u.act))
        elif n.kind == "add":
            a, b = n.inputs
            nodes.append(g.Add(n.name, a, b, n.y))
        else:
            nodes.append(g.GlobalAvgPool(n.name, n.inputs[0], n.y))
    graph = g.Graph(tensors, nodes, net.input, net.output, dict(meta or {}))
    graph.validate()
    return graph


def _stored(net: FloatNet, path: Path, meta: dict) -> tuple[g.Graph | None, str]:
    """The graph from the int8 numbers an export keeps in the file, or ``(None, why not)``."""
    from insitu.sparse.contributions import graph_digest

    text = net.metadata.get(METADATA_KEY)
    if text is None:
        return None, "no insitu scales in the file"
    try:
        data = json.loads(text)
        graph = int8_graph(net, data["scales"], meta,
                           {k: np.asarray(v, np.float64) for k, v in data["weight_scales"].items()},
                           {k: np.asarray(v, np.int64) for k, v in data.get("bias_codes", {}).items()})
    except (ValueError, KeyError, TypeError, InsituError) as exc:
        return None, f"its insitu scales do not fit its graph ({type(exc).__name__}: {exc})"
    if graph_digest(graph) != data.get("digest"):
        return None, "its weights changed after insitu exported it (the digest differs)"
    return graph, ""


def import_onnx(path: str | Path, calib_images: np.ndarray | None = None, *, recalibrate: bool = False,
                percentile: float | None = None, uncalibrated: bool = False, net: FloatNet | None = None) -> g.Graph:
    """The int8 graph of the float ONNX model at ``path`` (see the module docstring).

    Activation scales: those an insitu export keeps in the file, unless ``recalibrate``; else
    measured on ``calib_images`` (uint8 ``(N, H, W)`` or ``(N, H, W, C)``, in the model's input
    size and channels) with the built-in models' rule (``percentile`` of ``|activation|``, default
    :data:`insitu.sparse.quantize.CALIBRATION_PERCENTILE`); ``uncalibrated``: placeholder scales
    (the layers' names and shapes, for checks). ``graph.meta`` records the file, its sha256 and
    the calibration. ``net``: the file's :func:`read_onnx`, if already read."""
    from insitu.sparse.quantize import CALIBRATION_PERCENTILE

    path = Path(path)
    sha = file_sha256(path)
    net = net if net is not None else read_onnx(path)
    percentile = CALIBRATION_PERCENTILE if percentile is None else float(percentile)
    meta = {"model": path.name, "source": {"path": str(path.resolve()), "sha256": sha, "format": "onnx"}}
    if METADATA_KEY in net.metadata and not recalibrate:
        graph, why = _stored(net, path, {**meta, "calibration": {"from": "the file's insitu scales"}})
        if graph is not None:
            exported = json.loads(net.metadata[METADATA_KEY]).get("meta")
            if exported:
                graph.meta["exported"] = exported
            return graph
    else:
        why = "recalibration asked for" if recalibrate else "no insitu scales in the file"
    if uncalibrated:
        scales = {t: 1.0 / 127 for t in net.shapes}
        return int8_graph(net, scales, {**meta, "untrained": True, "calibration": None})
    if calib_images is None:
        raise UsageError(f"model {path}: {why}; its activation scales must be calibrated: give calibration "
                         f"images ({INPUT_CONVENTION})")
    images = np.asarray(calib_images)
    scales = calibrate(net, images, percentile)
    calibration = {"samples": int(len(images)), "percentile": percentile,
                   "images_sha256": hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest(),
                   "why": why}
    return int8_graph(net, scales, {**meta, "calibration": calibration})


# --------------------------------------------------------------------------- export


def export_onnx(graph_or_model: g.Graph | str, path: str | Path) -> Path:
    """Write an int8 graph (or the pretrained graph of a built-in model name) as a float ONNX
    model that :func:`import_onnx` reads back to the identical graph (checked before writing: an
    InsituError if it would not). Returns the path."""
    from insitu.io import atomic_write
    from insitu.sparse.contributions import graph_digest

    if isinstance(graph_or_model, str):
        from insitu.sparse.pretrain import pretrained

        graph = pretrained(graph_or_model)
    else:
        graph = graph_or_model
    graph.validate()
    onnx = _onnx()
    model, numbers = _to_onnx(graph, onnx)
    path = Path(path)
    data = model.SerializeToString()
    # The round trip, checked on the bytes about to be written.
    with tempfile.TemporaryDirectory(prefix="insitu-export-") as tmp:
        probe = Path(tmp) / "model.onnx"
        probe.write_bytes(data)
        back = import_onnx(probe)
    if graph_digest(back) != numbers["digest"]:
        raise InsituError(f"export: {path} would not import back to the identical graph")
    return atomic_write(path, data)


def _to_onnx(graph: g.Graph, onnx):
    from insitu.sparse.contributions import graph_digest

    helper, numpy_helper, TP = onnx.helper, onnx.numpy_helper, onnx.TensorProto
    T = graph.tensors
    inits: dict[str, np.ndarray] = {}
    nodes = []
    weight_scales, bias_codes = {}, {}

    def const(name: str, value) -> str:
        inits[name] = np.asarray(value, np.float32)
        return name

    for n in graph.nodes:
        if isinstance(n, g.Add):
            if n.act != "none":
                raise InsituError(f"export: add {n.name} has a fused {n.act}, which ONNX import refuses "
                                  "(an activation after Add)")
            nodes.append(helper.make_node("Add", [n.a, n.b], [n.y], name=n.name))
            continue
        if isinstance(n, g.GlobalAvgPool):
            nodes.append(helper.make_node("GlobalAveragePool", [n.x], [n.y], name=n.name))
            continue
        x_scale = T[n.x].scale
        w = (n.weight.astype(np.float64) * n.w_scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        b = (n.bias.astype(np.float64) * n.w_scale * x_scale).astype(np.float32)
        codes, _ = g.quantize_weight(w, n.w_scale)
        if not np.array_equal(codes, n.weight):
            raise InsituError(f"export: the float32 weights of {n.name} do not requantize to its codes")
        weight_scales[n.name] = [float(s) for s in n.w_scale]
        if not np.array_equal(g.quantize_bias(b, n.w_scale, x_scale), n.bias):
            bias_codes[n.name] = [int(v) for v in n.bias]      # float32 cannot carry them: kept exactly
        out = n.y if n.act == "none" else f"{n.y}.{n.act}_in"
        if n.y == graph.output:
            if not (n.is_dense and T[n.x].shape[1:] == (1, 1)):
                raise InsituError(f"export: the graph's output is made by {n.name}, not a dense classifier on a "
                                  "pooled (C, 1, 1) map")
            flat = f"{n.x}.flat"
            nodes.append(helper.make_node("Flatten", [n.x], [flat], name=f"{n.name}.flatten", axis=1))
            nodes.append(helper.make_node("Gemm", [flat, const(f"{n.name}.weight", w[:, :, 0, 0]),
                                                   const(f"{n.name}.bias", b)], [out], name=n.name, transB=1))
        else:
            k = n.kernel
            nodes.append(helper.make_node("Conv", [n.x, const(f"{n.name}.weight", w), const(f"{n.name}.bias", b)],
                                          [out], name=n.name, kernel_shape=[k, k], strides=[n.stride] * 2,
                                          pads=[n.pad] * 4, group=n.groups))
        if n.act == "relu":
            nodes.append(helper.make_node("Relu", [out], [n.y], name=f"{n.name}.relu"))
        elif n.act == "relu6":
            nodes.append(helper.make_node("Clip", [out, const("relu6.min", 0.0), const("relu6.max", 6.0)], [n.y],
                                          name=f"{n.name}.relu6"))
    c, h, w_ = T[graph.input].shape
    classes = graph.num_classes
    onnx_graph = helper.make_graph(
        nodes, "insitu", [helper.make_tensor_value_info(graph.input, TP.FLOAT, ["N", c, h, w_])],
        [helper.make_tensor_value_info(graph.output, TP.FLOAT, ["N", classes])],
        [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", EXPORT_OPSET)],
                              producer_name="insitu", doc_string=f"insitu int8 graph; input: {INPUT_CONVENTION}")
    model.ir_version = EXPORT_IR_VERSION
    numbers = {"format": METADATA_FORMAT, "scales": {k: v.scale for k, v in T.items()},
               "weight_scales": weight_scales, "bias_codes": bias_codes, "digest": graph_digest(graph),
               "meta": graph.meta}
    helper.set_model_props(model, {METADATA_KEY: json.dumps(numbers, default=str)})
    onnx.checker.check_model(model)
    return model, numbers
