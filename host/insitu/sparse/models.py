"""The float CNNs of the MCU path: small MobileNetV2-style networks built from :mod:`insitu.nn`.

A :class:`MobileNetV2` is a :class:`insitu.nn.Sequential` (so ``parameters()``, ``state_dict()``,
``predict()`` work as for any model) of: a 3x3 stride-2 stem conv + BN + ReLU6, a table of
:class:`InvertedResidual` blocks (MobileNetV2's ``(t, c, n, s)`` rows: expansion, output channels,
repeats, stride of the first repeat), a 1x1 head conv + BN + ReLU6, global average pooling and a
dense classifier (ProxylessNAS and MCUNet: a depthwise kernel per block, and no head conv). Inputs
are ``(N, C, H, W)`` floats ``(pixel - 128) / 128`` (C = 1, or 3 for ``in_channels=3``), the int8
graph's input convention (:data:`insitu.sparse.graph.INPUT_SCALE`).

BatchNorm follows every conv during training (the convs have no bias); :mod:`insitu.sparse.quantize`
folds it into the conv weights and biases (:func:`folded_units`) before quantizing. Without BN the
same networks train poorly from scratch with plain SGD at the depths used here, so BN is the
default; ``batchnorm=False`` builds the BN-free variant (biased convs) for comparison.

The named configurations are in :data:`MODELS`:

* ``"mbv2-28"``: the experiment's model, 28x28 input, 2.20 M MACs per forward and 86.4 K
  parameters after BN folding (88.4 K float parameters with BN); ``python -m
  insitu.sparse.models`` prints the figures (:func:`model_summary`);
* ``"mbv2-tiny"``: the tests' model, 12x12 input, a few thousand parameters, with a stride-2
  stem and block, depthwise and pointwise convs and residual adds.

:data:`PAPER_MODELS` holds the Tiny Training paper's three networks at 128x128 RGB
(MobileNetV2-w0.35, ProxylessNAS-w0.3, MCUNet-5FPS), checked against its figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import cast

import numpy as np
from numpy.typing import DTypeLike

import insitu.nn as nn
from insitu.errors import UsageError
from insitu.sparse.graph import conv_out

__all__ = ["ModelConfig", "MODELS", "PAPER_MODELS", "PAPER_SCHEMES", "model_names", "model_config", "InvertedResidual", "MobileNetV2",
           "build_model", "model_summary", "Unit", "folded_units", "folded_forward", "fold_bn",
           "train_float", "FloatTrainState", "float_accuracy", "FastPointwiseConv2d", "FastDepthwiseConv2d"]


@dataclass(frozen=True)
class ModelConfig:
    """A MobileNetV2-style network: ``blocks`` rows are ``(t, c, n, s)`` as in the MobileNetV2
    paper, or ``(t, c, n, s, k)`` with the depthwise kernel ``k`` (default 3: ProxylessNAS and
    MCUNet choose 3, 5 or 7 per block); channel counts are multiplied by ``width`` and rounded to
    a multiple of ``divisor``. ``head``: the 1x1 conv before the pooling, or None for none (the
    classifier then reads the last block); ``in_channels``: 1 (grey) or 3 (RGB)."""

    name: str
    input_size: int
    stem: int
    blocks: tuple[tuple[int, ...], ...]
    head: int | None
    width: float = 1.0
    divisor: int = 4
    num_classes: int = 10
    batchnorm: bool = True
    in_channels: int = 1

    def channels(self, c: int) -> int:
        return make_divisible(c * self.width, self.divisor)

    def block_rows(self) -> list[tuple[int, int, int, int, int]]:
        """``blocks`` as ``(t, c, n, s, k)`` rows (``k`` 3 where a row leaves it out)."""
        rows = []
        for row in self.blocks:
            t, c, n, s, *kernel = row
            rows.append((t, c, n, s, kernel[0] if kernel else 3))
        return rows

    def as_dict(self) -> dict:
        d = asdict(self)
        d["blocks"] = [list(b) for b in self.blocks]
        # Grey input, the default, is left out: the pretrained caches of the grey models are keyed
        # by this dict, and in_channels came after them.
        if self.in_channels == 1:
            del d["in_channels"]
        return d


def make_divisible(v: float, divisor: int) -> int:
    """MobileNet's rounding of a scaled channel count: nearest multiple, never 10 % below ``v``."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new < 0.9 * v:
        new += divisor
    return new


