"""The training compiler of the MCU path (the paper's Tiny Training Engine, for MicroPython).

From an int8 :class:`~insitu.sparse.graph.Graph`, a sparse-update :class:`~insitu.sparse.scheme.Scheme`
and gradient scales, :func:`compile_training` derives at compile time everything the device does
per sample, as a straight-line program of kernel calls (:mod:`insitu.sparse.abi`):

1. **autodiff**: the backward graph of the whole network (input gradients, weight and bias
   gradients of every layer, each weight gradient materialized in an int32 buffer and applied at
   the end, as a conventional framework does);
2. **pruning** for the scheme: the gradient nodes of frozen weights and biases are removed, and a
   partially updated layer keeps the gradient of its selected channels only;
3. **dead-code elimination**: whatever no longer feeds an update goes (input gradients below the
   deepest trained layer, the activations saved for them);
4. **reordering with in-place update**: each gradient is applied as soon as it is computed (fused
   compute-and-apply kernels), right after the layer's input gradient used the old weights, so no
   gradient buffer outlives its layer;
5. **static memory plan**: one arena; every buffer gets an offset from its lifetime (greedy
   best-offset by size), persistent buffers (trained tensors, tables, the program itself) for
   good; the arena size is the planned peak;
6. **code generation**: a MicroPython module (``tte_model.py``) whose functions call the kernels
   in order, and an int8 weight blob: the program table, the initial RAM tensors and every
   layer's pack (weights, bias, requantization) that stays in flash and is loaded into a scratch
   buffer when a kernel needs it. Only trained tensors live in RAM.

Three more passes serve networks larger than the SRAM (the paper's 128x128 ones), each automatic
where it makes the plan smaller and bit-exact with the program without it: the first frozen
layers run in spatial patches (:mod:`insitu.sparse.patches`, ``Options.patches``); tables stay in
flash and large frozen layers' weights are loaded a piece at a time (``Options.stream``); a ReLU
whose output nothing else reads is saved as a 1-bit mask (``Options.masks``).

The host simulator (:mod:`insitu.sparse.simulate`) runs the same program on the same arena layout.

For callers that plan many schemes of one graph (the scheme search), :class:`LayerTables` holds
what no scheme changes and :func:`plan_arena` runs the passes up to the memory plan on it, without
the blob and the code generation: the arena of ``compile_training`` for a fraction of its time.
"""

from __future__ import annotations

import binascii
import copy
import hashlib
from dataclasses import dataclass, field

import numpy as np

from insitu import numerics as nx
from insitu.errors import InsituError, UsageError
from insitu.sparse import abi
from insitu.sparse.graph import (Add, Conv, GlobalAvgPool, Graph, act_bounds, add_requant, conv_requant, grad_bounds,
                              gap_requant)
from insitu.sparse.patches import AUTO_GRIDS, Stage, Window, choose_stage, input_window, whole
from insitu.sparse.scheme import Scheme

ALIGN = 4
#: Options.stream=None streams from flash for networks with more int8 weights than this (half
#: the board's SRAM: networks whose weights live in flash anyway, the paper's three), and keeps
#: the small ones as they are, where the loads would cost more than the bytes they free.
STREAM_AUTO_WEIGHT_BYTES = 128 * 1024
#: Streaming: tables smaller than this stay in RAM (a load call costs heap and program words too);
#: a frozen layer's weights of more than STREAM_CHUNK_BYTES are loaded that much at a time.
FLASH_TABLE_MIN_BYTES = 64
STREAM_CHUNK_BYTES = 16 * 1024
LOSS_GRAD_SCALE = 2.0 ** -abi.LOSS_GRAD_FRAC


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(eq=False)
class Buf:
    """A region of the arena. ``persistent`` buffers live for the whole run; the others from the
    first op that writes them to the last op that reads them."""

    name: str
    nbytes: int
    kind: str            # program, io, const, param (trained: checkpointed), input, act, grad, gradbuf, scratch,
                         # accum (gradient accumulators: checkpointed)
    persistent: bool = False
    init: bytes | None = None          # initial content (from the blob) of const/param buffers
    offset: int = -1

    def __repr__(self):
        return f"Buf({self.name}, {self.nbytes} B, {self.kind}, @{self.offset})"


@dataclass(frozen=True)
class Ref:
    buf: Buf
    at: int = 0          # byte offset inside the buffer


@dataclass(eq=False)
class Op:
    kind: str                                      # an abi op name
    fields: dict                                   # field -> int | Ref
    node: str = ""                                 # the graph node it belongs to (for comments)
    phase: str = "fwd"                             # fwd, loss, bwd, update
    param: tuple[str, str] | None = None           # (layer, "w" | "b") for gradient/update ops
    sink: bool = False                             # changes persistent state (updates)
    window: int | None = None                      # patch p of the first stage reads input window p

    def refs(self) -> list[Ref]:
        return [v for v in self.fields.values() if isinstance(v, Ref)]


# Which fields each op reads and writes (the rest of its Ref fields are read-only tables).
_WRITES = {"conv_fwd": ("y_off",), "add_fwd": ("y_off",), "gap_fwd": ("y_off",),
           "loss_grad": ("g_off", "io_off"), "argmax": ("io_off",), "act_bwd": ("g_off",),
           "grad_scale_ch": ("g_off",), "conv_bwd_x": ("gx_off",), "conv_grad_w": ("gw_off",),
           "conv_upd_w": ("w_off",), "apply_w": ("w_off",), "bias_grad": ("gb_off",),
           "bias_upd": ("b_off",), "apply_b": ("b_off",), "gap_bwd": ("gx_off",),
           "grad_add": ("y_off",), "load": ("dst_off",), "load_rows": ("dst_off",), "patch": ("dst_off",), "acc_i32": ("dst_off",),
           "zero": ("dst_off",), "window": ("dst_off",), "act_mask": ("m_off",), "mask_bwd": ("g_off",)}
_READS_TOO = {"act_bwd": ("g_off",), "grad_scale_ch": ("g_off",), "conv_upd_w": ("w_off",),
              "apply_w": ("w_off",), "bias_upd": ("b_off",), "apply_b": ("b_off",),
              "loss_grad": ("io_off",), "patch": ("dst_off",), "acc_i32": ("dst_off",),
              "window": ("dst_off",), "mask_bwd": ("g_off",)}


def writes(op: Op) -> set[Buf]:
    return {op.fields[f].buf for f in _WRITES[op.kind] if isinstance(op.fields.get(f), Ref)}


def reads(op: Op) -> set[Buf]:
    out = {op.fields[f].buf for f in _READS_TOO.get(op.kind, ()) if isinstance(op.fields.get(f), Ref)}
    out |= {r.buf for f, r in op.fields.items() if isinstance(r, Ref) and f not in _WRITES[op.kind]}
    return out


@dataclass
class Options:
    lr: float = 0.05
    reorder: bool = True       # in-place update (fused kernels); False: gradients applied at the end
    prune: bool = True         # False keeps the backward graph of the full network (the baseline)
    # Gradient accumulation: the gradients of `accumulate` samples are summed in persistent int32
    # buffers and applied once (the `apply` segment), with lr / accumulate: SGD on their mean, as
    # a batch of that size. The gradients then exist, so nothing is fused (reorder is moot).
    accumulate: int = 1
    # Per-layer learning rate: layer name -> factor on lr (weights and bias of that layer). The
    # float reference (insitu.sparse.reference) takes the same factors.
    lr_scale: dict = field(default_factory=dict)
    # Stride-1 depthwise convs at the plan's peak computed into their input's buffer, a few
    # channels at a time, forward and backward (depthwise_in_place): False keeps both maps.
    dw_in_place: bool = True
    # Patch-based inference of the first stage (insitu.sparse.patches): n for n x n patches, 1 for
    # none, None to let the compiler decide (2x2 where the plan is smaller with them).
    patches: int | None = None
    # Streaming from flash: the per-channel tables (scales of gradients and updates,
    # requantization, selected channels) stay in the blob, loaded into a scratch buffer by each
    # kernel that reads them, instead of held in RAM for good; the frozen weights of a large
    # layer are loaded and used a piece at a time (output channels forward, input channels for
    # its input gradient). None: for networks of more than STREAM_AUTO_WEIGHT_BYTES of weights.
    stream: bool | None = None
    # A ReLU's backward from a 1-bit mask saved in the forward pass (act_mask, mask_bwd) instead
    # of its int8 output, where nothing else reads that output; None: as stream.
    masks: bool | None = None

    def __post_init__(self):
        if self.patches is not None and (not isinstance(self.patches, int) or self.patches < 1):
            raise UsageError(f"patches must be a positive number (n for n x n patches), got {self.patches!r}")
        if not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise UsageError(f"gradient accumulation must be a positive number of samples, got {self.accumulate!r}")
        for name, f in self.lr_scale.items():
            if not (isinstance(f, (int, float)) and f > 0):
                raise UsageError(f"the learning-rate factor of {name} must be a positive number, got {f!r}")


