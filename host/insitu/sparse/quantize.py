"""Post-training quantization of the float models into the int8 graph IR.

:func:`quantize_model` turns a trained :class:`insitu.sparse.models.MobileNetV2` into a
:class:`insitu.sparse.graph.Graph` (tiny-training section 3.1: "pre-trained ... and perform
post-training quantization"; eq. 1 for every layer):

* BatchNorm is folded into the preceding conv (:func:`insitu.sparse.models.fold_bn`);
* weights become per-output-channel symmetric int8 (:func:`graph.quantize_weight`), biases int32
  at scale ``w_scale[o] * x_scale`` (:func:`graph.quantize_bias`);
* every activation tensor gets one symmetric scale, calibrated on :data:`CALIBRATION_SAMPLES`
  training images of the float (BN-folded) network: ``scale = peak / 127`` with ``peak`` the
  max of ``|activation|`` over the calibration set (:data:`CALIBRATION_PERCENTILE` = 100).
  A high percentile clips rare outliers to gain resolution, but it did not help here: int8
  FashionMNIST test accuracy with max / 99.999 / 99.99 / 99.9 / 99.5th percentile was
  85.98 / 85.88 / 85.86 / 85.86 / 85.29 % on an mbv2-28 trained for one epoch on 30k images
  (float 86.10 %) and 82.76 / - / 82.67 / 82.81 % on mbv2-tiny (float 82.75 %). The default
  pretrained mbv2-28 gets 90.22 % int8 with the max (90.29 % with the 99.99th percentile)
  against 90.27 % float;
* the input scale is :data:`graph.INPUT_SCALE` (codes ``pixel - 128``), ReLU6 is fused into
  its conv's ``act``, the residual add is a :class:`graph.Add`, the pooling a
  :class:`graph.GlobalAvgPool`, the classifier a 1x1 :class:`graph.Conv` on the ``(C, 1, 1)``
  pooled map.

Node names: ``stem``, ``b<k>.expand``, ``b<k>.dw``, ``b<k>.project``, ``b<k>.add``,
``head.conv``, ``pool``, ``classifier``. Every node's output tensor carries the node's name,
except the classifier's, ``logits`` (the graph's output); the input tensor is ``input``.

:func:`int8_forward` runs a graph on int8 input codes by walking its nodes with the functional
ops of eq. 1 (``conv_fwd``, ``add_fwd``, ``gap_fwd``, with the requantization parameters that
:mod:`insitu.sparse.graph` derives): by default the golden kernels of :mod:`insitu.sparse.golden` on
many samples at once (:data:`REFERENCE_OPS`), the very integer code the host simulator runs
on the arena and the firmware is tested against.

:func:`new_head` is the start of transfer learning on a new task; :func:`untrained_graph` the
graph of a named model's layers (names and shapes) without training, for checks.

The pretrained models (float training, their cache on disk) are :mod:`insitu.sparse.pretrain`,
which calls :func:`quantize_model`: a change to the graph this module builds, invisible in the
quantization settings, bumps :data:`insitu.sparse.pretrain.FORMAT_VERSION` so the cached
pretrained graphs are rebuilt.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np

from insitu.errors import InsituError, UsageError
from insitu.sparse import graph as g
from insitu.sparse import golden
from insitu.sparse.models import MobileNetV2, Unit, build_model, folded_forward, folded_units, model_config

__all__ = ["quantize_model", "calibrate_scales", "activation_scale", "build_graph", "int8_forward", "int8_accuracy",
           "new_head", "HEAD_INIT", "HEAD_RANGE", "untrained_graph",
           "REFERENCE_OPS", "FORWARD_CHUNK", "CALIBRATION_SAMPLES",
           "CALIBRATION_PERCENTILE", "OUTPUT_TENSOR", "INPUT_TENSOR"]

INPUT_TENSOR = "input"
OUTPUT_TENSOR = "logits"
#: Training images the activation ranges are measured on.
CALIBRATION_SAMPLES = 1000
#: Percentile of |activation| that maps to code 127 (100: the max; see the module docstring).
CALIBRATION_PERCENTILE = 100.0


# --------------------------------------------------------------------------- calibration + export


def _peak(values: np.ndarray, percentile: float) -> float:
    a = np.abs(values).ravel()
    peak = float(a.max()) if percentile >= 100 else float(np.percentile(a, percentile))
    return peak if peak > 0 else float(a.max())


def calibrate_scales(units: list[Unit], x: np.ndarray, percentile: float = CALIBRATION_PERCENTILE,
                     batch_size: int = 250) -> dict[str, float]:
    """Scale of every activation tensor (graph names) from float inputs ``x`` ``(N, 1, H, W)``
    (:func:`activation_scale` of each)."""
    records: dict[str, list[np.ndarray]] = {}
    for i in range(0, len(x), batch_size):
        rec: dict[str, np.ndarray] = {}
        folded_forward(units, x[i:i + batch_size], rec)
        for k, v in rec.items():
            records.setdefault(OUTPUT_TENSOR if k == "classifier" else k, []).append(v)
    scales = {INPUT_TENSOR: g.INPUT_SCALE}
    scales.update({name: activation_scale(parts, percentile) for name, parts in records.items()})
    return scales


def activation_scale(parts: list[np.ndarray], percentile: float = CALIBRATION_PERCENTILE) -> float:
    """The int8 scale of one activation tensor from its float values over the calibration set
    (``parts``: one array per batch): its ``percentile`` of ``|value|`` maps to code 127."""
    peak = _peak(np.concatenate([np.ravel(p) for p in parts]), percentile)
    return peak / 127 if peak > 0 else 1.0 / 127      # a dead tensor: any scale works


def build_graph(units: list[Unit], scales: dict[str, float], input_size: int, meta: dict | None = None) -> g.Graph:
    """The int8 graph of the folded network ``units`` with activation ``scales`` (by tensor)."""
    in_channels = units[0].weight.shape[1] * units[0].groups       # the stem's input: grey or RGB
    tensors = {INPUT_TENSOR: g.TensorInfo((in_channels, input_size, input_size), g.INPUT_SCALE)}
    nodes: list[g.Node] = []
    current, block_in, size = INPUT_TENSOR, None, input_size
    for u in units:
        if u.block and (block_in is None or block_in[0] != u.block):
            block_in = (u.block, current)
        if u.name == "classifier":
            c = tensors[current].shape[0]
            tensors["pool"] = g.TensorInfo((c, 1, 1), scales["pool"])
            nodes.append(g.GlobalAvgPool("pool", current, "pool"))
            current, size = "pool", 1
        out = OUTPUT_TENSOR if u.name == "classifier" else u.name
        weight, w_scale = g.quantize_weight(u.weight)
        bias = g.quantize_bias(u.bias, w_scale, tensors[current].scale)
        size = g.conv_out(size, u.weight.shape[2], u.stride, u.pad)
        tensors[out] = g.TensorInfo((u.weight.shape[0], size, size), scales[out])
        nodes.append(g.Conv(u.name, current, out, weight, bias, w_scale, u.stride, u.pad, u.groups, u.act))
        current = out
        if u.residual:
            add = f"{u.block}.add"
            tensors[add] = g.TensorInfo(tensors[out].shape, scales[add])
            assert block_in is not None         # a residual unit ends a block that it began
            nodes.append(g.Add(add, out, block_in[1], add))
            current = add
    graph = g.Graph(tensors, nodes, INPUT_TENSOR, OUTPUT_TENSOR, dict(meta or {}))
    graph.validate()
    return graph


def quantize_model(model: MobileNetV2, calib_images: np.ndarray,
                   percentile: float = CALIBRATION_PERCENTILE, meta: dict | None = None) -> g.Graph:
    """Post-training quantization of ``model`` calibrated on uint8 images ``(N, H, W)``."""
    from insitu.sparse.tasks import float_inputs

    units = folded_units(model)
    scales = calibrate_scales(units, float_inputs(calib_images, np.float64), percentile)
    info = {"model": model.config.name, "config": model.config.as_dict(),
            "calibration": {"samples": int(len(calib_images)), "percentile": percentile}}
    return build_graph(units, scales, model.config.input_size, {**info, **(meta or {})})


# --------------------------------------------------------------------------- int8 forward


#: The ops of :func:`int8_forward`: the golden kernels (:mod:`insitu.sparse.golden`), which take a
#: batch (a leading axis), so :data:`FORWARD_CHUNK` samples go through every node at once.
REFERENCE_OPS = SimpleNamespace(conv_fwd=golden.conv_fwd, add_fwd=golden.add_fwd, gap_fwd=golden.gap_fwd,
                                batched=True)


#: Samples that go through the graph together in :func:`int8_forward`: smaller chunks keep a
#: layer's arrays in the CPU caches, larger ones make fewer (multithreaded) BLAS calls. Measured
#: on 1000 mbv2-28 samples (loaded 2-core machine), relative to all 1000 in one chunk: chunks of
#: 32 / 250 took 0.73 / 0.82 of the CPU time with one BLAS thread, 1.24 / 1.10 of the wall time
#: with two.
FORWARD_CHUNK = 256


def _node_calls(graph: g.Graph) -> list[tuple]:
    """``(output, op name, input tensors, parameters)`` of every node, with the requantization
    parameters that :mod:`insitu.sparse.graph` derives (once per graph, not per sample)."""
    T = graph.tensors
    calls = []
    for n in graph.nodes:
        if isinstance(n, g.Conv):
            rq = g.conv_requant(n, T[n.x].scale, T[n.y].scale)
            m = np.array([r.multiplier for r in rq], np.int64)
            sh = np.array([r.shift for r in rq], np.int64)
            lo, hi = g.act_bounds(n.act, T[n.y].scale)
            calls.append((n.y, "conv_fwd", (n.x,), (n.weight, n.bias, m, sh, n.stride, n.pad, n.groups, lo, hi)))
        elif isinstance(n, g.Add):
            ma, mb, sh = g.add_requant(T[n.a].scale, T[n.b].scale, T[n.y].scale)
            calls.append((n.y, "add_fwd", (n.a, n.b), (ma, mb, sh, *g.act_bounds(n.act, T[n.y].scale))))
        elif isinstance(n, g.GlobalAvgPool):
            c, h, w = T[n.x].shape
            rq = g.gap_requant(T[n.x].scale, T[n.y].scale, h * w)
            calls.append((n.y, "gap_fwd", (n.x,), (rq.multiplier, rq.shift)))
        else:  # pragma: no cover - the IR has no other node kinds
            raise InsituError(f"int8_forward: unknown node {n!r}")
    return calls


def _walk(graph: g.Graph, calls: list[tuple], ops, x: np.ndarray) -> dict[str, np.ndarray]:
    """Every tensor's codes for the input codes ``x`` (one sample, or a batch if ``ops`` takes one)."""
    lead = x.shape[:-3]
    vals = {graph.input: x}
    for y, op, inputs, params in calls:
        out = getattr(ops, op)(*(vals[t] for t in inputs), *params)
        vals[y] = np.asarray(out).reshape(*lead, *graph.tensors[y].shape)
    return vals