MODELS: dict[str, ModelConfig] = {
    "mbv2-28": ModelConfig(
        name="mbv2-28", input_size=28, stem=16, head=192,
        blocks=((1, 16, 1, 1), (4, 24, 2, 2), (4, 32, 1, 1), (4, 48, 2, 2), (4, 64, 1, 1)),
    ),
    "mbv2-tiny": ModelConfig(
        name="mbv2-tiny", input_size=12, stem=8, head=32,
        blocks=((1, 8, 1, 1), (2, 12, 2, 2)),
    ),
}


#: The Tiny Training paper's three networks (its Sec. 4 setups and Fig. 10), at 128x128 RGB with
#: ImageNet's 1000 classes, as released with that paper: the layer tables of
#: ``algorithm/assets/mcu_models/{mbv2-w0.35,proxyless-w0.3,mcunet-5fps}.pkl`` in
#: github.com/mit-han-lab/tiny-training (input 3x128x128, every conv's channels, kernel and
#: stride; no 1x1 head conv: the classifier reads the last block). MobileNetV2-w0.35 is the
#: MobileNetV2 paper's table at width 0.35 (channels rounded to 8); ProxylessNAS-w0.3 (the
#: ProxylessNAS mobile network at width 0.3) and MCUNet-5FPS (MCUNet's 5 FPS ImageNet network,
#: found by TinyNAS) list one row per block, with its expansion and kernel. The paper gives their
#: backbones as "17M MACs, 0.25M Param", "19M, 0.33M" and "23M, 0.48M": those are the MACs of
#: the whole forward (16.8, 18.7, 22.6 M; the backbone alone is 16.6, 18.6, 22.5 M) and the
#: float parameters of the backbone with BN (250, 332, 475 K) of :func:`model_summary`
#: (tests/unit/test_sparse_paper_models.py). The MCU commands take them by name (pretrained here
#: on FashionMNIST as RGB: :data:`insitu.sparse.pretrain.PRETRAIN_DEFAULTS`).
PAPER_MODELS: dict[str, ModelConfig] = {
    "mbv2-w0.35": ModelConfig(
        name="mbv2-w0.35", input_size=128, in_channels=3, stem=32, head=None, width=0.35,
        divisor=8, num_classes=1000,
        blocks=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)),
    ),
    "proxyless-w0.3": ModelConfig(
        name="proxyless-w0.3", input_size=128, in_channels=3, stem=16, head=None, divisor=1,
        num_classes=1000,
        blocks=((1, 8, 1, 1, 3), (3, 16, 1, 2, 5), (3, 16, 1, 1, 3), (3, 16, 1, 2, 7),
                (3, 16, 1, 1, 3), (3, 16, 1, 1, 5), (3, 16, 1, 1, 5), (6, 24, 1, 2, 7),
                (3, 24, 3, 1, 5), (6, 32, 1, 1, 5), (3, 32, 3, 1, 5), (6, 64, 1, 2, 7),
                (6, 64, 1, 1, 7), (3, 64, 2, 1, 7), (6, 96, 1, 1, 7)),
    ),
    "mcunet-5fps": ModelConfig(
        name="mcunet-5fps", input_size=128, in_channels=3, stem=16, head=None, divisor=1,
        num_classes=1000,
        blocks=((1, 8, 1, 1, 3), (4, 16, 1, 2, 3), (3, 16, 1, 1, 3), (3, 24, 1, 2, 7),
                (5, 24, 1, 1, 3), (5, 40, 1, 2, 3), (4, 40, 1, 1, 7), (4, 48, 1, 1, 5),
                (3, 48, 1, 1, 3), (4, 48, 1, 1, 3), (5, 96, 1, 2, 7), (4, 96, 2, 1, 5),
                (6, 160, 1, 1, 3)),
    ),
}