@dataclass
class Compiled:
    """What the compiler made: the arena plan, the program, the blob and the generated module."""

    graph: Graph
    scheme: Scheme
    options: Options
    arena_bytes: int
    buffers: list[Buf]
    train_ops: list[Op]
    program: np.ndarray                  # int32 words (the blob's first bytes; not in the arena)
    # init / stage0..stageN-1 / train / infer / apply: word offsets of the records. stage<p> runs
    # once input window p is in place (the first stage's patches); train and infer then run the rest.
    calls: dict[str, list[int]]
    blob: bytes
    module: str                          # the generated MicroPython source
    input_off: int                       # where each input window goes in the arena
    input_bytes: int                     # the bytes of a sample's input stream (its windows, in order)
    io_off: int
    trained: list[tuple[int, int]]       # (offset, bytes) of the checkpointed tensors
    model_id: str
    stats: dict = field(default_factory=dict)
    #: The windows (rows r0:r1, columns c0:c1) of the input image a sample is sent in, in order:
    #: one per patch of the first stage where its patches read the input (the device never holds
    #: the whole image), else the whole image.
    input_windows: list[Window] = field(default_factory=list)

    @property
    def planned_peak_bytes(self) -> int:
        return self.arena_bytes

    @property
    def stages(self) -> int:
        """How many input windows run a part of the forward pass as they arrive (0: one whole input)."""
        return sum(1 for seg in self.calls if seg.startswith("stage"))

    def input_stream(self, codes) -> np.ndarray:
        """A sample's input codes (C, H, W) as the device takes them: its windows, concatenated."""
        shape = self.graph.tensors[self.graph.input].shape
        x = np.asarray(codes, dtype=np.int8).reshape(shape)
        return np.concatenate([x[:, w.r0:w.r1, w.c0:w.c1].reshape(-1) for w in self.input_windows])

    def window_bytes(self) -> list[int]:
        """The bytes of each input window, in stream order."""
        c = self.graph.tensors[self.graph.input].shape[0]
        return [c * w.h * w.w for w in self.input_windows]


# --------------------------------------------------------------------------- building blocks

def _codes(values, dtype) -> bytes:
    return np.ascontiguousarray(values, dtype=dtype).astype(np.dtype(dtype).newbyteorder("<")).tobytes()


def _rq_arrays(scales: list[nx.RequantScale]) -> tuple[bytes, bytes]:
    return (_codes([s.multiplier for s in scales], np.int32), _codes([s.shift for s in scales], np.int32))


def _rq(value: float, what: str) -> nx.RequantScale:
    try:
        return nx.RequantScale.from_float(float(value))
    except ValueError as exc:
        raise InsituError(f"compile: the scale of {what} ({value:.3g}) is out of the integer range "
                          f"({exc}); change the learning rate or recalibrate the gradients") from None


class _Layer:
    """One conv's tensors as the program sees them: its pack in the blob, and its RAM copies."""

    def __init__(self, conv: Conv, x_scale: float, y_scale: float):
        self.conv = conv
        self.rq = conv_requant(conv, x_scale, y_scale)
        m, sh = _rq_arrays(self.rq)
        w = conv.weight.tobytes()
        o = conv.out_channels
        self.w_bytes, self.row_bytes = len(w), len(w) // o
        self.b_at = _aligned(len(w))
        self.m_at = self.b_at + 4 * o
        self.sh_at = self.m_at + 4 * o
        self.pack = w + bytes(self.b_at - len(w)) + _codes(conv.bias, np.int32) + m + sh
        self.blob_off = -1
        # set by the compiler: the RAM copies of trained tensors
        self.w_ram: Buf | None = None      # all rows (ratio 1) or the selected rows
        self.b_ram: Buf | None = None
        self.idx: np.ndarray | None = None
        self.idx_buf: Buf | None = None
        self.rq_ram: tuple[Buf, Buf] | None = None

    @property
    def whole_in_ram(self) -> bool:
        return self.w_ram is not None and self.idx is not None and len(self.idx) == self.conv.out_channels


class LayerTables:
    """What every compile of one (graph, gradient scales, learning rate) computes alike, whatever
    the scheme: each layer's requantization and blob pack (:meth:`layer`) and the scale tables of
    its backward ops. The compiler's extension point for planning many schemes of one graph: make
    one and pass it to :func:`plan_arena` for each scheme; every table is computed on first use,
    as :func:`compile_training` computes it, and kept. A table that cannot be computed (a scale
    out of the integer range) fails each plan that uses it, with the compiler's message.

    ``lr`` is the rate of one update (``Options.lr / Options.accumulate``), ``lr_scale`` the
    per-layer factors on it (``Options.lr_scale``). The graph must not change while the tables
    are used."""

    def layer_lr(self, n: Conv) -> float:
        return self.lr * float(self.lr_scale.get(n.name, 1.0))

    def __init__(self, graph: Graph, grad_scales: dict[str, float], lr: float, lr_scale: dict | None = None):
        self.graph, self.lr = graph, float(lr)
        self.lr_scale = dict(lr_scale or {})
        unknown = set(self.lr_scale) - {c.name for c in graph.convs}
        if unknown:
            raise UsageError(f"learning-rate factors for layers the model does not have: {sorted(unknown)}")
        self.grad_scales = dict(grad_scales)
        self.grad_scales[graph.output] = LOSS_GRAD_SCALE
        self._layers: dict[str, _Layer] = {}
        self._s_max: dict[str, float] = {}
        self._ratios: dict[str, tuple[bytes, bytes]] = {}
        self._updates: dict[str, tuple[list, np.ndarray | None, np.ndarray | None]] = {}
        self._biases: dict[str, tuple[bytes, bytes]] = {}
        self._input_grads: dict[str, nx.RequantScale] = {}

    def layer(self, n: Conv) -> _Layer:
        """The layer's pack and requantization, a fresh copy (a compile places its RAM copies)."""
        if n.name not in self._layers:
            T = self.graph.tensors
            self._layers[n.name] = _Layer(n, T[n.x].scale, T[n.y].scale)
        return copy.copy(self._layers[n.name])

    def _largest_weight_scale(self, n: Conv) -> float:
        """max s_w over the live output channels (all of them when every row is zero)."""
        if n.name not in self._s_max:
            o = n.out_channels
            live = [s for s, row in zip(n.w_scale, n.weight.reshape(o, -1)) if row.any()] or list(n.w_scale)
            self._s_max[n.name] = float(max(live))
        return self._s_max[n.name]

    def gradient_scale(self, n: Conv) -> float:
        """s_g: real g[o] = code * s_g / s_w[o], one scale across the output channels."""
        return self.grad_scales[n.y] * self._largest_weight_scale(n)

    def channel_ratios(self, n: Conv) -> tuple[bytes, bytes]:
        """The multipliers of g~[o] = g[o] * s_w[o] / max s_w."""
        if n.name not in self._ratios:
            s_max = self._largest_weight_scale(n)
            self._ratios[n.name] = _rq_arrays([_rq(min(1.0, s / s_max), f"the channel scales of {n.name}")
                                               for s in n.w_scale])
        return self._ratios[n.name]

    def update_scales(self, n: Conv, idx: np.ndarray) -> tuple[bytes, bytes]:
        """The weight-update multipliers (QAS, eq. 4) of the output channels ``idx``."""
        if n.name not in self._updates:
            s_g, s_x = self.gradient_scale(n), self.graph.tensors[n.x].scale
            per_channel = []
            for s_w in n.w_scale:
                try:
                    per_channel.append(_rq(weight_update_scale(self.layer_lr(n), s_g, s_x, float(s_w)),
                                           f"the weight update of {n.name}"))
                except InsituError as exc:     # fails the schemes that select this channel only
                    per_channel.append(exc)
            whole = all(isinstance(v, nx.RequantScale) for v in per_channel)
            self._updates[n.name] = (per_channel,
                                     np.array([v.multiplier for v in per_channel], np.int32) if whole else None,
                                     np.array([v.shift for v in per_channel], np.int32) if whole else None)
        per_channel, m, sh = self._updates[n.name]
        if m is None:
            chosen = [per_channel[i] for i in idx]
            for v in chosen:
                if isinstance(v, InsituError):
                    raise v
            return _rq_arrays(chosen)
        assert sh is not None                   # (with m)
        return _codes(m[idx], np.int32), _codes(sh[idx], np.int32)

    def bias_scales(self, n: Conv) -> tuple[bytes, bytes]:
        """b_code -= lr * G_b_real / (s_w s_x) = rq(sum gy, lr * s_g / (s_w^2 s_x))."""
        if n.name not in self._biases:
            s_g, s_x = self.gradient_scale(n), self.graph.tensors[n.x].scale
            self._biases[n.name] = _rq_arrays([_rq(self.layer_lr(n) * s_g / (float(s) ** 2 * s_x),
                                                   f"the bias update of {n.name}") for s in n.w_scale])
        return self._biases[n.name]

    def input_gradient_scale(self, n: Conv) -> nx.RequantScale:
        if n.name not in self._input_grads:
            self._input_grads[n.name] = _rq(self.gradient_scale(n) / self.grad_scales[n.x],
                                            f"the input gradient of {n.name}")
        return self._input_grads[n.name]