def int8_forward(graph: g.Graph, x_codes: np.ndarray, ops=None, record: dict | None = None) -> np.ndarray:
    """Logit codes of the int8 graph on int8 input codes ``(1, H, W)`` or ``(N, 1, H, W)``:
    int8 ``(classes,)`` or ``(N, classes)``.

    ``ops`` provides ``conv_fwd``, ``add_fwd``, ``gap_fwd`` (default :data:`REFERENCE_OPS`, the
    golden kernels, given :data:`FORWARD_CHUNK` samples at a time); ops without a true
    ``batched`` attribute (e.g. the module ``insitu.sparse.golden`` itself) get one sample at a
    time. ``record`` (a dict) receives every tensor's codes by name.
    """
    x = np.asarray(x_codes)
    if x.dtype != np.int8:
        raise ValueError(f"int8_forward needs int8 input codes, got {x.dtype} (see graph.input_codes)")
    if x.ndim not in (3, 4) or x.shape[-3:] != graph.tensors[graph.input].shape:
        raise ValueError(f"int8_forward: input codes of shape {graph.tensors[graph.input].shape} "
                         f"(or a batch of them) expected, got {x.shape}")
    ops = REFERENCE_OPS if ops is None else ops
    calls = _node_calls(graph)
    if x.ndim == 3:
        vals = _walk(graph, calls, ops, x)
    elif getattr(ops, "batched", False):
        parts = [_walk(graph, calls, ops, x[i:i + FORWARD_CHUNK]) for i in range(0, max(len(x), 1), FORWARD_CHUNK)]
        vals = {k: np.concatenate([p[k] for p in parts]) for k in (parts[0] if record is not None else [graph.output])}
    else:
        parts = [_walk(graph, calls, ops, xi) for xi in x]
        vals = {k: np.stack([p[k] for p in parts]) for k in (parts[0] if record is not None else [graph.output])}
    if record is not None:
        record.update(vals)
    return vals[graph.output].reshape(*x.shape[:-3], graph.tensors[graph.output].size)