#: The sparse-update schemes released with the paper for its three networks, searched under
#: budgets of its own memory analysis (49 to 148 KB): ``compilation/mcu_ir_gen.py`` in
#: github.com/mit-han-lab/tiny-training. Per budget: ``(n_bias_update, {conv index: ratio})``,
#: the biases of the last n backbone convs and the weights of the listed convs (indices into the
#: backbone's convs, as insitu's graph orders them; a ratio 0 there updates no weight and is
#: left out). The classifier trains too. The paper's ratio counts input channels; insitu's
#: partial update selects output channels at the same ratio
#: (:meth:`insitu.sparse.scheme.Scheme.selected_channels`).
PAPER_SCHEMES: dict[str, dict[str, tuple[int, dict[int, float]]]] = {
    "mbv2-w0.35": {
        "49kb": (16, {36: 1, 39: 1, 41: 0.25, 42: 0.125, 45: 0.125, 48: 0.125, 49: 0.125}),
        "73kb": (20, {32: 0.125, 33: 0.5, 36: 0.5, 39: 1, 41: 0.25, 42: 0.125, 45: 0.125, 48: 1}),
        "99kb": (25, {27: 1, 30: 1, 33: 1, 36: 1, 39: 1, 42: 0.125, 45: 0.5, 48: 1}),
        "123kb": (31, {27: 1, 30: 1, 33: 1, 36: 1, 39: 1, 42: 0.5, 45: 1, 48: 1}),
        "138kb": (34, {27: 1, 30: 1, 33: 1, 36: 1, 39: 1, 42: 1, 45: 1, 48: 1}),
    },
    "mcunet-5fps": {
        "49kb": (20, {24: 0.25, 27: 0.5, 30: 0.5}),
        "74kb": (21, {21: 1, 24: 1, 27: 0.5, 30: 1}),
        "99kb": (22, {21: 1, 24: 1, 27: 1, 30: 1, 36: 0.125, 39: 0.25}),
        "124kb": (24, {21: 0.25, 24: 1, 27: 1, 30: 1, 33: 0.5, 39: 0.5}),
        "148kb": (23, {21: 1, 24: 1, 27: 1, 30: 1, 36: 1, 39: 0.5}),
    },
    "proxyless-w0.3": {
        "49kb": (21, {39: 0.25, 42: 1, 45: 1, 51: 0.125, 54: 0.25, 57: 0.25}),
        "74kb": (28, {33: 0.5, 36: 0.25, 39: 1, 42: 1, 45: 1, 51: 0.5, 54: 0.25, 57: 0.5}),
        "98kb": (25, {36: 1, 39: 0.5, 42: 1, 45: 1, 48: 0.25, 51: 0.5, 54: 1, 57: 1}),
        "120kb": (32, {36: 1, 39: 1, 42: 1, 45: 1, 48: 0.5, 51: 1, 54: 1, 57: 1}),
        "148kb": (45, {36: 1, 39: 1, 42: 1, 45: 1, 48: 1, 51: 1, 54: 1, 57: 1}),
    },
}


def model_names() -> tuple[str, ...]:
    """Every built-in model's name: :data:`MODELS`, then :data:`PAPER_MODELS`."""
    return (*MODELS, *PAPER_MODELS)


def model_config(name: str) -> ModelConfig:
    """The configuration named ``name``: one of :data:`MODELS` or :data:`PAPER_MODELS`."""
    known = {**MODELS, **PAPER_MODELS}
    if name not in known:
        raise UsageError(f"unknown model {name!r}; known models: {', '.join(known)}")
    return known[name]


# --------------------------------------------------------------------------- layers


class FastPointwiseConv2d(nn.PointwiseConv2d):
    """:class:`insitu.nn.PointwiseConv2d` (same parameters, same results) with a backward that
    skips ``col2im``: for a 1x1 stride-1 conv, the input gradient is one GEMM and a transpose.
    (``insitu.nn``'s generic ``col2im`` path made the pointwise backward ~1/3 of a training
    step.) Kronecker pairs are not kept."""

    def forward(self, x, train=True):
        if self.stride != (1, 1):
            return super().forward(x, train)
        n, c, h, w = x.shape
        if c != self.c_in:
            raise ValueError(f"{type(self).__name__} expects (N, {self.c_in}, H, W) input, got {x.shape}")
        xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(-1, c)        # (N*H*W, C)
        y = xl @ self.weight_matrix.astype(x.dtype, copy=False).T
        if "bias" in self.params:
            y += self.params["bias"].astype(x.dtype, copy=False)
        self._cache = (x.shape, xl) if train else None
        self._pairs = None
        return np.ascontiguousarray(y.reshape(n, h, w, self.c_out).transpose(0, 3, 1, 2))

    def backward(self, dy):
        if self.stride != (1, 1):
            return super().backward(dy)
        (n, c, h, w), xl = self._saved()
        dz = np.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(-1, self.c_out)
        if self.compute_weight_grad:
            self.grads["weight"] += (dz.T @ xl).reshape(self.params["weight"].shape)
        if "bias" in self.params:
            self.grads["bias"] += dz.sum(axis=0)
        dx = dz @ self.weight_matrix.astype(dy.dtype, copy=False)
        return np.ascontiguousarray(dx.reshape(n, h, w, c).transpose(0, 3, 1, 2))