class _Builder:
    def __init__(self, tables: LayerTables, scheme: Scheme, options: Options):
        graph = tables.graph
        self.tables = tables
        self.g, self.scheme, self.opts = graph, scheme, options
        self.grad_scales = tables.grad_scales
        self.buffers: list[Buf] = []
        self.consts: dict[bytes, Buf] = {}
        self.layers = {c.name: tables.layer(c) for c in graph.convs}
        self.acts = {name: self.buf(f"act:{name}", t.size, "act") for name, t in graph.tensors.items()}
        self.acts[graph.input].kind = "input"
        self.io = self.buf("io", 4 * abi.IO_WORDS, "io", persistent=True)
        self.stage: Stage | None = None        # the first layers run in patches, if any
        # id(stage) -> (the input window buffer, the windows): where its patches read the input
        self.input_windows: dict[int, tuple[Buf, list[Window]]] = {}
        weights = sum(c.weight.size for c in graph.convs)
        self.stream = options.stream if options.stream is not None else weights > STREAM_AUTO_WEIGHT_BYTES
        self.masks = options.masks if options.masks is not None else weights > STREAM_AUTO_WEIGHT_BYTES

    def buf(self, name, nbytes, kind, persistent=False, init=None) -> Buf:
        b = Buf(name, _aligned(max(nbytes, 1)), kind, persistent, init)
        self.buffers.append(b)
        return b

    def salt(self, n: Conv) -> int:
        """The layer's key in the rounding of its weight updates: its place in the graph."""
        return self.g.nodes.index(n)

    def const(self, name: str, data: bytes) -> Buf:
        """A read-only table (shared when two are byte-identical): in RAM, or when streaming
        (:attr:`Options.stream`) one of :data:`FLASH_TABLE_MIN_BYTES` or more stays in the blob,
        loaded by each kernel that reads it (:func:`load_flash_tables`)."""
        if data not in self.consts:
            if self.stream and len(data) >= FLASH_TABLE_MIN_BYTES:
                self.consts[data] = Buf(f"flash:{name}", _aligned(len(data)), "flash", init=data)
            else:
                self.consts[data] = self.buf(f"const:{name}", len(data), "const", True, data)
        return self.consts[data]

    # ------------------------------------------------------------------ trained tensors in RAM

    def place_trained(self) -> None:
        bias_layers = set(self.scheme.bias_layers(self.g)) if self.opts.prune else set(self.layers)
        weight_layers = dict(self.scheme.weights) if self.opts.prune else {n: 1.0 for n in self.layers}
        for name, L in self.layers.items():
            c = L.conv
            if name in weight_layers:
                L.idx = (np.arange(c.out_channels) if weight_layers[name] == 1.0
                         else Scheme(0, {name: weight_layers[name]}).selected_channels(c))
                rows = c.weight[L.idx].tobytes()
                L.w_ram = self.buf(f"w:{name}", len(rows), "param", True, rows)
                L.idx_buf = self.const(f"idx:{name}", _codes(L.idx, np.int32))
            if name in bias_layers:
                L.b_ram = self.buf(f"b:{name}", 4 * c.out_channels, "param", True, _codes(c.bias, np.int32))
            if L.whole_in_ram:       # the forward pass needs no load: requantization in RAM too
                m, sh = _rq_arrays(L.rq)
                L.rq_ram = (self.const(f"m:{name}", m), self.const(f"sh:{name}", sh))

    # ------------------------------------------------------------------ weights for one kernel

    def pieces(self, L: _Layer, along_inputs: bool = False) -> list[tuple[int, int]]:
        """The ranges of output channels (``along_inputs``: of input channels) whose weights a
        streamed layer loads at a time: one range unless streaming a frozen full conv (groups 1)
        of more than :data:`STREAM_CHUNK_BYTES` of weights."""
        c = L.conv
        n = c.weight.shape[1] if along_inputs else c.out_channels
        if not self.stream or L.w_ram is not None or c.groups != 1 or L.w_bytes <= STREAM_CHUNK_BYTES:
            return [(0, n)]
        step = -(-n // -(-L.w_bytes // STREAM_CHUNK_BYTES))
        return [(a, min(n, a + step)) for a in range(0, n, step)]

    def conv_fwd_in_pieces(self, L: _Layer, pieces, fields: dict) -> list[Op]:
        """A frozen layer's forward a range of output channels at a time: the range's weight
        rows, bias and requantization loaded from its pack, its rows of the output computed."""
        c, ops = L.conv, []
        y, (_, oh, ow) = self.acts[c.y], self.g.tensors[c.y].shape
        for a, z in pieces:
            k = z - a
            w_at = _aligned(k * L.row_bytes)
            b_at = w_at + (0 if L.b_ram else 4 * k)
            scratch = self.buf(f"scratch:{c.name}[{a}:{z}]", b_at + 8 * k, "scratch")
            parts = [(a * L.row_bytes, 0, k * L.row_bytes), (L.m_at + 4 * a, b_at, 4 * k), (L.sh_at + 4 * a, b_at + 4 * k, 4 * k)]
            if not L.b_ram:
                parts.append((L.b_at + 4 * a, w_at, 4 * k))
            for src, dst, n in parts:
                ops.append(Op("load", {"blob_off": ("blob", L, src), "dst_off": Ref(scratch, dst), "n": n}, c.name, "load"))
            b = Ref(L.b_ram, 4 * a) if L.b_ram else Ref(scratch, w_at)
            ops.append(Op("conv_fwd", {**fields, "w_off": Ref(scratch), "b_off": b, "m_off": Ref(scratch, b_at),
                                       "sh_off": Ref(scratch, b_at + 4 * k), "y_off": Ref(y, a * oh * ow), "O": k},
                          c.name))
        return ops

    def conv_bwd_x_in_pieces(self, op: Op, L: _Layer, pieces) -> list[Op]:
        """An input gradient a range of input channels at a time: the weights of those inputs
        (a run of every weight row of the pack: load_rows) loaded, their rows of the input
        gradient computed."""
        c, ops = L.conv, []
        gx, (_, h, w) = op.fields["gx_off"], self.g.tensors[c.x].shape
        taps = c.kernel * c.kernel
        for a, z in pieces:
            scratch = self.buf(f"scratch:{c.name}[:, {a}:{z}]", c.out_channels * (z - a) * taps, "scratch")
            ops.append(Op("load_rows", {"blob_off": ("blob", L, a * taps), "dst_off": Ref(scratch),
                                        "rows": c.out_channels, "n": (z - a) * taps, "stride": L.row_bytes},
                          c.name, "load"))
            ops.append(Op("conv_bwd_x", {**op.fields, "w_off": Ref(scratch), "C": z - a,
                                         "gx_off": Ref(gx.buf, gx.at + 2 * a * h * w)}, op.node, op.phase))
        return ops

    def weights_for(self, L: _Layer, ops: list[Op],
                    with_bias_rq: bool) -> tuple[Ref, Ref | None, Ref | None, Ref | None]:
        """(w, b, m, sh) refs for a kernel about to run, emitting load/patch ops where the layer's
        tensors are in flash."""
        c = L.conv
        if L.whole_in_ram:
            assert L.w_ram is not None and L.rq_ram is not None     # what whole_in_ram means
            m, sh = L.rq_ram
            b = Ref(L.b_ram) if L.b_ram else None
            return Ref(L.w_ram), b, Ref(m), Ref(sh)
        n = len(L.pack) if with_bias_rq else L.w_bytes
        scratch = self.buf(f"scratch:{c.name}", n, "scratch")
        ops.append(Op("load", {"blob_off": ("blob", L), "dst_off": Ref(scratch), "n": n}, c.name, "load"))
        if L.w_ram is not None:
            assert L.idx is not None and L.idx_buf is not None     # set with w_ram
            ops.append(Op("patch", {"src_off": Ref(L.w_ram), "dst_off": Ref(scratch), "idx_off": Ref(L.idx_buf),
                                    "n_sel": len(L.idx), "row_bytes": L.row_bytes}, c.name, "load"))
        b = Ref(L.b_ram) if L.b_ram else (Ref(scratch, L.b_at) if with_bias_rq else None)
        if not with_bias_rq:
            return Ref(scratch), b, None, None
        return Ref(scratch), b, Ref(scratch, L.m_at), Ref(scratch, L.sh_at)

    # ------------------------------------------------------------------ forward

    def forward(self) -> list[Op]:
        ops: list[Op] = []
        T = self.g.tensors
        for n in self.g.nodes:
            if isinstance(n, Conv):
                L = self.layers[n.name]
                lo, hi = act_bounds(n.act, T[n.y].scale)
                fields = {"x_off": Ref(self.acts[n.x]), **_geometry(n, T), "lo": lo, "hi": hi, "pad_x": n.pad}
                pieces = self.pieces(L)
                if len(pieces) > 1:
                    ops += self.conv_fwd_in_pieces(L, pieces, fields)
                    continue
                w, b, m, sh = self.weights_for(L, ops, with_bias_rq=True)
                ops.append(Op("conv_fwd", {**fields, "w_off": w, "b_off": b, "m_off": m, "sh_off": sh,
                                           "y_off": Ref(self.acts[n.y])}, n.name))
            elif isinstance(n, Add):
                ma, mb, sh = add_requant(T[n.a].scale, T[n.b].scale, T[n.y].scale)
                lo, hi = act_bounds(n.act, T[n.y].scale)
                ops.append(Op("add_fwd", {"a_off": Ref(self.acts[n.a]), "b_off": Ref(self.acts[n.b]),
                                          "y_off": Ref(self.acts[n.y]), "n": T[n.y].size, "ma": ma, "mb": mb,
                                          "sh": sh, "lo": lo, "hi": hi}, n.name))
            elif isinstance(n, GlobalAvgPool):
                c, h, w_ = T[n.x].shape
                s = gap_requant(T[n.x].scale, T[n.y].scale, h * w_)
                ops.append(Op("gap_fwd", {"x_off": Ref(self.acts[n.x]), "y_off": Ref(self.acts[n.y]), "C": c,
                                          "HW": h * w_, "m": s.multiplier, "sh": s.shift}, n.name))
        return ops

    def forward_in_patches(self, fwd: list[Op], stage: Stage) -> list[Op]:
        """``fwd`` with the stage's nodes run patch by patch (:mod:`insitu.sparse.patches`): each
        patch's maps in buffers of their own, cut out of a map (``window``) where a reader needs
        less of it, the cut's patch placed into the whole cut."""
        T, names = self.g.tensors, {n.name for n in stage.nodes}
        # The input is not held whole: patch p's window of it arrives (the device's link) into a
        # buffer of its own just before patch p runs, so the buffer holds the largest window.
        x_in = self.g.input
        reads_input = [(n, p) for p, need in enumerate(stage.windows) for n in stage.nodes
                       if isinstance(n, Conv) and n.x == x_in]
        in_windows = {p: input_window(n, stage.windows[p][n.y], T[x_in].shape) for n, p in reads_input}
        if any(input_window(n, stage.windows[p][n.y], T[x_in].shape) != in_windows[p] for n, p in reads_input):
            in_windows = {}                 # readers of different windows: keep the whole input
        in_buf = None
        if in_windows and len(in_windows) == len(stage.windows):
            c = T[x_in].shape[0]
            in_buf = self.buf(f"input-window:{len(stage.windows)}", max(c * w.h * w.w for w in in_windows.values()), "input")
            self.input_windows[id(stage)] = (in_buf, [in_windows[p] for p in range(len(stage.windows))])
        ops: list[Op] = []
        for p, need in enumerate(stage.windows):
            tiles: dict[str, tuple[Buf, Window]] = {}
            first = len(ops)
            if in_buf is not None:
                tiles[x_in] = (in_buf, in_windows[p])

            def tile(t: str, want: Window, node: str) -> Buf:
                buf, have = tiles.get(t) or (self.acts[t], whole(T[t].shape))
                if have == want:
                    return buf
                c = T[t].shape[0]
                crop = self.buf(f"patch{p}:{t}@{node}", c * want.h * want.w, "act")
                ops.append(Op("window", {"src_off": Ref(buf), "dst_off": Ref(crop), "C": c, "h": want.h,
                                         "w": want.w, "src_H": have.h, "src_W": have.w, "src_y": want.r0 - have.r0,
                                         "src_x": want.c0 - have.c0, "dst_H": want.h, "dst_W": want.w,
                                         "dst_y": 0, "dst_x": 0}, node))
                return crop

            for n in stage.nodes:
                out = need[n.y]
                o = T[n.y].shape[0]
                y = self.buf(f"patch{p}:{n.y}", o * out.h * out.w, "act")
                lo, hi = act_bounds(n.act, T[n.y].scale)
                if isinstance(n, Conv):
                    inp = input_window(n, out, T[n.x].shape)
                    x = tile(n.x, inp, n.name)
                    w, b, m, sh = self.weights_for(self.layers[n.name], ops, with_bias_rq=True)
                    ops.append(Op("conv_fwd", {
                        "x_off": Ref(x), "w_off": w, "b_off": b, "m_off": m, "sh_off": sh, "y_off": Ref(y),
                        **_geometry(n, T), "H": inp.h, "W": inp.w, "OH": out.h, "OW": out.w,
                        "pad": n.pad + inp.r0 - out.r0 * n.stride, "pad_x": n.pad + inp.c0 - out.c0 * n.stride,
                        "lo": lo, "hi": hi}, n.name))
                else:
                    ma, mb, sh = add_requant(T[n.a].scale, T[n.b].scale, T[n.y].scale)
                    ops.append(Op("add_fwd", {"a_off": Ref(tile(n.a, out, n.name)), "b_off": Ref(tile(n.b, out, n.name)),
                                              "y_off": Ref(y), "n": o * out.h * out.w, "ma": ma, "mb": mb,
                                              "sh": sh, "lo": lo, "hi": hi}, n.name))
                tiles[n.y] = (y, out)
            (y, out), (c, h, w) = tiles[stage.output], T[stage.output].shape
            ops.append(Op("window", {"src_off": Ref(y), "dst_off": Ref(self.acts[stage.output]), "C": c,
                                     "h": out.h, "w": out.w, "src_H": out.h, "src_W": out.w, "src_y": 0, "src_x": 0,
                                     "dst_H": h, "dst_W": w, "dst_y": out.r0, "dst_x": out.c0},
                          stage.nodes[-1].name))
            if in_buf is not None:
                for op in ops[first:]:
                    op.window = p
        return ops + [op for op in fwd if op.node not in names]

    # ------------------------------------------------------------------ loss and backward

    def loss(self) -> tuple[Op, Op, Buf]:
        z = self.g.output
        s_z = self.g.tensors[z].scale
        table = nx.round_half_up(np.ldexp(np.exp(-np.arange(abi.EXP_ENTRIES) * s_z), abi.EXP_FRAC))
        exp = self.const("exp", _codes(table, np.int32))
        n = self.g.num_classes
        g = self.buf(f"grad:{z}", 2 * n, "grad")
        loss = Op("loss_grad", {"z_off": Ref(self.acts[z]), "g_off": Ref(g), "n": n, "exp_off": Ref(exp),
                                "io_off": Ref(self.io)}, "loss", "loss")
        argmax = Op("argmax", {"z_off": Ref(self.acts[z]), "n": n, "io_off": Ref(self.io)}, "loss", "loss")
        return loss, argmax, g

    def backward(self, g_out: Buf) -> tuple[list[Op], list[Op]]:
        """The full backward graph (every input, weight and bias gradient), with the weight and
        bias gradients materialized and their applications returned separately (for the end)."""
        T = self.g.tensors
        grads: dict[str, Buf] = {self.g.output: g_out}
        ops: list[Op] = []
        applies: list[Op] = []

        def contribute(tensor: str, buf: Buf, scale: float, node: str) -> None:
            """Add a gradient contribution to ``tensor`` (a tensor read by several nodes)."""
            if tensor == self.g.input:
                return
            if tensor not in grads:
                if scale != self.grad_scales[tensor]:
                    raise AssertionError(f"gradient of {tensor} has scale {scale}, planned {self.grad_scales[tensor]}")
                grads[tensor] = buf
                return
            total = self.buf(f"grad:{tensor}+{node}", 2 * T[tensor].size, "grad")
            ma, mb, sh = add_requant(self.grad_scales[tensor], scale, self.grad_scales[tensor])
            ops.append(Op("grad_add", {"a_off": Ref(grads[tensor]), "b_off": Ref(buf), "y_off": Ref(total),
                                       "n": T[tensor].size, "ma": ma, "mb": mb, "sh": sh}, node, "bwd"))
            grads[tensor] = total

        for n in reversed(self.g.nodes):
            if n.y not in grads:
                continue
            gy, s_gy = grads[n.y], self.grad_scales[n.y]
            if isinstance(n, Add):
                # The add passes its gradient on unchanged (real units); rescale to each input's plan.
                for t in (n.a, n.b):
                    self._pass_gradient(n, t, gy, s_gy, ops, contribute)
            elif isinstance(n, GlobalAvgPool):
                c, h, w = T[n.x].shape
                gx = self.buf(f"grad:{n.x}", 2 * c * h * w, "grad")
                s = _rq(s_gy / (h * w * self.grad_scales[n.x]), f"the gradient of {n.name}")
                ops.append(Op("gap_bwd", {"gy_off": Ref(gy), "gx_off": Ref(gx), "C": c, "HW": h * w,
                                          "m": s.multiplier, "sh": s.shift}, n.name, "bwd"))
                contribute(n.x, gx, self.grad_scales[n.x], n.name)
            else:
                self._conv_backward(n, gy, s_gy, ops, applies, contribute)
        return ops, applies

    def _pass_gradient(self, n: Add, t: str, gy: Buf, s_gy: float, ops, contribute) -> None:
        if self.grad_scales[t] == s_gy:
            contribute(t, gy, s_gy, n.name)
            return
        size = self.g.tensors[t].size
        g = self.buf(f"grad:{t}@{n.name}", 2 * size, "grad")
        ma, _, sh = add_requant(s_gy, s_gy, self.grad_scales[t])
        ops.append(Op("grad_add", {"a_off": Ref(gy), "b_off": Ref(gy), "y_off": Ref(g), "n": size,
                                   "ma": ma, "mb": 0, "sh": sh}, n.name, "bwd"))
        contribute(t, g, self.grad_scales[t], n.name)

    def _conv_backward(self, n: Conv, gy: Buf, s_gy: float, ops, applies, contribute) -> None:
        T = self.g.tensors
        L = self.layers[n.name]
        (c, h, w), (o, oh, ow) = T[n.x].shape, T[n.y].shape
        geom = _geometry(n, T)
        passes = grad_bounds(n.act, T[n.y].scale)
        if passes is not None:
            ops.append(Op("act_bwd", {"y_off": Ref(self.acts[n.y]), "g_off": Ref(gy), "n": o * oh * ow,
                                  "lo": passes[0], "hi": passes[1]}, n.name, "bwd"))
        # One scale for the gradient across output channels: g~[o] = g[o] * s_w[o] / max s_w.
        m, sh = self.tables.channel_ratios(n)
        ops.append(Op("grad_scale_ch", {"g_off": Ref(gy), "C": o, "HW": oh * ow,
                                        "m_off": Ref(self.const(f"gm:{n.name}", m)),
                                        "sh_off": Ref(self.const(f"gsh:{n.name}", sh))}, n.name, "bwd"))
        # Weight gradient of every channel (pruned later to the scheme's channels), QAS (eq. 4).
        idx = L.idx if L.idx is not None else np.arange(o)
        um, ush = self.tables.update_scales(n, idx)
        gw = self.buf(f"gw:{n.name}", 4 * len(idx) * L.row_bytes, "gradbuf")
        wr = Ref(L.w_ram) if L.w_ram else None
        sel = Ref(L.idx_buf) if L.idx_buf else None
        ops.append(Op("conv_grad_w", {"gy_off": Ref(gy), "x_off": Ref(self.acts[n.x]), "gw_off": Ref(gw),
                                      "idx_off": sel, "n_sel": len(idx), **geom}, n.name, "bwd", (n.name, "w")))
        applies.append(Op("apply_w", {"gw_off": Ref(gw), "w_off": wr, "n_sel": len(idx), "row_len": L.row_bytes,
                                      "um_off": Ref(self.const(f"um:{n.name}", um)),
                                      "ush_off": Ref(self.const(f"ush:{n.name}", ush)),
                                      "io_off": Ref(self.io), "salt": self.salt(n)},
                          n.name, "update", (n.name, "w"), sink=True))
        bm, bsh = self.tables.bias_scales(n)
        gb = self.buf(f"gb:{n.name}", 4 * o, "gradbuf")
        ops.append(Op("bias_grad", {"gy_off": Ref(gy), "gb_off": Ref(gb), "O": o, "HW": oh * ow},
                      n.name, "bwd", (n.name, "b")))
        applies.append(Op("apply_b", {"gb_off": Ref(gb), "b_off": Ref(L.b_ram) if L.b_ram else None, "O": o,
                                      "um_off": Ref(self.const(f"bm:{n.name}", bm)),
                                      "ush_off": Ref(self.const(f"bsh:{n.name}", bsh))},
                          n.name, "update", (n.name, "b"), sink=True))
        # Input gradient, with the weights before this sample's update.
        if n.x == self.g.input:
            return
        gx = self.buf(f"grad:{n.x}@{n.name}", 2 * c * h * w, "grad")
        s = self.tables.input_gradient_scale(n)
        ops.append(Op("conv_bwd_x", {"gy_off": Ref(gy), "w_off": ("weights", L), "gx_off": Ref(gx), **geom,
                                     "m": s.multiplier, "sh": s.shift}, n.name, "bwd"))
        contribute(n.x, gx, self.grad_scales[n.x], n.name)


def weight_update_scale(lr: float, s_g: float, s_x: float, s_w: float) -> float:
    """The multiplier of a weight update (QAS, eq. 4): W_code -= lr * G_real / s_w, with
    G_real = s_g * s_x / s_w * sum(g~ * x), in 2**-SR_BITS codes (the update rounds stochastically)."""
    return lr * s_g * s_x / s_w ** 2 * 2 ** nx.SR_BITS


def _geometry(n: Conv, T) -> dict:
    (c, h, w), (o, oh, ow) = T[n.x].shape, T[n.y].shape
    return {"C": c, "H": h, "W": w, "O": o, "OH": oh, "OW": ow, "K": n.kernel, "stride": n.stride,
            "pad": n.pad, "groups": n.groups}


# --------------------------------------------------------------------------- passes

def prune(ops: list[Op], applies: list[Op], trained: set[tuple[str, str]]) -> tuple[list[Op], list[Op]]:
    """Drop the gradient and update nodes of frozen tensors."""
    keep = [op for op in ops if op.param is None or op.param in trained]
    return keep, [op for op in applies if op.param in trained]


def eliminate_dead_code(ops: list[Op]) -> list[Op]:
    """Remove ops whose results nothing needs: a backward liveness pass over the straight-line
    program. Sinks (weight updates) and the forward pass's outputs are what is needed."""
    needed: set[Buf] = set()
    live: list[Op] = []
    for op in reversed(ops):
        if op.sink or op.phase in ("fwd", "load", "loss") or writes(op) & needed:
            live.append(op)
            needed -= writes(op) - reads(op)
            needed |= reads(op)
    return live[::-1]


def reorder_in_place(ops: list[Op], applies: list[Op], builder: _Builder) -> list[Op]:
    """Fuse each gradient with its update, placed right after the layer's last use of the old
    weights (its input-gradient op, if any): the gradient buffer never exists."""
    out: list[Op] = []
    pending: dict[str, list[Op]] = {}
    apply_of = {op.param: op for op in applies}
    for op in ops:
        if op.kind == "conv_grad_w":
            a, f = apply_of[op.param], dict(op.fields)
            del f["gw_off"]
            fused = Op("conv_upd_w", {**f, "w_off": a.fields["w_off"], "um_off": a.fields["um_off"],
                                      "ush_off": a.fields["ush_off"], "io_off": a.fields["io_off"],
                                      "salt": a.fields["salt"]}, op.node, "update", op.param, True)
            pending.setdefault(op.node, []).append(fused)
        elif op.kind == "bias_grad":
            a = apply_of[op.param]
            fused = Op("bias_upd", {"gy_off": op.fields["gy_off"], "b_off": a.fields["b_off"], "O": op.fields["O"],
                                    "HW": op.fields["HW"], "um_off": a.fields["um_off"],
                                    "ush_off": a.fields["ush_off"]}, op.node, "update", op.param, True)
            pending.setdefault(op.node, []).append(fused)
        else:
            out.append(op)
            if op.kind == "conv_bwd_x":
                out.extend(pending.pop(op.node, []))
    # Layers without an input gradient (the deepest trained one): after their last backward op.
    for node, fused in pending.items():
        last = max(i for i, op in enumerate(out) if op.node == node)
        out[last + 1:last + 1] = fused
    return out


def accumulate_gradients(ops: list[Op], applies: list[Op], builder: _Builder) -> tuple[list[Op], list[Op]]:
    """Gradient accumulation: each sample adds its weight and bias gradients into a persistent
    int32 accumulator (checkpointed with the trained tensors); the updates read the accumulators
    and zero them, in a separate segment the firmware runs every ``accumulate`` samples."""
    out, apply_ops, zeros = list(ops), [], []
    for a in applies:
        field = "gw_off" if a.kind == "apply_w" else "gb_off"
        grad = a.fields[field].buf
        acc = builder.buf(f"acc:{grad.name}", grad.nbytes, "accum", persistent=True)
        out.append(Op("acc_i32", {"src_off": Ref(grad), "dst_off": Ref(acc), "n": grad.nbytes // 4},
                      a.node, "update", a.param, sink=True))
        apply_ops.append(Op(a.kind, {**a.fields, field: Ref(acc)}, a.node, "apply", a.param, sink=True))
        zeros.append(Op("zero", {"dst_off": Ref(acc), "n": acc.nbytes}, a.node, "apply", a.param, sink=True))
    return out, apply_ops + zeros


#: A depthwise conv computed in place (depthwise_in_place) goes through a scratch of at most this
#: share of its output map's channels (and at least one channel).
DW_IN_PLACE_PIECE = 1 / 8


#: Per op kind: (its input map's field, its output map's field, bytes an element, the kind of
#: buffer both maps are, the per-channel i32 tables to offset with the channels).
_IN_PLACE = {"conv_bwd_x": ("gy_off", "gx_off", 2, "grad", ()),
             "conv_fwd": ("x_off", "y_off", 1, "act", ("b_off", "m_off", "sh_off"))}


def depthwise_in_place(ops: list[Op], later: list[Op], builder: _Builder, rounds: int = 4) -> list[Op]:
    """Where the plan peaks at a depthwise conv (one input channel per output, each output
    channel no larger than its input channel) whose input map nothing reads afterwards, compute
    the output into the input's own buffer: a few channels at a time into a scratch (the op on
    those channels), copied to their place in the buffer, over input channels already read
    (``window`` as a byte copy), so that the two maps are never both live. Forward (conv_fwd: an activation nobody saved) and backward
    (conv_bwd_x: the input gradient over the output gradient): the peaks of the paper's
    mbv2-w0.35 sparse update. Later readers of the output read the input's buffer. The ops after
    it that still read the input (a bias update, its tables' loads) move before it where that
    changes nothing: none writes what it reads or reads what it writes. Only at the peak, up to
    ``rounds`` times: elsewhere the pieces' calls would cost program words and heap for no
    smaller plan."""
    out = list(ops)
    for _ in range(rounds):
        span = {b: s for b, s in lifetimes(out + later).items() if not b.persistent}
        live = [0] * len(out)
        for b, (lo, hi) in span.items():
            for i in range(lo, min(hi, len(out) - 1) + 1):
                live[i] += b.nbytes
        if not live:
            break
        peak = max(range(len(out)), key=live.__getitem__)
        at = None
        for i, op in enumerate(out):
            if _in_place_candidate(op):
                src, dst = (op.fields[k].buf for k in _IN_PLACE[op.kind][:2])
                if span.get(dst, (len(out), 0))[0] <= peak <= span.get(src, (0, -1))[1]:
                    at = i
                    break
        if at is None or not _rewrite_in_place(out, at, later, builder):
            break
    return out


def _map_sizes(op: Op) -> tuple[int, int]:
    """(elements a channel of the op's input map, of its output map)."""
    f = op.fields
    hw, ohw = f["H"] * f["W"], f["OH"] * f["OW"]
    return (hw, ohw) if op.kind == "conv_fwd" else (ohw, hw)


def _in_place_candidate(op: Op) -> bool:
    if op.kind not in _IN_PLACE:
        return False
    f, (src, dst, _, kind, _) = op.fields, _IN_PLACE[op.kind]
    in_hw, out_hw = _map_sizes(op)
    return (f["groups"] == f["C"] == f["O"] > 1 and out_hw <= in_hw
            and f.get("pad_x", f["pad"]) == f["pad"] and isinstance(f["w_off"], Ref)
            and all(isinstance(f[k], Ref) and f[k].at == 0 and f[k].buf.kind == kind for k in (src, dst)))


def _rewrite_in_place(out: list[Op], i: int, later: list[Op], builder: _Builder) -> bool:
    """The rewrite of depthwise_in_place for the op at out[i], if it applies."""
    op = out[i]
    f = op.fields
    src_f, dst_f, size, _, tables = _IN_PLACE[op.kind]
    src, dst, w = f[src_f], f[dst_f], f["w_off"]
    if any(src.buf in reads(o) | writes(o) for o in later) or any(dst.buf in reads(o) | writes(o) for o in out[:i]):
        return False                        # the input is read after the step, or the output is not this op's alone
    readers = [j for j in range(i + 1, len(out)) if src.buf in reads(out[j]) | writes(out[j])]
    if readers:
        moved = out[i + 1:readers[-1] + 1]
        mine_r, mine_w = reads(op), writes(op)
        if any(writes(o) & (mine_r | mine_w) or reads(o) & mine_w for o in moved):
            return False
        out[i:readers[-1] + 1] = moved + [op]
        i += len(moved)
    # Channels [a, a + k) are read, then their outputs written at the buffer's output offset of
    # channel a, which lies within channels already read (a channel's output is no larger).
    c, (in_hw, out_hw) = f["C"], _map_sizes(op)
    step = max(1, int(c * DW_IN_PLACE_PIECE))
    scratch = builder.buf(f"scratch:{op.node}:{dst_f[:-4]}", size * step * out_hw, "scratch")
    pieces = []
    for a in range(0, c, step):
        k, n = min(step, c - a), size * min(step, c - a) * out_hw
        shifted = {t: Ref(f[t].buf, f[t].at + 4 * a) for t in tables if isinstance(f[t], Ref)}
        pieces.append(Op(op.kind, {**f, **shifted, src_f: Ref(src.buf, size * a * in_hw), "w_off": Ref(w.buf, w.at + a * f["K"] ** 2),
                                   dst_f: Ref(scratch), "C": k, "O": k, "groups": k}, op.node, op.phase))
        pieces.append(Op("window", {"src_off": Ref(scratch), "dst_off": Ref(src.buf, size * a * out_hw), "C": 1, "h": 1,
                                    "w": n, "src_H": 1, "src_W": n, "src_y": 0, "src_x": 0, "dst_H": 1, "dst_W": n,
                                    "dst_y": 0, "dst_x": 0}, op.node, op.phase))
    out[i:i + 1] = pieces
    for o in out[i + len(pieces):] + later:         # the output is the input's buffer from here on
        for name, r in o.fields.items():
            if isinstance(r, Ref) and r.buf is dst.buf:
                o.fields[name] = Ref(src.buf, r.at)
    return True


def materialize_weights(ops: list[Op], builder: _Builder) -> list[Op]:
    """Resolve the ``("weights", layer)`` placeholders of input-gradient ops: RAM copies where the
    layer is wholly trained, else a load (and patch) into a scratch buffer just before the op."""
    out: list[Op] = []
    for op in ops:
        w = op.fields.get("w_off")
        if isinstance(w, tuple) and w[0] == "weights":
            pieces = builder.pieces(w[1], along_inputs=True)
            if len(pieces) > 1:                    # streamed: the weights of a few inputs at a time
                out += builder.conv_bwd_x_in_pieces(op, w[1], pieces)
                continue
            ref, *_ = builder.weights_for(w[1], out, with_bias_rq=False)
            op.fields["w_off"] = ref
        out.append(op)
    return out


def mask_activations(fwd: list[Op], body: list[Op], later: list[Op], builder: _Builder) -> tuple[list[Op], list[Op], set]:
    """Where the backward pass reads an activation only to pass its gradient through the fused
    clamp (act_bwd), the forward pass saves the 1-bit mask of that instead (act_mask, right after
    the activation is complete) and the backward pass reads the mask (mask_bwd): the int8 map
    dies in the forward pass. Returns (forward, backward, the activations masked)."""
    others = {x for op in body + later for x in reads(op) if op.kind != "act_bwd"}
    masks: dict[Buf, Buf] = {}
    out_body: list[Op] = []
    for op in body:
        y = op.fields["y_off"].buf if op.kind == "act_bwd" else None
        if y is None or y in others:
            out_body.append(op)
            continue
        n = op.fields["n"]
        if y not in masks:
            masks[y] = builder.buf(f"mask:{y.name.removeprefix('act:')}", (n + 7) // 8, "act")
            last = max(i for i, f in enumerate(fwd) if y in writes(f))
            fwd = fwd[:last + 1] + [Op("act_mask", {"y_off": Ref(y), "m_off": Ref(masks[y]), "n": n,
                                                    "lo": op.fields["lo"], "hi": op.fields["hi"]},
                                       fwd[last].node)] + fwd[last + 1:]
        out_body.append(Op("mask_bwd", {"m_off": Ref(masks[y]), "g_off": op.fields["g_off"], "n": n}, op.node, "bwd"))
    return fwd, out_body, set(masks)


def load_flash_tables(ops: list[Op], builder: _Builder) -> list[Op]:
    """Before each op that reads a table kept in flash, a load of it into a scratch buffer of
    its own (alive for that op only), which the op reads instead."""
    out: list[Op] = []
    for op in ops:
        loaded: dict[Buf, Buf] = {}
        for f, v in op.fields.items():
            if isinstance(v, Ref) and v.buf.kind == "flash":
                if v.buf not in loaded:
                    scratch = loaded[v.buf] = builder.buf(f"table:{v.buf.name[len('flash:'):]}", v.buf.nbytes, "scratch")
                    out.append(Op("load", {"blob_off": ("flash", v.buf), "dst_off": Ref(scratch), "n": v.buf.nbytes},
                                  op.node, "load"))
                op.fields[f] = Ref(loaded[v.buf], v.at)
        out.append(op)
    return out


def lifetimes(ops: list[Op]) -> dict[Buf, tuple[int, int]]:
    """Each buffer ``ops`` use: (the index of the first op, of the last op) that reads or writes it."""
    span: dict[Buf, tuple[int, int]] = {}
    for i, op in enumerate(ops):
        for b in reads(op) | writes(op):
            lo, hi = span.get(b, (i, i))
            span[b] = (min(lo, i), max(hi, i))
    # The input is written before the step (or between its patches): live from the first op.
    return {b: (0, hi) if b.kind == "input" else (lo, hi) for b, (lo, hi) in span.items()}


def plan_memory(buffers: list[Buf], ops: list[Op], first_offset: int = 0) -> int:
    """Offsets for every buffer used by ``ops``; returns the arena size.

    Persistent buffers are laid out first, back to back. Transient ones get the lowest offset that
    does not overlap a placed buffer whose lifetime [first write, last read] meets theirs, in the
    order of a placement heuristic; three heuristics of inference planners (largest first, longest
    lived first, earliest first) are tried and the smallest arena kept."""
    span = lifetimes(ops)
    top = first_offset
    for b in buffers:
        b.offset = -1
        if b.persistent and (b in span or b.kind in ("io", "param")):
            b.offset, top = top, top + b.nbytes
    transient = [b for b in span if not b.persistent]
    orders = (lambda b: (-b.nbytes, span[b][0]),
              lambda b: (span[b][0] - span[b][1], -b.nbytes),
              lambda b: (span[b][0], -b.nbytes))
    best = None
    for key in orders:
        offsets = _place(sorted(transient, key=key), span, top)
        end = max((offsets[b] + b.nbytes for b in transient), default=top)
        if best is None or end < best[0]:
            best = (end, offsets)
    assert best is not None
    end, offsets = best
    for b, off in offsets.items():
        b.offset = off
    return _aligned(end)


def live_peak(buffers: list[Buf], ops: list[Op], without: tuple[str, ...] = ()) -> dict:
    """What the arena must hold at once, at the op where the most bytes are live: the placed
    persistent buffers plus the transient buffers whose lifetime covers the op, by kind. A lower
    bound of the planned arena (which may be larger by fragmentation) and the reason for its size:
    ``{"op": index, "node": the op's node, "bytes": live bytes, "by_kind": {kind: bytes}}``.
    ``without``: kinds left out (what the peak would be if, say, the program were not in RAM)."""
    span = {x: s for x, s in lifetimes(ops).items() if x.kind not in without}
    always: dict[str, int] = {}
    for x in buffers:
        if x.persistent and x.offset >= 0 and x.kind not in without:
            always[x.kind] = always.get(x.kind, 0) + x.nbytes
    delta = [0] * (len(ops) + 1)               # transient bytes starting (+) and ending (-) at each op
    for x, (lo, hi) in span.items():
        if not x.persistent:
            delta[lo] += x.nbytes
            delta[hi + 1] -= x.nbytes
    live, at, top = 0, 0, -1
    for i in range(len(ops)):
        live += delta[i]
        if live > top:
            at, top = i, live
    by_kind = dict(always)
    for x, (lo, hi) in span.items():
        if not x.persistent and lo <= at <= hi:
            by_kind[x.kind] = by_kind.get(x.kind, 0) + x.nbytes
    return {"op": at, "node": ops[at].node if ops else "", "bytes": sum(by_kind.values()), "by_kind": by_kind}


def _place(order: list[Buf], span: dict, base: int) -> dict[Buf, int]:
    placed: dict[Buf, int] = {}
    for b in order:
        lo, hi = span[b]
        clashes = sorted((off, off + p.nbytes) for p, off in placed.items()
                         if not (span[p][1] < lo or hi < span[p][0]))
        offset = base
        for start, end in clashes:
            if offset + b.nbytes <= start:
                break
            offset = max(offset, end)
        placed[b] = offset
    return placed


# --------------------------------------------------------------------------- the entry point

def compile_training(graph: Graph, scheme: Scheme, grad_scales: dict[str, float],
                     options: Options | None = None) -> Compiled:
    """Compile ``scheme`` on ``graph`` into a program, a memory plan, a blob and a module."""
    options = options or Options()
    graph.validate()
    scheme.validate(graph)
    missing = [t for t in graph.tensors if t not in grad_scales and t not in (graph.input, graph.output)]
    if missing:
        raise InsituError(f"compile: no gradient scale for {missing[:3]}...; calibrate first")
    for n in graph.convs:
        # The firmware sums a row of outputs (and, backward, of inputs) in one fixed buffer.
        widest = max(graph.tensors[n.x].shape[2], graph.tensors[n.y].shape[2])
        if widest > abi.MAX_ROW:
            raise InsituError(f"compile: conv {n.name} has rows of {widest} pixels; the firmware's kernels "
                              f"take at most {abi.MAX_ROW} (firmware/tte_kernels.py _CHUNK)")
    tables = LayerTables(graph, grad_scales, options.lr / options.accumulate, options.lr_scale)
    b = _Builder(tables, scheme, options)
    fwd, train_ops, argmax, apply_ops = _build(b, options)
    return _lower(b, graph, scheme, options, fwd, train_ops, argmax, apply_ops)


def plan_arena(tables: LayerTables, scheme: Scheme, options: Options | None = None) -> int:
    """``compile_training(...).arena_bytes`` of ``scheme`` on the tables' graph and gradient
    scales, by the same passes and planner, without the blob, the records and the module."""
    options = options or Options()
    if tables.lr != options.lr / options.accumulate:
        raise ValueError(f"plan_arena: the tables are for lr {tables.lr}, the options say "
                         f"{options.lr} / {options.accumulate}")
    if tables.lr_scale != dict(options.lr_scale):
        raise ValueError("plan_arena: the tables' per-layer learning rates differ from the options'")
    scheme.validate(tables.graph)
    b = _Builder(tables, scheme, options)
    fwd, train_ops, argmax, apply_ops = _build(b, options)
    return _planned(b, fwd, train_ops[len(fwd):], argmax, apply_ops)


def _build(b: _Builder, options: Options) -> tuple[list[Op], list[Op], Op, list[Op]]:
    """The passes from the graph to the ops: (forward, train, argmax, apply ops)."""
    scheme, graph = b.scheme, b.g
    b.place_trained()
    fwd = b.forward()
    loss, argmax, g_out = b.loss()
    bwd, applies = b.backward(g_out)
    if options.prune:
        trained = {(n, "w") for n in scheme.weights} | {(n, "b") for n in scheme.bias_layers(graph)}
    else:
        trained = {(n, k) for n in b.layers for k in "wb"}
    bwd, applies = prune(bwd, applies, trained)
    body = eliminate_dead_code(bwd + applies)
    bwd = [op for op in body if op.phase != "update"]
    applies = [op for op in body if op.phase == "update"]
    apply_ops: list[Op] = []
    if options.accumulate > 1:
        bwd, apply_ops = accumulate_gradients(bwd, applies, b)
        body = bwd
    else:
        body = reorder_in_place(bwd, applies, b) if options.reorder else bwd + applies
    body = materialize_weights(body, b)
    masked: set[Buf] = set()
    if b.masks:
        fwd, body, masked = mask_activations(fwd, body, apply_ops, b)
    # Patch-based inference of the first layers whose maps the backward pass does not read (nor
    # masks in the forward pass).
    tensor_of = {buf: name for name, buf in b.acts.items()}
    saved = {tensor_of[x] for op in body + apply_ops for x in reads(op) | masked if x in tensor_of}
    tables = (lambda ops: load_flash_tables(ops, b)) if b.stream else (lambda ops: ops)
    rest, apply_ops = tables([loss] + body), tables(apply_ops)
    fwd = tables(fwd)
    stage = choose_stage(graph, saved, options.patches)
    if stage is not None and options.patches is not None:
        fwd, b.stage = tables(b.forward_in_patches(fwd, stage)), stage
    elif stage is not None:
        # Chosen by the planner: the grid of AUTO_GRIDS whose whole plan is smallest, if smaller
        # than without patches (the peak may be elsewhere).
        best = (_planned(b, fwd, rest, argmax, apply_ops), fwd, None)
        for grid in AUTO_GRIDS:
            stage = choose_stage(graph, saved, grid)
            if stage is not None:
                patched = tables(b.forward_in_patches(fwd, stage))
                best = min(best, (_planned(b, patched, rest, argmax, apply_ops), patched, stage), key=lambda t: t[0])
        _, fwd, b.stage = best
    if options.dw_in_place:
        step = depthwise_in_place(fwd + rest, apply_ops, b)
        cut = next(i for i, op in enumerate(step) if op is loss)
        fwd, rest = step[:cut], step[cut:]
    return fwd, fwd + rest, argmax, apply_ops


def _planned(b: _Builder, fwd, rest, argmax, apply_ops) -> int:
    """The arena of a program of these ops (plan_arena's, for a choice between two)."""
    timeline, _, all_ops = _timeline(b, fwd, fwd + rest, argmax, apply_ops)
    return plan_memory(b.buffers, timeline)


def _timeline(b: _Builder, fwd, train_ops, argmax, apply_ops) -> tuple[list[Op], list[Op], list[Op]]:
    """(the memory-plan timeline, the init loads, every record in program order)."""
    # The memory-plan timeline: argmax (inference) right after the forward pass; the updates of
    # accumulated gradients (a segment of their own) after the training step.
    timeline = fwd + [argmax] + train_ops[len(fwd):] + apply_ops
    used = set().union(*(reads(op) | writes(op) for op in timeline))
    init_bufs = [x for x in b.buffers if x.persistent and x.init is not None and (x in used or x.kind == "param")]
    # Records: init loads, then the train program (whose forward part is also the inference
    # program), then argmax. The program table sits at arena offset 0.
    init_ops = [Op("load", {"blob_off": ("init", x), "dst_off": Ref(x), "n": x.nbytes}, x.name, "init")
                for x in init_bufs]
    return timeline, init_ops, init_ops + train_ops + [argmax] + apply_ops


def _program_words(all_ops: list[Op]) -> int:
    return sum(1 + len(abi.OPS[op.kind]) for op in all_ops)


def _lower(b: _Builder, graph, scheme, options, fwd, train_ops, argmax, apply_ops=()) -> Compiled:
    apply_ops = list(apply_ops)
    timeline, init_ops, all_ops = _timeline(b, fwd, train_ops, argmax, apply_ops)
    init_bufs = [op.fields["dst_off"].buf for op in init_ops]
    words = _program_words(all_ops)
    # The program table is not in the arena: the firmware reads it from the blob into a buffer
    # of its own (a board could keep it in flash), as the paper's engine compiles its program
    # into code; the heap model counts it (insitu.mcu.board_runs.runtime_heap_bytes).
    arena = plan_memory(b.buffers, timeline)
    # The blob: [program][initial RAM tensors][layer packs], each 4-aligned.
    blob = bytearray(4 * words)
    init_at = {}
    for x in init_bufs:
        init_at[x] = len(blob)
        blob += x.init + bytes(_aligned(len(x.init)) - len(x.init))
    # The tables kept in flash (Options.stream), where their loads read them.
    for x in dict.fromkeys(op.fields["blob_off"][1] for op in all_ops
                           if op.kind == "load" and op.fields["blob_off"][0] == "flash"):
        init_at[x] = len(blob)
        blob += x.init + bytes(_aligned(len(x.init)) - len(x.init))
    for L in b.layers.values():
        L.blob_off = len(blob)
        blob += L.pack + bytes(_aligned(len(L.pack)) - len(L.pack))
    in_buf, windows = b.input_windows.get(id(b.stage), (None, None)) if b.stage is not None else (None, None)
    stage_of = _stage_of(fwd, len(windows) if windows else 0)
    calls: dict[str, list[int]] = {"init": [], **{f"stage{p}": [] for p in range(len(windows or ()))},
                                   "train": [], "infer": [], "apply": []}
    program, pos = [], 0
    fwd_ids = {id(op) for op in fwd}
    init_ids = {id(op) for op in init_ops}
    apply_ids = {id(op) for op in apply_ops}
    for op in all_ops:
        rec = abi.record(op.kind, **{k: _resolve(v, init_at) for k, v in op.fields.items()})
        if id(op) in apply_ids:
            calls["apply"].append(pos)
        elif id(op) in init_ids:
            calls["init"].append(pos)
        elif id(op) in stage_of:                    # shared by training and inference
            calls[f"stage{stage_of[id(op)]}"].append(pos)
        elif op is argmax or id(op) in fwd_ids:
            calls["infer"].append(pos)
        if id(op) not in init_ids and id(op) not in apply_ids and op is not argmax and id(op) not in stage_of:
            calls["train"].append(pos)
        program += rec
        pos += len(rec)
    table = np.array(program, dtype=np.int32)
    blob[:len(table) * 4] = _codes(table, np.int32)
    # The checkpoint: the trained tensors, the step count (it keys the rounding and the
    # accumulation) and the gradient accumulators.
    trained = [(x.offset, x.nbytes) if x.kind != "io" else (x.offset + 4 * abi.IO_STEP, 4)
               for x in b.buffers if x.kind in ("param", "io", "accum") and x.offset >= 0]
    model_id = hashlib.sha256(bytes(blob)).hexdigest()[:16]
    shape = graph.tensors[graph.input].shape
    windows = windows or [whole(shape)]
    compiled = Compiled(graph, scheme, options, arena, b.buffers, train_ops, table, calls, bytes(blob), "",
                        (in_buf or b.acts[graph.input]).offset, sum(shape[0] * w.h * w.w for w in windows),
                        b.io.offset, trained, model_id, _stats(b, timeline, arena), windows)
    from insitu.sparse.codegen import generate_module
    compiled.module = generate_module(compiled, all_ops)
    return compiled


def _stage_of(fwd: list[Op], n_windows: int) -> dict[int, int]:
    """id(op) -> p for the forward ops that run once input window p is in place: from the op
    after window p-1's last reader to window p's last reader (loads the compiler put among a
    patch's kernels included)."""
    last: dict[int, int] = {}
    for i, op in enumerate(fwd):
        if op.window is not None:
            last[op.window] = i
    out, p = {}, 0
    for i, op in enumerate(fwd):
        while p < n_windows and i > last[p]:
            p += 1
        if p == n_windows:
            break
        out[id(op)] = p
    return out


def _resolve(v, init_at) -> int:
    if v is None:
        return 0
    if isinstance(v, Ref):
        if v.buf.offset < 0:
            raise AssertionError(f"{v.buf.name} was not placed")
        return v.buf.offset + v.at
    if isinstance(v, tuple):
        kind, obj, *at = v
        if kind == "blob":                          # a layer's pack (at: an offset into it)
            return obj.blob_off + sum(at)
        return init_at[obj]                         # "init" and "flash": a buffer's initial bytes
    return int(v)


def _stats(b: _Builder, ops: list[Op], arena: int) -> dict:
    by_kind: dict[str, int] = {}
    for x in b.buffers:
        if x.offset >= 0:
            by_kind[x.kind] = by_kind.get(x.kind, 0) + x.nbytes
    stage = None if b.stage is None else {"grid": b.stage.grid, "output": b.stage.output,
                                          "nodes": [n.name for n in b.stage.nodes]}
    return {"arena_bytes": arena, "bytes_by_kind": by_kind, "ops": len(ops), "patches": stage,
            "trained_params": sum(x.nbytes for x in b.buffers if x.kind == "param" and x.name.startswith("w:")),
            "live_peak": live_peak(b.buffers, ops),
            "kernels": {k: sum(op.kind == k for op in ops) for k in sorted({op.kind for op in ops})}}


def blob_crc(blob: bytes) -> int:
    return binascii.crc32(blob) & 0xFFFFFFFF
