"""A small CIFAR-style ResNet with E²-Train's selective layer update (SLU).

Architecture (He et al. 2016, the CIFAR variant; depth ``6n + 2`` with ``n = blocks_per_stage``)::

    stem:   conv3x3 (C_in -> w0) - BN - ReLU
    s1..s3: n basic blocks each, widths (w0, 2 w0, 4 w0):
            out = ReLU(shortcut(x) + BN(conv3x3(ReLU(BN(conv3x3(x))))))
            the first block of s2 and s3 has stride 2 and a 1x1 conv + BN projection shortcut
    head:   global average pool - Dense -> logits

Names: ``stem.conv``, ``stem.bn``, ``s1.b0.conv1``, ``s1.b0.bn1``, ``s1.b0.conv2``, ``s1.b0.bn2``,
``s2.b0.short.conv``, ``s2.b0.short.bn``, ``fc``; the gate of block ``s1.b1`` is ``s1.b1.gate``.

SLU (section 3.2, eq. 1; appendix C). With ``gated=True`` every block with an identity shortcut
gets an RNN gate (:mod:`insitu.e2train.gates`) that sees the block's input and gives ``p``, the
probability to execute it. Forward, in training and evaluation alike, the block runs only for
the samples with ``p >= 0.5``: its convs and BNs get the subset ``x[idx]`` only (skipped
samples are not computed and then masked: they are never computed); they pass through unchanged
(``out = x``, which is already ReLU'd), executed ones get ``ReLU(x + F(x))``. Backward runs on
the same subset; a block that no sample executes is not touched at all.

Gate training (straight-through): the forward uses the hard decision ``d = [p >= 0.5]``; the
backward treats ``d`` as if it were ``p`` in ``out = ReLU(x + d F(x))``, so for an executed
sample ``dL/dp = <dL/dout * ReLU'(x + F), F(x)>`` (the exact ``dL/dd`` at ``d = 1``) and for a
skipped one 0 (F was never computed). The gates do not send gradient into the main network
(see :mod:`insitu.e2train.gates`).

Regularizer (eq. 1): ``C = mean_n sum_b p_{n,b} FLOPs_b / FLOPs_all``, the expected fraction of
gated-block MACs executed, with ``FLOPs_b`` the block's MACs per sample; the loss term is
``slu_alpha * C`` (``model.slu_cost`` holds C after a forward; ``backward`` adds
``slu_alpha * dC/dp`` to the gates' gradient, with the sign rule below).

Why it does not collapse. Skipped samples get no task gradient, only the regularizer's push, so
the plain eq. 1 only ever closes gates: once ``p < 0.5`` nothing reopens them. Early in training
the gates are nearly input-independent, so a gate closes for the whole batch at once, and SGD's
momentum carries the push on; a one-sided hinge ("push only while the skip ratio is below the
target") still ended with every gate shut on FashionMNIST. The push is therefore a set-point
rule on the *realised* saving: while this batch's skip ratio (fraction of gated-block MACs
actually skipped) is below ``target_skip`` the gates get eq. 1's gradient ``+alpha dC/dp``
(close), while it is above they get ``-alpha dC/dp`` (open), at the target nothing. The task
gradient of the executed samples decides *which* samples and blocks skip; ``target_skip`` sets
how much, ``slu_alpha`` how hard and fast (``slu_alpha = 0``: no push, blocks keep running).
``target_skip = 1`` is the unhinged eq. 1 (always close).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence, cast

import numpy as np

from insitu.nn import BatchNorm, Conv2d, Dense, GlobalAvgPool2d, Layer, Param, ReLU
from insitu.nn.model import collect_state, restore_state

from .gates import RNNGates

__all__ = ["ResNet"]

LayerWrapper = Callable[[str, Layer], Layer]


def _inner(layer: Layer) -> Layer:
    """The plain Conv2d/Dense under any wrappers (for shapes)."""
    while hasattr(layer, "inner"):
        layer = getattr(layer, "inner")
    return layer


class _Block:
    """One basic block; runs on all samples, or (when gated) on a subset of them."""

    def __init__(self, name: str, stage: int, c_in: int, c_out: int, stride: int, conv, bn):
        self.name, self.stage = name, stage
        self.conv1 = conv(f"{name}.conv1", c_in, c_out, 3, stride, 1)
        self.bn1 = bn(f"{name}.bn1", c_out)
        self.relu1 = ReLU()
        self.conv2 = conv(f"{name}.conv2", c_out, c_out, 3, 1, 1)
        self.bn2 = bn(f"{name}.bn2", c_out)
        self.projection = stride != 1 or c_in != c_out
        self.layers: dict[str, Layer] = {
            f"{name}.conv1": self.conv1, f"{name}.bn1": self.bn1,
            f"{name}.conv2": self.conv2, f"{name}.bn2": self.bn2}
        if self.projection:
            self.short_conv = conv(f"{name}.short.conv", c_in, c_out, 1, stride, 0)
            self.short_bn = bn(f"{name}.short.bn", c_out)
            self.layers[f"{name}.short.conv"] = self.short_conv
            self.layers[f"{name}.short.bn"] = self.short_bn
        self.gate_index: int | None = None      # position in the gate sequence, if gated
        self._cache = None

    def forward(self, x: np.ndarray, train: bool, idx: np.ndarray | None, executed: dict) -> np.ndarray:
        """``idx``: samples to execute (None = all). Records the executed count per layer."""
        n = x.shape[0]
        k = n if idx is None else len(idx)
        for name in self.layers:
            executed[name] = k
        if k == 0:
            self._cache = ("none",) if train else None
            return x
        sub = idx is not None and k < n
        xs = x[idx] if sub else x
        f = self.bn1.forward(self.conv1.forward(xs, train), train)
        f = self.bn2.forward(self.conv2.forward(self.relu1.forward(f, train), train), train)
        short = self.short_bn.forward(self.short_conv.forward(xs, train), train) if self.projection else xs
        pre = short + f
        mask = pre > 0
        y = pre * mask
        if train:
            self._cache = ("run", idx if sub else None, mask, f if self.gate_index is not None else None)
        else:
            self._cache = None
        if not sub:
            return y
        out = x.copy()
        out[idx] = y
        return out

    def backward(self, dout: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Returns ``dx`` and, for a gated block, the straight-through ``dL/dp`` ``(N,)``."""
        if self._cache is None:
            raise RuntimeError(f"{self.name}: backward without a training forward")
        if self._cache[0] == "none":
            return dout, (np.zeros(dout.shape[0], dtype=dout.dtype) if self.gate_index is not None else None)
        _, idx, mask, f = self._cache
        d_sub = dout[idx] if idx is not None else dout
        dpre = d_sub * mask
        dp = None
        if f is not None:
            # <dL/dpre, F> per sample: dL/dd at d = 1 (straight-through to p).
            dp_sub = np.einsum("nchw,nchw->n", dpre, f)
            if idx is None:
                dp = dp_sub
            else:
                dp = np.zeros(dout.shape[0], dtype=dout.dtype)
                dp[idx] = dp_sub
        df = self.bn2.backward(dpre)
        df = self.bn1.backward(self.relu1.backward(self.conv2.backward(df)))
        dxs = self.conv1.backward(df)
        if self.projection:
            dxs += self.short_conv.backward(self.short_bn.backward(dpre))
        else:
            dxs += dpre
        if idx is None:
            return dxs, dp
        dx = dout.copy()
        dx[idx] = dxs
        return dx, dp