class FastDepthwiseConv2d(nn.DepthwiseConv2d):
    """:class:`insitu.nn.DepthwiseConv2d` (same parameters, same results) computed channels-last
    as a sum over the ``k*k`` kernel offsets of shifted slices: no im2col / col2im, and the
    slices stay contiguous along C even on 4x4 maps (2-5x faster here). Kronecker pairs are
    not kept."""

    def _geometry(self, h, w):
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        ho, wo = conv_out(h, kh, sh, ph), conv_out(w, kw, sw, pw)
        for i in range(kh):
            for j in range(kw):
                yield i, j, (slice(None), slice(i, i + sh * (ho - 1) + 1, sh), slice(j, j + sw * (wo - 1) + 1, sw))

    def forward(self, x, train=True):
        n, c, h, w = x.shape
        if c != self.channels:
            raise ValueError(f"DepthwiseConv2d expects (N, {self.channels}, H, W) input, got {x.shape}")
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        ho, wo = conv_out(h, kh, sh, ph), conv_out(w, kw, sw, pw)
        xl = np.zeros((n, h + 2 * ph, w + 2 * pw, c), dtype=x.dtype)       # padded, channels last
        xl[:, ph:ph + h, pw:pw + w, :] = x.transpose(0, 2, 3, 1)
        wl = np.ascontiguousarray(self.params["weight"][:, 0].transpose(1, 2, 0)).astype(x.dtype, copy=False)
        y = np.zeros((n, ho, wo, c), dtype=x.dtype)
        tmp = np.empty_like(y)
        for i, j, sl in self._geometry(h, w):
            np.multiply(xl[sl], wl[i, j], out=tmp)
            y += tmp
        if "bias" in self.params:
            y += self.params["bias"].astype(x.dtype, copy=False)
        self._cache = (x.shape, xl) if train else None
        self._pairs = None
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    def backward(self, dy):
        (n, c, h, w), xl = self._saved()
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        dyl = np.ascontiguousarray(dy.transpose(0, 2, 3, 1))
        wl = np.ascontiguousarray(self.params["weight"][:, 0].transpose(1, 2, 0)).astype(dy.dtype, copy=False)
        dxl = np.zeros(xl.shape, dtype=dy.dtype)
        gw = np.zeros((c, kh, kw), dtype=np.float64)
        tmp = np.empty_like(dyl)
        for i, j, sl in self._geometry(h, w):
            if self.compute_weight_grad:
                np.multiply(dyl, xl[sl], out=tmp)
                gw[:, i, j] = tmp.reshape(-1, c).sum(axis=0)
            np.multiply(dyl, wl[i, j], out=tmp)
            dxl[sl] += tmp
        if self.compute_weight_grad:
            self.grads["weight"] += gw.reshape(self.params["weight"].shape).astype(self.grads["weight"].dtype)
        if "bias" in self.params:
            self.grads["bias"] += dyl.reshape(-1, c).sum(axis=0)
        return np.ascontiguousarray(dxl[:, ph:ph + h, pw:pw + w, :].transpose(0, 3, 1, 2))


class _ConvBN(nn.Sequential):
    """conv [+ BN] [+ ReLU6]: the float counterpart of one graph Conv node."""

    def __init__(self, conv: nn.Layer, channels: int, act: str, batchnorm: bool, dtype):
        layers = [conv]
        if batchnorm:
            layers.append(nn.BatchNorm(channels, dtype=dtype))
        if act == "relu6":
            layers.append(nn.ReLU6())
        super().__init__(*layers)
        self.act = act

    @property
    def conv(self) -> nn.Layer:
        return self.layers[0]

    @property
    def bn(self) -> nn.BatchNorm | None:
        return self.layers[1] if len(self.layers) > 1 and isinstance(self.layers[1], nn.BatchNorm) else None


