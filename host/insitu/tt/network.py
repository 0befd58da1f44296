"""The TT network for a dataset: its input vector, its tensor modes, and the PE limits they meet.

The network is the TT paper's (:class:`~insitu.tt.model.TTNet`): two TT layers with ReLU between,
input -> hidden -> classes. The hidden layer is the architecture's (:data:`ARCHITECTURES`: ``paper``
512 = 4x4x2x16, rank 16; ``tiny`` 64 = 1x4x16, rank 4); the dataset sets the rest.

**Input vector** (:meth:`TTShape.vectors`). Images ``(H, W)`` or ``(H, W, 3)`` in [0, 1] are laid
out row by row, each row of ``W*C`` values (RGB is used as it is, channel last) zero-padded on the
right to a multiple of 16, the PEs' lanes: the paper's 28x28 images become 28 x 32 = 896 values.
``tiny`` mean-pools 2x2 first (an odd last row or column is dropped). A feature vector ``(F,)`` is
one such row. The vector is then zero-padded at its end to the product of the first layer's input
modes. Images keep their size unless the user asks (``--input-size``, :func:`fit_input`: the data
layer's one rule, :mod:`insitu.data.images`).

**Modes** (:func:`tt_shape`).

* First layer: as many input modes as hidden modes (paper 4, tiny 3), the last one 16 (PE3 takes
  exactly 16 lanes of the last input mode); the others factor ``m = n / 16`` (``n``: the vector's
  length). Of the ordered factorizations of ``m``, the most balanced come first (the largest mode
  smallest, then the next largest, ...), the decreasing order first among equals; the first whose
  training step fits every PE limit at the run's rank and batch size is taken. When none fits,
  ``m`` grows by one (16 more zeros), up to an eighth more. 28x28 images give 7,4,2,16, the
  paper's modes; ``tiny`` keeps the 4,4,16 it was designed with for 28x28 images (14x14 pooled,
  padded to 16x16).
* ``--tt-modes I1,...,Id`` sets the first layer's input modes instead (product >= ``n``).
* Second layer: input modes ``(hidden / 16, 16)``, output modes ``(ceil(K / 16), 16)`` for K
  classes; the outputs beyond K are sliced off before the loss and the prediction.

**Limits** (:func:`broken_limit`). Every op of a training step (and of the evaluation's forward
pass, :data:`EVAL_BATCH` samples) must fit the PEs: the 16-bit size registers and the bounds of the
generated design (:class:`~insitu.accel.params.AcceleratorParams`: factor buffer, PE1 row tile,
PE2 and PE3 tiles, 16 lanes), checked as the RTL checks them
(:func:`insitu.tt.pe_stream.broken_limit`). The host uses the default design's bounds, a board its
bitstream's (CAP_* registers). A shape that breaks one is a ValueError naming the layer, the op,
the limit and its value, and what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams

from .model import pad_images
from .pe_stream import broken_limit as broken_cfg_limit
from .pe_stream import config_for
from .schedule import C_LANES, check_op, forward_ops, is_count, layer_schedule

__all__ = ["Architecture", "ARCHITECTURES", "TTShape", "tt_shape", "broken_limit", "fit_input",
           "parse_modes", "parse_input_size", "EVAL_BATCH"]

#: Samples per forward pass when accuracy is measured (:func:`insitu.tt.experiment.accuracy`).
EVAL_BATCH = 250
#: How much more zero padding the mode search tries when no factorization of the input fits.
MAX_EXTRA_PADDING = 1 / 8


@dataclass(frozen=True)
class Architecture:
    """A two-layer TT network: input -> ``hidden_modes`` -> classes."""

    name: str
    hidden_modes: tuple[int, ...]
    rank: int                               # the default initial TT rank
    pool: int = 1                           # images are mean-pooled pool x pool first
    #: (sample shape, first-layer input modes) the network was designed with, kept over the rule
    presets: tuple = ()


ARCHITECTURES = {
    "paper": Architecture("paper", (4, 4, 2, 16), 16),
    # Small enough to train on the RTL in simulation.
    "tiny": Architecture("tiny", (1, 4, 16), 4, pool=2, presets=(((28, 28), (4, 4, 16)),)),
}


def _text(modes) -> str:
    return ",".join(map(str, modes))


def _layout(sample_shape, pool: int = 1) -> tuple[int, int, int]:
    """``(rows, values per row, padded row)`` of a sample laid out as the module says."""
    if len(sample_shape) == 1:
        return 1, int(sample_shape[0]), -(-int(sample_shape[0]) // C_LANES) * C_LANES
    h, w = sample_shape[0] // pool, sample_shape[1] // pool
    row = w * (sample_shape[2] if len(sample_shape) == 3 else 1)
    return h, row, -(-row // C_LANES) * C_LANES


def describe_input(sample_shape, pool: int = 1) -> str:
    """What the network takes, in words: ``28x28 grey images (896 values: rows of 28 padded to 32)``."""
    rows, row, padded = _layout(sample_shape, pool)
    if len(sample_shape) == 1:
        what = f"{sample_shape[0]} features"
    else:
        colour = "RGB" if len(sample_shape) == 3 else "grey"
        what = f"{sample_shape[0]}x{sample_shape[1]} {colour} images"
        if pool > 1:
            what += f" pooled {pool}x{pool} to {sample_shape[0] // pool}x{sample_shape[1] // pool}"
    pad = f"{'rows' if rows > 1 else 'a row'} of {row} padded to {padded}" if padded != row else ""
    return f"{what} ({rows * padded} values{': ' + pad if pad else ''})"


@dataclass(frozen=True)
class TTShape:
    """The network chosen for a dataset: its architecture, the sample it takes, its two layers'
    ``(in_modes, out_modes)``, the class count, and where the first layer's modes came from
    (``rule``, ``--tt-modes`` or ``preset``)."""

    architecture: Architecture
    sample_shape: tuple[int, ...]
    layers: tuple
    classes: int
    modes_from: str = "rule"

    @property
    def input_values(self) -> int:
        """The laid-out sample's length, before the padding to the first layer's modes."""
        rows, _, padded = _layout(self.sample_shape, self.architecture.pool)
        return rows * padded

    @property
    def input_width(self) -> int:
        return math.prod(self.layers[0][0])

    def vectors(self, x) -> np.ndarray:
        """Samples ``(N, *sample_shape)`` as floats in [0, 1] -> ``(N, input_width)`` float64."""
        x = np.asarray(x, dtype=np.float64)
        n, pool = len(x), self.architecture.pool
        if x.shape[1:] != tuple(self.sample_shape):
            raise ValueError(f"the network takes samples of shape {self.sample_shape}, got {x.shape[1:]}")
        if pool > 1 and x.ndim > 2:
            h, w = x.shape[1] // pool, x.shape[2] // pool
            x = x[:, :h * pool, :w * pool].reshape(n, h, pool, w, pool, *x.shape[3:]).mean(axis=(2, 4))
        rows, row, padded = _layout(self.sample_shape, pool)
        grid = pad_images(x.reshape(n, rows, row), shape=(rows, row), padded=(rows, padded))
        if grid.shape[1] == self.input_width:
            return grid
        out = np.zeros((n, self.input_width))
        out[:, :grid.shape[1]] = grid
        return out

    def describe(self) -> dict:
        """The shape for a result record."""
        return {"model": self.architecture.name, "sample_shape": list(self.sample_shape),
                "input": describe_input(self.sample_shape, self.architecture.pool),
                "input_values": self.input_values, "input_width": self.input_width,
                "classes": self.classes, "modes_from": self.modes_from,
                "layers": [[list(i), list(o)] for i, o in self.layers]}


# ----------------------------------------------------------------------------------- limits

def _layer_limit(k: int, in_modes, out_modes, rank: int, batch: int,
                 params: AcceleratorParams) -> str | None:
    """The first limit layer ``k`` (0-based) breaks in a training step or an evaluation pass."""
    where = f"layer {k + 1} (modes {_text(in_modes)} -> {_text(out_modes)})"
    try:
        ops = layer_schedule(in_modes, out_modes, rank, batch, input_grad=k > 0, limits=params.limits)
        evaluation = forward_ops(in_modes, out_modes, rank, EVAL_BATCH)
        for op in evaluation:
            check_op(op, params.limits)
        ops += evaluation
    except ValueError as exc:
        return f"{where}: {exc}"
    for op in ops:
        broken = broken_cfg_limit(config_for(op, out_modes=out_modes), params)
        if broken:
            return (f"{where}, {op.kind} op {op.src}->{op.dst} (a={op.a}, b={op.b}, c={op.c}, "
                    f"d={op.d}): {broken[1]}")
    return None


def broken_limit(layers, rank: int, batch: int, params: AcceleratorParams = DEFAULT_PARAMS) -> str | None:
    """The first PE limit that a training step of ``layers`` at ``rank`` and ``batch`` (or the
    evaluation's forward pass) breaks, as a sentence naming the layer, the op, the limit and its
    value; None when everything fits."""
    for k, (in_modes, out_modes) in enumerate(layers):
        broken = _layer_limit(k, in_modes, out_modes, rank, batch, params)
        if broken:
            return broken
    return None


# ----------------------------------------------------------------------------------- modes

def _divisors(m: int) -> list[int]:
    return [f for f in range(1, m + 1) if m % f == 0]


def _factorizations(m: int, k: int):
    """Every ordered ``k``-tuple of integers >= 1 whose product is ``m``."""
    if k == 1:
        yield (m,)
        return
    for f in _divisors(m):
        for rest in _factorizations(m // f, k - 1):
            yield (f, *rest)


def balanced_factorizations(m: int, k: int) -> list[tuple[int, ...]]:
    """The ordered factorizations of ``m`` into ``k`` modes, most balanced first (the largest mode
    smallest, then the next largest...), the decreasing order first among equals."""
    return sorted(_factorizations(m, k), key=lambda t: (sorted(t, reverse=True), [-v for v in t]))


def _largest_m(arch: Architecture, batch: int, params: AcceleratorParams) -> int:
    """No first layer fits with ``n / 16`` above this: PE3's a = hidden * n / 16 and PE1's
    a = batch * n / 16 (forward) are size registers."""
    return params.limits.size_max // max(math.prod(arch.hidden_modes), batch, EVAL_BATCH)


def _search(arch: Architecture, n: int, rank: int, batch: int, params: AcceleratorParams,
            check: bool) -> tuple[int, ...] | None:
    """The rule's first-layer input modes for a vector of ``n`` values (module docstring)."""
    d, m = len(arch.hidden_modes), n // C_LANES
    # Without the check, the rule's first modes; with it, at most an eighth more padding and
    # never past the size registers' bound.
    last = min(m + int(m * MAX_EXTRA_PADDING), _largest_m(arch, batch, params)) if check else m
    for size in range(m, last + 1):
        for modes in balanced_factorizations(size, d - 1):
            modes = (*modes, C_LANES)
            if not check or _layer_limit(0, modes, arch.hidden_modes, rank, batch, params) is None:
                return modes
    return None


def _advice(arch, sample_shape, rank, batch, params) -> str:
    """What the user can change when no modes fit: a smaller input that fits, where one does."""
    tips = ["lower --rank or --batch-size", "choose the modes with --tt-modes"]
    if len(sample_shape) > 1:
        h, w, side = sample_shape[0], sample_shape[1], max(sample_shape[:2])
        extra = tuple(sample_shape[2:])
        if extra and _fits(arch, (h, w), rank, batch, params):
            tips.append(f"bring the images to grey with --input-size {h}x{w}x1")
        for t in range(side - 1, 0, -1):
            size = (max(1, round(h * t / side)), max(1, round(w * t / side)))
            if _fits(arch, size + extra, rank, batch, params):
                tips.append(f"bring them down with --input-size {size[0]}x{size[1]} (the largest "
                            "of their shape that fits; images are resized only when asked)")
                break
    text = ", ".join(tips[:-1]) + " or " + tips[-1]
    return text[0].upper() + text[1:]


def _fits(arch, sample_shape, rank, batch, params) -> bool:
    rows, _, padded = _layout(sample_shape, arch.pool)
    return rows > 0 and _search(arch, rows * padded, rank, batch, params, True) is not None


def _given_modes(modes, arch: Architecture, n: int, what: str) -> tuple[int, ...]:
    modes = parse_modes(modes)
    d = len(arch.hidden_modes)
    if len(modes) != d:
        raise ValueError(f"{what} takes {d} modes for --model {arch.name} (its first layer has {d} "
                         f"cores, as its hidden modes {_text(arch.hidden_modes)}); got {_text(modes)}")
    if math.prod(modes) < n:
        raise ValueError(f"{what} {_text(modes)} hold {math.prod(modes)} values; the input has {n}: "
                         f"give modes whose product is at least {n}")
    return modes


def tt_shape(sample_shape, classes: int, *, model: str = "paper", rank: int | None = None,
             batch: int = 64, modes=None, params: AcceleratorParams = DEFAULT_PARAMS,
             check: bool = True) -> TTShape:
    """The network of ``model`` for samples of ``sample_shape`` (images ``(H, W)``,
    ``(H, W, 3)``, or ``(F,)`` features) and ``classes`` classes, by the module's rule or with the
    first layer's input ``modes`` (``--tt-modes``). ``check``: every op must fit the PEs of
    ``params`` at ``rank`` (default: the architecture's) and ``batch``, else a ValueError that
    names the limit and what to change; without it (the dense baseline) the rule's first modes."""
    if model not in ARCHITECTURES:
        raise ValueError(f"unknown TT --model {model!r}; the TT networks: {', '.join(ARCHITECTURES)}")
    arch = ARCHITECTURES[model]
    rank = arch.rank if rank is None else rank
    sample_shape = tuple(int(s) for s in sample_shape)
    rows, _, padded = _layout(sample_shape, arch.pool)
    n = rows * padded
    if n == 0:
        raise ValueError(f"--model {model} pools images {arch.pool}x{arch.pool}: "
                         f"{sample_shape[0]}x{sample_shape[1]} images leave nothing")
    if not is_count(classes, 2):
        raise ValueError(f"a classifier needs at least 2 classes, got {classes!r}")
    hidden = arch.hidden_modes
    second = ((math.prod(hidden) // C_LANES, C_LANES), (-(-classes // C_LANES), C_LANES))
    source = describe_input(sample_shape, arch.pool)
    fail = f"--rank {rank} with --batch-size {batch} does not fit the PEs for {source}: "
    if check and (broken := _layer_limit(1, *second, rank, batch, params)):
        raise ValueError(f"{fail}{broken}. Lower --rank or --batch-size"
                         + (f" (or train fewer than {classes} classes)" if classes > C_LANES else ""))
    preset = dict(arch.presets).get(sample_shape)
    if modes is not None or preset is not None:
        what = "--tt-modes" if modes is not None else f"--model {model}'s preset modes"
        first = _given_modes(modes if modes is not None else preset, arch, n, what)
        if check and (broken := _layer_limit(0, first, hidden, rank, batch, params)):
            raise ValueError(f"{fail}{broken}. Lower --rank or --batch-size, or choose other "
                             "--tt-modes")
        return TTShape(arch, sample_shape, ((first, hidden), second), classes,
                       "--tt-modes" if modes is not None else "preset")
    first = _search(arch, n, rank, batch, params, check)
    if first is None:
        closest = (*balanced_factorizations(n // C_LANES, len(hidden) - 1)[0], C_LANES)
        broken = _layer_limit(0, closest, hidden, rank, batch, params)
        raise ValueError(f"{fail}no modes fit; the most balanced, {_text(closest)}: {broken}. "
                         + _advice(arch, sample_shape, rank, batch, params))
    return TTShape(arch, sample_shape, ((first, hidden), second), classes)


# ----------------------------------------------------------------------------------- options

def parse_modes(value, option: str = "--tt-modes") -> tuple[int, ...]:
    """``"7,4,2,16"`` (or a sequence of integers) -> ``(7, 4, 2, 16)``; a ValueError naming
    ``option`` otherwise."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        modes = tuple(int(v) if isinstance(v, str) else v for v in items)
    except (TypeError, ValueError):
        modes = ()
    if not modes or not all(is_count(m) for m in modes):
        raise ValueError(f"{option} takes comma-separated integers >= 1, the first layer's input "
                         f"modes (e.g. 7,4,2,16); got {value!r}")
    return tuple(int(m) for m in modes)


def parse_input_size(value, option: str = "--input-size") -> tuple[int, ...]:
    """``"20x20"``, ``"20"`` (square) or ``"28x28x1"`` (C: 1 grey, 3 RGB), or a sequence ->
    ``(H, W)`` or ``(H, W, C)``; a ValueError naming ``option`` otherwise."""
    items = value.lower().split("x") if isinstance(value, str) else value
    try:
        size = tuple(int(v) if isinstance(v, str) else v for v in items)
    except (TypeError, ValueError):
        size = ()
    if len(size) == 1:
        size = size * 2
    if not (len(size) in (2, 3) and all(is_count(s) for s in size) and size[2:] in ((), (1,), (3,))):
        raise ValueError(f"{option} takes HxW or HxWxC (C: 1 grey, 3 RGB), e.g. 20x20 or 28x28x1; "
                         f"got {value!r}")
    return tuple(int(s) for s in size)


def fit_input(data, size):
    """``data`` (a :class:`~insitu.data.Dataset`) with its images brought to ``size`` (``(H, W)``
    or ``(H, W, C)``, ``--input-size``) by the data layer's one rule; as it is when ``size`` is None."""
    if size is None:
        return data
    size = parse_input_size(size)
    if data.kind != "images":
        raise ValueError(f"--input-size resizes images, and --dataset {data.name} holds feature "
                         f"vectors {data.sample_shape}: leave it out")
    return data.fit_images(size[:2], size[2] if len(size) == 3 else None)