class ResNet:
    """CIFAR-style ResNet-(6n+2) with optional SLU gates; see the module docstring.

    Arguments: ``in_channels``, ``num_classes``; ``w0`` (first-stage width, stages are
    ``(w0, 2 w0, 4 w0)``) or ``widths`` (three widths); ``blocks_per_stage`` (n);
    ``gated`` (SLU on the identity-shortcut blocks); ``slu_alpha`` (eq. 1's alpha, also the
    attribute ``alpha``); ``target_skip`` (the hinge, see the module docstring); ``seed``;
    ``layer_wrapper(name, layer) -> layer`` applied to every Conv2d/Dense as it is built (not
    to the gates); ``input_size`` (H, W) for :meth:`layer_specs` before any forward; ``dtype``
    (float32; float64 for gradient checks).

    After a forward: ``executed`` {layer name: samples it ran on} (the backward runs on the
    same samples), ``skip_ratio`` (fraction of gated-block MACs skipped), ``slu_cost`` (C),
    ``gate_executed`` {block: executed fraction}, ``gate_probs`` {block: p (N,)}.
    ``decision_override`` (None or a bool array ``(N, n_gates)``) fixes the decisions (tests,
    ablations such as stochastic depth).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, w0: int = 8,
                 blocks_per_stage: int = 2, gated: bool = False, slu_alpha: float = 0.1,
                 target_skip: float = 0.5, seed: int | None = 0,
                 layer_wrapper: LayerWrapper | None = None, widths: Sequence[int] | None = None,
                 input_size: int | tuple[int, int] | None = None, dtype=np.float32,
                 gate_init_bias: float = 2.5):
        if widths is None:
            widths = (w0, 2 * w0, 4 * w0)
        widths = tuple(int(w) for w in widths)
        if len(widths) != 3 or min(widths) < 1:
            raise ValueError(f"widths must be three positive channel counts, got {widths}")
        if blocks_per_stage < 0:
            raise ValueError(f"blocks_per_stage must be >= 0, got {blocks_per_stage}")
        if not 0.0 <= target_skip <= 1.0:
            raise ValueError(f"target_skip must be in [0, 1], got {target_skip}")
        if slu_alpha < 0:
            raise ValueError(f"slu_alpha must be >= 0, got {slu_alpha}")
        self.in_channels, self.num_classes, self.widths = in_channels, num_classes, widths
        self.blocks_per_stage = blocks_per_stage
        self.dtype = np.dtype(dtype)
        self.slu_alpha, self.target_skip = float(slu_alpha), float(target_skip)
        self.input_size = (input_size, input_size) if isinstance(input_size, int) else input_size
        self._layer_wrapper = layer_wrapper
        self._seeds = np.random.default_rng(seed)
        self._weight_layers: dict[str, Layer] = {}
        self._layers: dict[str, Layer] = {}      # every layer with params/buffers, forward order

        self.stem_conv = self._conv("stem.conv", in_channels, widths[0], 3, 1, 1)
        self.stem_bn = self._bn("stem.bn", widths[0])
        self.stem_relu = ReLU()
        self.blocks: list[_Block] = []
        c = widths[0]
        for s, w in enumerate(widths):
            for b in range(blocks_per_stage):
                stride = 2 if (s > 0 and b == 0) else 1
                blk = _Block(f"s{s + 1}.b{b}", s, c, w, stride, self._conv, self._bn)
                self.blocks.append(blk)
                c = w
        self.pool = GlobalAvgPool2d()
        self.fc = self._dense("fc", c, num_classes)

        self.gated = bool(gated)
        self.gated_blocks: list[str] = []
        self.gates: RNNGates | None = None
        if self.gated:
            gateable = [blk for blk in self.blocks if not blk.projection]
            if not gateable:
                raise ValueError(
                    f"SLU gates residual blocks with an identity shortcut, and this ResNet has none "
                    f"(blocks_per_stage={blocks_per_stage}: only the stem and projection blocks); "
                    f"use blocks_per_stage >= 1 or gated=False")
            stage_ch = [0, 0, 0]
            for k, blk in enumerate(gateable):
                blk.gate_index = k
                stage_ch[blk.stage] = widths[blk.stage]
                self.gated_blocks.append(blk.name)
            self.gates = RNNGates(stage_ch, seed=int(self._seeds.integers(2**31)), dtype=self.dtype,
                                  init_bias=gate_init_bias)

        self.decision_override: np.ndarray | None = None
        self.executed: dict[str, int] = {}
        self.skip_ratio = 0.0
        self.slu_cost: float | None = None
        self.gate_executed: dict[str, float] = {}
        self.gate_probs: dict[str, np.ndarray] = {}
        self._last_hw: tuple[int, int] | None = None
        self._block_macs: dict[str, Any] | None = None     # MACs by block, and "_hw": (H, W)
        self._train_cache = None

    # ------------------------------------------------------------------------------ building

    def _gates(self) -> RNNGates:
        """The gates of a gated model."""
        if self.gates is None:
            raise RuntimeError("this ResNet has no gates (gated=False)")
        return self.gates

    def _seed(self) -> int:
        return int(self._seeds.integers(2**31))

    def _wrap(self, name: str, layer: Layer) -> Layer:
        if self._layer_wrapper is not None:
            layer = self._layer_wrapper(name, layer)
        self._weight_layers[name] = layer
        self._layers[name] = layer
        return layer

    def _conv(self, name, c_in, c_out, k, stride, pad):
        return self._wrap(name, Conv2d(c_in, c_out, k, stride=stride, padding=pad, bias=False,
                                       seed=self._seed(), dtype=self.dtype))

    def _dense(self, name, n_in, n_out):
        return self._wrap(name, Dense(n_in, n_out, seed=self._seed(), dtype=self.dtype))

    def _bn(self, name, c):
        layer = BatchNorm(c, dtype=self.dtype)
        self._layers[name] = layer
        return layer

    @property
    def alpha(self) -> float:
        return self.slu_alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.slu_alpha = float(value)

    @property
    def n_gates(self) -> int:
        return len(self.gated_blocks)

    # ------------------------------------------------------------------------------ passes

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype)
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"ResNet expects (N, {self.in_channels}, H, W) input, got {x.shape}")
        if self.input_size is not None and tuple(x.shape[2:]) != tuple(self.input_size):
            raise ValueError(f"this ResNet was built for {self.input_size[0]}x{self.input_size[1]} "
                             f"inputs (layer_specs depend on it), got {x.shape[2]}x{x.shape[3]}")
        n = x.shape[0]
        self._last_hw = (x.shape[2], x.shape[3])
        ex: dict[str, int] = {}
        h = self.stem_relu.forward(self.stem_bn.forward(self.stem_conv.forward(x, train), train), train)
        ex["stem.conv"] = ex["stem.bn"] = n
        probs, runs = [], []
        override = None
        if self.gated:
            self._gates().reset(n, train)
            override = self.decision_override
            if override is not None:
                override = np.asarray(override, dtype=bool)
                if override.shape != (n, self.n_gates):
                    raise ValueError(f"decision_override must be ({n}, {self.n_gates}) bools, "
                                     f"got {override.shape}")
        for blk in self.blocks:
            idx = None
            if blk.gate_index is not None:
                k = blk.gate_index
                p = self._gates().step(blk.stage, h.mean(axis=(2, 3)))
                run = override[:, k] if override is not None else p >= 0.5
                ex[f"{blk.name}.gate"] = n
                probs.append(p)
                runs.append(run)
                idx = None if run.all() else np.flatnonzero(run)
            h = blk.forward(h, train, idx, ex)
        logits = self.fc.forward(self.pool.forward(h, train), train)
        ex["fc"] = n
        self.executed = ex
        if self.gated:
            self._gate_stats(probs, runs)
            if self._gates().num_params():
                ex["gates"] = n
        self._train_cache = (probs, runs) if train else None
        return logits

    def _block_flops(self) -> np.ndarray:
        """MACs per sample of each gated block (conv1 + conv2), in gate order."""
        if self._block_macs is None or self._block_macs.get("_hw") != self._last_hw:
            specs = {s["name"]: s for s in self.layer_specs(self._last_hw)}
            self._block_macs = {"_hw": self._last_hw}
            for name in self.gated_blocks:
                self._block_macs[name] = specs[f"{name}.conv1"]["macs"] + specs[f"{name}.conv2"]["macs"]
        return np.array([self._block_macs[b] for b in self.gated_blocks], dtype=np.float64)

    def _gate_stats(self, probs, runs) -> None:
        flops = self._block_flops()
        w = flops / flops.sum()
        P = np.stack(probs, axis=1).astype(np.float64)                 # (N, G)
        R = np.stack(runs, axis=1)
        frac = R.mean(axis=0)
        self.slu_cost = float((P @ w).mean())
        self.skip_ratio = float(1.0 - frac @ w)
        self.gate_executed = dict(zip(self.gated_blocks, frac.tolist()))
        self.gate_probs = dict(zip(self.gated_blocks, probs))
        self._cost_weights = w

    def regularizer_sign(self) -> int:
        """Direction of the regularizer's push for the last batch: +1 (eq. 1: close gates)
        while the realised skip ratio is below ``target_skip``, -1 (open gates) while it is
        above, 0 at the target or with ``slu_alpha == 0``. ``target_skip >= 1``: always +1."""
        if self.slu_alpha == 0 or not self.gated:
            return 0
        if self.target_skip >= 1.0 or self.skip_ratio < self.target_skip:
            return 1
        return -1 if self.skip_ratio > self.target_skip else 0

    def backward(self, dlogits: np.ndarray) -> np.ndarray:
        """Backpropagates ``dL/dlogits``; adds into every executed layer's grads and the gates'.
        Returns ``dL/dx`` (through the main network only)."""
        if self._train_cache is None:
            raise RuntimeError("ResNet.backward needs a preceding forward(x, train=True)")
        dlogits = np.asarray(dlogits, dtype=self.dtype)
        d = self.pool.backward(self.fc.backward(dlogits))
        dps: list[np.ndarray | None] = [None] * self.n_gates
        for blk in reversed(self.blocks):
            d, dp = blk.backward(d)
            if blk.gate_index is not None:
                dps[blk.gate_index] = dp
        d = self.stem_conv.backward(self.stem_bn.backward(self.stem_relu.backward(d)))
        if self.gated:
            n = dlogits.shape[0]
            sign = self.regularizer_sign()
            if sign:
                # d(alpha * C)/dp_{n,b} = alpha * FLOPs_b / FLOPs_all / N, pushing p down
                # (sign +1, eq. 1) or, past the target, up (sign -1, the anti-collapse arm).
                reg = (sign * self.slu_alpha / n) * self._cost_weights
                dps = [dp + reg[b].astype(self.dtype) for b, dp in enumerate(dps)]
            self._gates().backward(cast("list[np.ndarray]", dps))   # each gated block gave its dp
        return d

    def __call__(self, x, train=True):
        return self.forward(x, train)

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Eval-mode logits, ``batch_size`` samples at a time (gates decide dynamically)."""
        outs = [self.forward(x[i:i + batch_size], train=False) for i in range(0, len(x), batch_size)]
        return np.concatenate(outs, axis=0)

    # ------------------------------------------------------------------------------ parameters

    def _param_layers(self) -> Iterator[tuple[str, Layer]]:
        yield from self._layers.items()
        if self.gates is not None:
            yield "gates", self.gates

    def parameters(self) -> Iterator[Param]:
        """Param handles keyed ``"<layer>.<param>"``: ``"s1.b0.conv1.weight"``,
        ``"stem.bn.gamma"``, ``"fc.bias"``, ``"gates.lstm.w_ih"``. Wrapped weight layers yield
        handles on the wrapper (which shares the inner layer's dicts)."""
        for name, layer in self._param_layers():
            yield from layer.parameters(f"{name}.")

    def zero_grad(self) -> None:
        for _, layer in self._param_layers():
            layer.zero_grad()

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        for name, layer in self._param_layers():
            yield from layer.named_buffers(f"{name}.")

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of all parameters (gates included) and BN running statistics."""
        return collect_state(self)

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        restore_state(self, state)

    def weight_layers(self) -> dict[str, Layer]:
        """Conv2d/Dense layers of the main network by name (wrapped ones as wrapped)."""
        return dict(self._weight_layers)

    # ------------------------------------------------------------------------------ counting

    def layer_specs(self, input_size: int | tuple[int, int] | None = None) -> list[dict]:
        """What each layer costs per sample, in forward order, for the energy model.

        Dicts with ``name``; ``kind`` ("conv", "dense", "bn", "gate"); ``macs`` (forward MACs
        per sample; 0 for BN); ``in_elems``/``out_elems`` (activations per sample);
        ``weight_elems`` (learnable parameters); ``block`` (the gated block it belongs to, or
        None). Gates: one "gate" entry per gated block (``<block>.gate``: GAP, projection, LSTM
        step, output; its parameters are shared and listed once, in the entry ``gates`` with
        ``macs`` 0). Spatial sizes come from ``input_size``, else the constructor's, else the
        last forward.
        """
        hw = input_size if input_size is not None else (self.input_size or self._last_hw)
        if hw is None:
            raise ValueError("layer_specs needs the input size: pass input_size=(H, W) here or to "
                             "ResNet(...), or run a forward first")
        h, w = (hw, hw) if isinstance(hw, int) else tuple(hw)
        specs: list[dict] = []

        def conv_spec(name, h, w, block):
            conv = cast(Conv2d, _inner(self._weight_layers[name]))
            ho, wo = conv.output_shape(h, w)
            kh, kw = conv.kernel_size
            specs.append({"name": name, "kind": "conv", "block": block,
                          "macs": conv.c_out * ho * wo * conv.c_in * kh * kw,
                          "in_elems": conv.c_in * h * w, "out_elems": conv.c_out * ho * wo,
                          "weight_elems": int(conv.params["weight"].size)})
            return conv.c_out, ho, wo

        def bn_spec(name, c, h, w, block):
            specs.append({"name": name, "kind": "bn", "block": block, "macs": 0,
                          "in_elems": c * h * w, "out_elems": c * h * w, "weight_elems": 2 * c})

        c, h, w = conv_spec("stem.conv", h, w, None)
        bn_spec("stem.bn", c, h, w, None)
        for blk in self.blocks:
            gb = blk.name if blk.gate_index is not None else None
            if gb is not None:
                specs.append({"name": f"{blk.name}.gate", "kind": "gate", "block": gb,
                              "macs": self._gates().step_macs(c, h * w), "in_elems": c * h * w,
                              "out_elems": 1, "weight_elems": 0})
            h_in, w_in = h, w
            c, h, w = conv_spec(f"{blk.name}.conv1", h_in, w_in, gb)
            bn_spec(f"{blk.name}.bn1", c, h, w, gb)
            conv_spec(f"{blk.name}.conv2", h, w, gb)
            bn_spec(f"{blk.name}.bn2", c, h, w, gb)
            if blk.projection:
                conv_spec(f"{blk.name}.short.conv", h_in, w_in, gb)
                bn_spec(f"{blk.name}.short.bn", c, h, w, gb)
        fc = cast(Dense, _inner(self.fc))
        specs.append({"name": "fc", "kind": "dense", "block": None, "macs": fc.n_in * fc.n_out,
                      "in_elems": fc.n_in, "out_elems": fc.n_out,
                      "weight_elems": sum(int(v.size) for v in fc.params.values())})
        if self.gates is not None and self.gates.num_params():
            specs.append({"name": "gates", "kind": "gate", "block": None, "macs": 0, "in_elems": 0,
                          "out_elems": 0, "weight_elems": self.gates.num_params()})
        return specs

    def __repr__(self):
        depth = 6 * self.blocks_per_stage + 2
        return (f"ResNet-{depth}(widths={self.widths}, in={self.in_channels}, classes={self.num_classes}, "
                f"gated={self.gated}, gates={self.n_gates})")