def _conv_bn(c_in, c_out, k, stride, act, batchnorm, rng, dtype, depthwise=False) -> _ConvBN:
    seed = int(rng.integers(2**31))
    bias = not batchnorm
    if depthwise:
        conv = FastDepthwiseConv2d(c_in, k, stride=stride, padding=k // 2, bias=bias, seed=seed, dtype=dtype)
    elif k == 1:
        conv = FastPointwiseConv2d(c_in, c_out, stride=stride, bias=bias, seed=seed, dtype=dtype)
    else:
        conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, bias=bias, seed=seed, dtype=dtype)
    if act == "none" and not batchnorm:
        # A linear bottleneck without BN: He init assumes a ReLU follows; halve the variance.
        conv.params["weight"] *= np.sqrt(0.5).astype(conv.params["weight"].dtype)
    return _ConvBN(conv, c_out, act, batchnorm, dtype)


class InvertedResidual(nn.Layer):
    """MobileNetV2's block: 1x1 expand + ReLU6 (skipped when ``expand == 1``), 3x3 depthwise
    (``stride``) + ReLU6, 1x1 linear projection; ``y = x + body(x)`` when ``stride == 1`` and
    ``c_in == c_out``, else ``y = body(x)``.

    Parameters are named ``"<part>.<index>.<name>"`` with parts ``expand``, ``dw``, ``project``
    (``"dw.0.weight"`` is the depthwise kernel, ``"dw.1.gamma"`` its BN scale).
    """

    def __init__(self, c_in: int, c_out: int, expand: int, stride: int, *, batchnorm: bool = True,
                 seed=None, dtype: DTypeLike = np.float64, kernel: int = 3):
        super().__init__()
        rng = np.random.default_rng(seed)
        hidden = c_in * expand
        self.c_in, self.c_out, self.expand_ratio, self.stride = c_in, c_out, expand, stride
        self.parts: dict[str, _ConvBN] = {}
        if expand != 1:
            self.parts["expand"] = _conv_bn(c_in, hidden, 1, 1, "relu6", batchnorm, rng, dtype)
        self.parts["dw"] = _conv_bn(hidden, hidden, kernel, stride, "relu6", batchnorm, rng, dtype,
                                    depthwise=True)
        self.parts["project"] = _conv_bn(hidden, c_out, 1, 1, "none", batchnorm, rng, dtype)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x, train=True):
        y = x
        for part in self.parts.values():
            y = part.forward(y, train)
        return y + x if self.residual else y

    def backward(self, dy):
        g = dy
        for part in reversed(self.parts.values()):
            g = part.backward(g)
        return g + dy if self.residual else g

    def parameters(self, prefix: str = ""):
        for name, part in self.parts.items():
            yield from part.parameters(f"{prefix}{name}.")

    def named_buffers(self, prefix: str = ""):
        for name, part in self.parts.items():
            yield from part.named_buffers(f"{prefix}{name}.")

    def zero_grad(self) -> None:
        for part in self.parts.values():
            part.zero_grad()

    def __repr__(self):
        return (f"InvertedResidual({self.c_in}, {self.c_out}, expand={self.expand_ratio}, "
                f"stride={self.stride}, residual={self.residual})")