def int8_accuracy(graph: g.Graph, images: np.ndarray, labels: np.ndarray, batch_size: int = 500,
                  ops=None) -> float:
    """Top-1 accuracy of the int8 graph on uint8 images ``(N, H, W)`` (first maximal logit)."""
    correct = 0
    for i in range(0, len(images), batch_size):
        logits = int8_forward(graph, g.input_codes(images[i:i + batch_size]), ops)
        correct += int((logits.argmax(axis=1) == labels[i:i + batch_size]).sum())
    return correct / max(len(images), 1)


# --------------------------------------------------------------------------- transfer learning


#: The fresh classifier of :func:`new_head` starts at these int8 codes (see its docstring).
HEAD_INIT = "zero"
#: Its per-channel range, in units of the pretrained classifier's median channel range.
HEAD_RANGE = 2.0


def new_head(graph: g.Graph, num_classes: int, seed: int = 0) -> g.Graph:
    """The start of transfer learning on a new task: a copy of ``graph`` whose classifier is a
    fresh ``num_classes``-way dense layer.

    * weights: int8 codes 0 (:data:`HEAD_INIT`). With zero weights the backbone's gradient is 0
      only for the first sample: the classifier's own gradient (``dlogits x features``) is
      nonzero from the start, so after one update the codes move and gradient reaches the
      backbone. Measured (mbv2-28, bias-6 scheme simulated in float with the compiler's
      round-to-nearest int8 weight update, batch 1, one epoch, lr 0.01 / 0.05): zero codes were
      ahead of random codes in [-4, 4] or [-16, 16] after 50 and 200 samples (digits, lr 0.05:
      31.8 % vs 19.8 / 20.1 % after 50 samples; fashion-shift 38.5 % vs 22.3 %) and equal or
      better after the epoch (digits 74.1 % vs 69.6 / 68.8 %; fashion-shift 60.8 % vs 53.5 %):
      random codes are noise the update must first undo;
    * ``w_scale``: every output channel gets :data:`HEAD_RANGE` (2) times the median
      per-channel scale of the pretrained classifier, so its range is that of a pretrained class
      with room to grow and its resolution of the same order (updates need resolution). Measured
      as above: with 1x the median, 3-17 % of the codes sat at +-127 after one epoch (a float
      head grew to ~1.6x the median range at lr 0.05); 4x rounded small updates away (digits at
      lr 0.01: 40.7 % vs 68-71 %); 2x kept saturation at 0-9 % with accuracy within a few points of the best (one seed);
    * bias 0 (its scale is ``w_scale * pool_scale`` as for any conv);
    * the logits tensor keeps the pretrained graph's scale.

    ``seed`` is unused with zero codes; it is kept so that the call stays the same if the start
    becomes random.
    """
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise UsageError(f"new_head: num_classes must be an integer >= 2, got {num_classes!r}")
    out = copy.deepcopy(graph)
    head = [n for n in out.nodes if isinstance(n, g.Conv) and n.y == out.output]
    if len(head) != 1 or not head[0].is_dense or out.tensors[head[0].x].shape[1:] != (1, 1):
        raise InsituError("new_head: the graph's output is not a dense 1x1 conv on a (C, 1, 1) map")
    old = head[0]
    c = old.weight.shape[1]
    scale = HEAD_RANGE * float(np.median(old.w_scale))
    weight = np.zeros((num_classes, c, 1, 1), np.int8)
    fresh = g.Conv(old.name, old.x, old.y, weight, np.zeros(num_classes, np.int32),
                   np.full(num_classes, scale), 1, 0, 1, "none")
    out.nodes[out.nodes.index(old)] = fresh
    out.tensors[out.output] = g.TensorInfo((num_classes, 1, 1), out.tensors[out.output].scale)
    out.meta = {**out.meta, "head": {"num_classes": int(num_classes), "init": HEAD_INIT,
                                     "w_scale": scale, "seed": int(seed)}}
    out.validate()
    return out


# --------------------------------------------------------------------------- untrained graphs


def untrained_graph(model_name: str, num_classes: int | None = None) -> g.Graph:
    """The int8 graph of ``model_name`` with untrained weights and placeholder scales: its layers'
    names and shapes, in milliseconds and without pretraining (for checks such as a scheme's)."""
    from collections import defaultdict

    config = model_config(model_name)
    model = build_model(config, seed=0)
    scales = defaultdict(lambda: 1.0 / 127, {INPUT_TENSOR: g.INPUT_SCALE})
    graph = build_graph(folded_units(model), scales, config.input_size, {"model": model_name, "untrained": True})
    return graph if num_classes is None else new_head(graph, num_classes)