class MobileNetV2(nn.Sequential):
    """The network of a :class:`ModelConfig` (a Sequential: stem, blocks, head, pool, classifier).

    ``self.names`` gives each layer of the Sequential its graph name (``"stem"``, ``"b1"``...,
    ``"head.conv"``, ``"pool"``, ``"classifier"``).
    """

    def __init__(self, config: ModelConfig, seed: int = 0, dtype: type[np.floating] = np.float32):
        rng = np.random.default_rng(seed)
        bn = config.batchnorm
        c = config.channels(config.stem)
        layers: list[nn.Layer] = [_conv_bn(config.in_channels, c, 3, 2, "relu6", bn, rng, dtype)]
        names = ["stem"]
        k = 0
        for t, c_out, n, s, kernel in config.block_rows():
            c_out = config.channels(c_out)
            for i in range(n):
                k += 1
                layers.append(InvertedResidual(c, c_out, t, s if i == 0 else 1, batchnorm=bn,
                                               seed=int(rng.integers(2**31)), dtype=dtype,
                                               kernel=kernel))
                names.append(f"b{k}")
                c = c_out
        if config.head is not None:
            head = config.channels(config.head)
            layers.append(_conv_bn(c, head, 1, 1, "relu6", bn, rng, dtype))
            names.append("head.conv")
            c = head
        layers.append(nn.GlobalAvgPool2d())
        names.append("pool")
        classifier = nn.Dense(c, config.num_classes, seed=int(rng.integers(2**31)), dtype=dtype)
        # A small classifier at the start keeps the first losses near log(classes).
        classifier.params["weight"] *= dtype(0.1)
        layers.append(classifier)
        names.append("classifier")
        super().__init__(*layers)
        self.config = config
        self.names = names
        self.dtype = dtype

    def named_layers(self):
        return list(zip(self.names, self.layers))


def build_model(name_or_config: str | ModelConfig, seed: int = 0, dtype=np.float32) -> MobileNetV2:
    config = model_config(name_or_config) if isinstance(name_or_config, str) else name_or_config
    return MobileNetV2(config, seed=seed, dtype=dtype)


# --------------------------------------------------------------------------- folding and export


@dataclass
class Unit:
    """One graph Conv in float form after BN folding: ``y = act(conv(x, weight) + bias)``."""

    name: str
    weight: np.ndarray            # float64 [O, C // groups, K, K]
    bias: np.ndarray              # float64 [O]
    stride: int
    pad: int
    groups: int
    act: str
    block: str = ""               # "b3" for the convs inside block 3
    residual: bool = False        # the project conv of a residual block (an Add follows)


def fold_bn(weight: np.ndarray, bias: np.ndarray | None, bn: nn.BatchNorm | None):
    """BN (eval mode, running statistics) folded into the preceding conv: ``(weight, bias)``."""
    w = np.asarray(weight, np.float64)
    b = np.zeros(w.shape[0]) if bias is None else np.asarray(bias, np.float64).copy()
    if bn is None:
        return w.copy(), b
    gamma = np.asarray(bn.params["gamma"], np.float64)
    beta = np.asarray(bn.params["beta"], np.float64)
    inv = gamma / np.sqrt(bn.buffers["running_var"] + bn.eps)
    return w * inv.reshape(-1, *([1] * (w.ndim - 1))), beta + (b - bn.buffers["running_mean"]) * inv


def _unit(name: str, cb: _ConvBN, block: str = "", residual: bool = False) -> Unit:
    conv = cast("nn.Conv2d | nn.DepthwiseConv2d", cb.conv)   # (what _conv_bn builds)
    w, b = fold_bn(conv.params["weight"], conv.params.get("bias"), cb.bn)
    groups = conv.channels if isinstance(conv, nn.DepthwiseConv2d) else 1
    return Unit(name, w, b, conv.stride[0], conv.padding[0], groups, cb.act, block, residual)


def folded_units(model: MobileNetV2) -> list[Unit]:
    """The model as the graph's list of convs (BN folded, classifier as a 1x1 conv), in order."""
    units = []
    for name, layer in model.named_layers():
        if isinstance(layer, InvertedResidual):
            for part_name, part in layer.parts.items():
                residual = part_name == "project" and layer.residual
                units.append(_unit(f"{name}.{part_name}", part, name, residual))
        elif isinstance(layer, _ConvBN):
            units.append(_unit(name, layer))
        elif isinstance(layer, nn.Dense):
            w = np.asarray(layer.params["weight"], np.float64)[:, :, None, None]
            units.append(Unit(name, w, np.asarray(layer.params["bias"], np.float64).copy(), 1, 0, 1, "none"))
    return units


def folded_forward(units: list[Unit], x: np.ndarray, record: dict | None = None) -> np.ndarray:
    """Float forward of the folded network (eval mode), ``x`` ``(N, 1, H, W)``: the function the
    int8 graph approximates. ``record`` (a dict) receives every graph tensor by its name."""
    x = np.asarray(x, np.float64)
    block_in, pooled = None, False
    for u in units:
        if u.block and u.name.endswith((".expand", ".dw")) and (block_in is None or block_in[0] != u.block):
            block_in = (u.block, x)
        if u.name == "classifier" and not pooled:
            x = x.mean(axis=(2, 3), keepdims=True)
            if record is not None:
                record["pool"] = x
            pooled = True
        x = _conv_float(x, u.weight, u.bias, u.stride, u.pad, u.groups)
        if u.act == "relu6":
            x = np.clip(x, 0, 6)
        elif u.act == "relu":
            x = np.maximum(x, 0)
        if record is not None:
            record[u.name] = x
        if u.residual:
            assert block_in is not None         # a residual unit ends a block that it began
            x = x + block_in[1]
            if record is not None:
                record[f"{u.block}.add"] = x
    return x.reshape(len(x), -1)


def _conv_float(x, w, b, stride, pad, groups):
    n, c, h, wd = x.shape
    o, cg, k, _ = w.shape
    cols = nn.im2col(x, k, stride, pad)                 # (N, P, C*k*k), last axis (c, i, j)
    ho, wo = conv_out(h, k, stride, pad), conv_out(wd, k, stride, pad)
    if groups == 1:
        y = cols @ w.reshape(o, -1).T
    elif groups == c == o:
        y = np.einsum("npck,ck->npc", cols.reshape(n, ho * wo, c, k * k), w.reshape(o, k * k), optimize=True)
    else:
        raise ValueError("only full (groups=1) and depthwise (groups=C=O) convs are supported")
    y = y + b
    return np.ascontiguousarray(y.reshape(n, ho, wo, o).transpose(0, 3, 1, 2))


def model_summary(name_or_config: str | ModelConfig) -> dict:
    """MACs of one forward and parameter counts (trainable float params, and the int8 graph's
    weights + biases after BN folding) of a configuration; ``backbone_macs`` and
    ``backbone_params``, ``backbone_float_params``: the same without the classifier."""
    config = model_config(name_or_config) if isinstance(name_or_config, str) else name_or_config
    model = MobileNetV2(config, seed=0)
    size, macs, rows = config.input_size, 0, []
    for u in folded_units(model):
        o, cg, k, _ = u.weight.shape
        if u.name == "classifier":
            size = 1
        out = conv_out(size, k, u.stride, u.pad)
        m = out * out * o * cg * k * k
        macs += m
        rows.append({"name": u.name, "shape": list(u.weight.shape), "out": [o, out, out], "macs": m,
                     "params": u.weight.size + u.bias.size})
        size = out
    graph_params = sum(r["params"] for r in rows)
    float_params = sum(p.value.size for p in model.parameters())
    backbone = [r for r in rows if r["name"] != "classifier"]
    classifier = sum(v.size for v in dict(model.named_layers())["classifier"].params.values())
    return {"name": config.name, "input_size": config.input_size, "macs": macs,
            "params": graph_params, "float_params": float_params,
            "backbone_macs": sum(r["macs"] for r in backbone),
            "backbone_params": sum(r["params"] for r in backbone),
            "backbone_float_params": float_params - classifier, "layers": rows}


# --------------------------------------------------------------------------- float training


def float_accuracy(model: MobileNetV2, images: np.ndarray, labels: np.ndarray, batch_size: int = 500) -> float:
    """Top-1 accuracy (eval mode) on uint8 images ``(N, H, W)``."""
    from insitu.sparse.tasks import float_inputs

    correct = 0
    for i in range(0, len(images), batch_size):
        logits = model.forward(float_inputs(images[i:i + batch_size], model.dtype), train=False)
        correct += int((logits.argmax(axis=1) == labels[i:i + batch_size]).sum())
    return correct / max(len(images), 1)


@dataclass
class FloatTrainState:
    """Where :func:`train_float` stands after ``step`` optimizer steps: the model's parameters and
    buffers (``model.*``) and the momentum velocities (``opt<k>.*``) in ``arrays``, the mean loss of
    each finished epoch in ``losses``, and ``total``, the summed loss of the epoch under way. A run
    resumed from it steps on bit-identically to one that was never interrupted."""

    step: int
    losses: list
    total: float
    arrays: dict


def _optimizers(model: MobileNetV2, lr: float, momentum: float, weight_decay: float) -> list:
    params = list(model.parameters())
    decay = [p for p in params if p.name == "weight"]
    rest = [p for p in params if p.name != "weight"]
    return [nn.SGD(decay, lr, momentum, weight_decay), nn.SGD(rest, lr, momentum)]


def train_float(model: MobileNetV2, images: np.ndarray, labels: np.ndarray, *, epochs: int = 1,
                batch_size: int = 64, lr: float = 0.05, momentum: float = 0.9,
                weight_decay: float = 4e-5, seed: int = 0, log=None, resume: FloatTrainState | None = None,
                save=None, save_every_s: float | None = None, on_epoch=None) -> list[float]:
    """SGD with momentum, a linear warm-up over the first 3 % of steps and cosine decay to 0,
    L2 decay on the conv/dense weights only; uint8 images ``(N, H, W)``. Returns the mean loss
    of each epoch. ``log(step, steps, loss)`` is called every ~2 % of the steps.

    Resumable: ``save(state)`` (a :class:`FloatTrainState`) is called at the end of every epoch
    and, with ``save_every_s``, at most that often within one; ``resume=state`` goes on from
    there (the model given is overwritten with the state's), giving the same weights as a run
    that was never interrupted. ``on_epoch(epoch, epochs, loss)`` is called after each epoch
    (after its ``save``): an exception from it stops the training with that epoch saved."""
    import time

    from insitu.sparse.tasks import float_inputs

    rng = np.random.default_rng(seed)
    opts = _optimizers(model, lr, momentum, weight_decay)
    per_epoch = int(np.ceil(len(images) / batch_size))
    steps, warm = epochs * per_epoch, max(1, int(0.03 * epochs * per_epoch))
    every = max(1, steps // 50)
    losses, step, total = [], 0, 0.0
    if resume is not None:
        if not 0 <= resume.step <= steps or len(resume.losses) != resume.step // per_epoch:
            raise ValueError(f"train_float: cannot resume at step {resume.step} with "
                             f"{len(resume.losses)} epoch losses ({steps} steps, {per_epoch} an epoch)")
        model.load_state_dict({k[6:]: v for k, v in resume.arrays.items() if k.startswith("model.")})
        for k, opt in enumerate(opts):
            prefix = f"opt{k}."
            opt.load_state_dict({n[len(prefix):]: v for n, v in resume.arrays.items() if n.startswith(prefix)})
        losses, step, total = [float(v) for v in resume.losses], int(resume.step), float(resume.total)

    def state() -> FloatTrainState:
        arrays = {f"model.{k}": v for k, v in model.state_dict().items()}
        for k, opt in enumerate(opts):
            arrays.update({f"opt{k}.{n}": v for n, v in opt.state_dict().items()})
        return FloatTrainState(step, list(losses), total, arrays)

    saved_at = time.monotonic()
    for epoch in range(epochs):
        order = rng.permutation(len(images))       # drawn for every epoch: a resumed run's order
        if (epoch + 1) * per_epoch <= step:        # this epoch was done before the resume
            continue
        for b in range(step - epoch * per_epoch, per_epoch):
            idx = order[b * batch_size:(b + 1) * batch_size]
            rate = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + np.cos(np.pi * step / steps))
            for opt in opts:
                opt.lr = rate
                opt.zero_grad()
            logits = model.forward(float_inputs(images[idx], model.dtype), train=True)
            loss, grad = nn.softmax_cross_entropy(logits, labels[idx])
            model.backward(grad)
            for opt in opts:
                opt.step()
            total += loss * len(idx)
            step += 1
            if log is not None and (step % every == 0 or step == steps):
                log(step, steps, loss)
            if (save is not None and save_every_s is not None and b + 1 < per_epoch
                    and time.monotonic() - saved_at >= save_every_s):
                save(state())
                saved_at = time.monotonic()
        losses.append(total / len(images))
        total = 0.0
        if save is not None:
            save(state())
            saved_at = time.monotonic()
        if on_epoch is not None:
            on_epoch(epoch + 1, epochs, losses[-1])
    return losses


if __name__ == "__main__":  # pragma: no cover - a quick look at the configurations
    for key in (*MODELS, *PAPER_MODELS):
        s = model_summary(key)
        print(f"{key}: {s['macs'] / 1e6:.3f} M MACs, {s['params'] / 1e3:.1f} K params "
              f"({s['float_params'] / 1e3:.1f} K float params with BN)")
