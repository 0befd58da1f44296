"""The tensorized network of the TT paper and its float and low-precision (BinaryConnect) training.

Two TT layers (896 = 7x4x2x16 -> 512 = 4x4x2x16 -> 16 = 1x16), ReLU between, 10 classes padded to
16 outputs: the paper's shapes for FashionMNIST; :mod:`.network` chooses them for any dataset. Contractions run through the PE op schedule; the rest is the processor's work, as on the
board: bias, ReLU, loss, the straight-through estimator, the factor and lambda updates, pruning.

Low precision (``quantized=True``), section 3.2-3.3 of the paper:

* BinaryConnect: the processor keeps float shadow factors; the contractions use their 4-bit
  quantization (a fixed power-of-2 scale per core, chosen at initialization); gradients with respect
  to the quantized factors update the shadows (straight-through), which are clipped to the 4-bit range;
* layer inputs are 8-bit activations, biases 8-bit, gradients 16-bit; each activation, gradient and
  intermediate tensor has a power-of-2 scale that keeps its mean |x| in [0.1, 0.3] of its unit
  (Q1.6 for activations, Q4.11 for 16-bit words: :func:`insitu.numerics.tt_autoscale`);
* the contractions are the fixed-point golden model of the PEs (:class:`FixedExecutor`).
"""

from __future__ import annotations


import numpy as np

from insitu.nn.layers import Layer
from insitu.numerics import (TT_BIAS, TT_FACTOR_BITS, AutoScale, tt_autoscale, tt_factor_format,
                             tt_factor_frac)

from .execute import FixedExecutor
from .prior import prior_grads, prior_value, ranks_to_keep, update_lambdas
from .schedule import (factor_grad_ops, forward_ops, grad_buffer, input_grad_ops, is_count,
                       weight_grad_op)
from .ttm import TTMatrix, he_core_std

#: The paper's network (appendix B): modes of each TT layer, input padded to 28 x 32.
PAPER_LAYERS = (((7, 4, 2, 16), (4, 4, 2, 16)), ((32, 16), (1, 16)))
PADDED_IMAGE = (28, 32)
#: The tensors the processor quantizes, by name, and their kind of scale (numerics.tt_autoscale).
PROCESSOR_TENSORS = {"x": "activation",     # layer inputs: 8 bits
                     "dy": "pe"}            # output gradients: 16-bit PE words
FLOAT_BITS = 32


def pad_images(x: np.ndarray, shape=(28, 28), padded=PADDED_IMAGE) -> np.ndarray:
    """``(N, 784)`` or ``(N, 28, 28)`` images -> ``(N, 896)``: zero columns on the right (28 x 32)."""
    x = np.asarray(x)
    n = x.shape[0]
    try:
        images = x.reshape(n, *shape)
    except ValueError:
        raise ValueError(f"expected {shape[0]}x{shape[1]} images, got samples of shape {x.shape[1:]}") from None
    out = np.zeros((n, *padded), dtype=np.float64)
    out[:, :shape[0], :shape[1]] = images
    return out.reshape(n, -1)


class TTNet(Layer):
    """A stack of TT layers with ReLU between them; params ``l{k}.g{n}`` (cores) and ``l{k}.bias``."""

    def __init__(self, layers=PAPER_LAYERS, rank: int = 16, *, classes: int = 10,
                 quantized: bool = False, seed: int = 0, executor: FixedExecutor | None = None):
        super().__init__()
        if not is_count(rank):
            raise ValueError(f"TT rank must be an integer >= 1, got {rank!r}")
        rng = np.random.default_rng(seed)
        self.ttms = [TTMatrix(i, o, rank, seed=int(rng.integers(2**31))) for i, o in layers]
        for prev, nxt in zip(self.ttms, self.ttms[1:]):
            if prev.shape[0] != nxt.shape[1]:
                raise ValueError(f"layer sizes do not chain: {prev.shape[0]} outputs feed {nxt.shape[1]} inputs")
        if not 1 <= classes <= self.ttms[-1].shape[0]:
            raise ValueError(f"{classes} classes do not fit the {self.ttms[-1].shape[0]} outputs")
        self.classes = classes
        self.biases = [np.zeros(t.shape[0]) for t in self.ttms]
        self.quantized = quantized
        # The PE ops' executor: the golden model here, the accelerator on a board (its subclass).
        self.executor = (executor or FixedExecutor()) if quantized else None
        # One fixed 4-bit scale per layer: its cores are drawn with one standard deviation.
        self.core_fracs = [[tt_factor_frac(he_core_std(t.in_modes, t.ranks))] * t.d for t in self.ttms]
        self.act_scales: dict[str, AutoScale] = {}
        self.lambdas = [update_lambdas(t.cores) for t in self.ttms]
        self.sync_params()

    # ------------------------------------------------------------------ parameters
    def sync_params(self) -> None:
        self.params, self.grads = {}, {}
        for k, (ttm, bias) in enumerate(zip(self.ttms, self.biases)):
            for n, core in enumerate(ttm.cores):
                self._add_param(f"l{k}.g{n + 1}", core)
            self._add_param(f"l{k}.bias", bias)

    @property
    def ranks(self) -> list[list[int]]:
        return [list(t.ranks) for t in self.ttms]

    @property
    def factor_count(self) -> int:
        return sum(t.parameter_count for t in self.ttms)

    @property
    def parameter_count(self) -> int:
        """Factors plus biases (what the paper's Table 1 counts)."""
        return self.factor_count + sum(b.size for b in self.biases)

    @property
    def memory_bits(self) -> int:
        """Model memory: 4-bit factors and 8-bit biases, or 32-bit floats."""
        if self.quantized:
            return self.factor_count * TT_FACTOR_BITS + sum(b.size for b in self.biases) * TT_BIAS.bits
        return self.parameter_count * FLOAT_BITS

    def _factor_codes(self, k: int) -> list[np.ndarray]:
        return [tt_factor_format(f).quantize_code(c) for c, f in zip(self.ttms[k].cores, self.core_fracs[k])]

    # ------------------------------------------------------------------ activations
    def _quantize(self, layer: int, tensor: str, x: np.ndarray, observe: bool) -> tuple[np.ndarray, int]:
        """Codes of ``x`` at the tensor's current power-of-2 scale (set from ``x`` at first use)."""
        key = f"l{layer}.{tensor}"
        scale = self.act_scales.get(key)
        if scale is None:
            scale = self.act_scales[key] = tt_autoscale(PROCESSOR_TENSORS[tensor], key)
            scale.observe(x)
        fmt = scale.format
        codes = fmt.quantize_code(x)
        if observe:
            scale.observe(fmt.to_float(codes))
        return codes, fmt.frac

    def load_act_scales(self, fracs: dict) -> None:
        """Restore the activation/gradient scales saved from :attr:`act_scales` (``key -> frac``)."""
        self.act_scales = {key: tt_autoscale(PROCESSOR_TENSORS[key.split(".", 1)[1]], key, int(frac))
                           for key, frac in fracs.items()}

    def _run(self, k, ops, buffers, fracs, codes, observe):
        assert self.executor is not None        # a quantized network's (the only caller)
        ttm = self.ttms[k]
        for op in ops:
            self.executor.run(op, buffers, fracs, codes, self.core_fracs[k],
                              (ttm.out_modes, ttm.in_modes), prefix=f"l{k}.", observe=observe)

    # ------------------------------------------------------------------ passes
    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """Logits ``(N, classes)`` of ``(N, 896)`` padded inputs.

        ``train=False`` caches nothing and leaves every scale as it is (a scale that does not exist
        yet, before the first training step, is still fitted to what this call sees).
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.ttms[0].shape[1]:
            raise ValueError(f"inputs must be (N, {self.ttms[0].shape[1]}); got {x.shape} "
                             "(lay samples out with network.TTShape.vectors; 28x28 images: pad_images)")
        cache = []
        a = x
        for k, (ttm, bias) in enumerate(zip(self.ttms, self.biases)):
            if self.quantized:
                codes, frac = self._quantize(k, "x", a, observe=train)
                buffers, fracs = {"x": codes.ravel()}, {"x": frac}
                self._run(k, forward_ops(ttm.in_modes, ttm.out_modes, ttm.ranks, len(a)), buffers, fracs,
                          self._factor_codes(k), observe=train)
                # The processor's bias add: a 16-bit word plus a Q1.6 bias is exact in float64;
                # the sum is rounded once, by the next layer's 8-bit activation format.
                h = np.ldexp(buffers["y"], -fracs["y"]).reshape(len(a), -1) + TT_BIAS.quantize(bias)
                cache.append((buffers["x"], frac))
            else:
                h = ttm.forward(a) + bias
                cache.append(a)
            a = np.maximum(h, 0.0) if k < len(self.ttms) - 1 else h
            if k < len(self.ttms) - 1:
                cache.append(h > 0)
        if train:
            self._cache = cache
        return a[:, :self.classes]

    # The whole network, not a layer in one: its backward takes the logits' gradient and returns
    # nothing (no layer below it wants dx).
    def backward(self, dlogits: np.ndarray) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Gradients of every core and bias into ``self.grads`` (replacing them)."""
        cache = self._saved()
        n = dlogits.shape[0]
        dy = np.zeros((n, self.ttms[-1].shape[0]))
        dy[:, :self.classes] = dlogits
        for k in range(len(self.ttms) - 1, -1, -1):
            ttm = self.ttms[k]
            x_saved = cache[2 * k]
            if self.quantized:
                dy_codes, dy_frac = self._quantize(k, "dy", dy, observe=True)
                x_codes, x_frac = x_saved
                buffers, fracs = {"dy": dy_codes.ravel(), "x": x_codes}, {"dy": dy_frac, "x": x_frac}
                ops = input_grad_ops(ttm.in_modes, ttm.out_modes, ttm.ranks, n) if k else []
                ops += [weight_grad_op(ttm.in_modes, ttm.out_modes, n),
                        *factor_grad_ops(ttm.in_modes, ttm.out_modes, ttm.ranks)]
                self._run(k, ops, buffers, fracs, self._factor_codes(k), observe=True)
                core_grads = [np.ldexp(buffers[grad_buffer(i, ttm.d)], -fracs[grad_buffer(i, ttm.d)])
                              for i in range(ttm.d)]
                bias_grad = np.ldexp(dy_codes, -dy_frac).sum(axis=0)
                dx = np.ldexp(buffers["dx"], -fracs["dx"]).reshape(n, -1) if k else None
            else:
                core_grads = ttm.factor_grads(x_saved, dy)
                bias_grad = dy.sum(axis=0)
                dx = ttm.backward_input(dy) if k else None
            for i, g in enumerate(core_grads):
                self.grads[f"l{k}.g{i + 1}"][...] = g.reshape(ttm.cores[i].shape)
            self.grads[f"l{k}.bias"][...] = bias_grad
            if k:
                dy = dx * cache[2 * k - 1]          # ReLU: 1(h > 0) dL/dy
        self._cache = None

    # ------------------------------------------------------------------ the processor's updates
    def prior(self) -> float:
        """Eq. 2 summed over the layers."""
        return sum(prior_value(t.cores, lam) for t, lam in zip(self.ttms, self.lambdas))

    def add_prior_grads(self, weight: float) -> None:
        """``grads += weight * dg/dG`` (weight: 1 / training-set size, see :mod:`.prior`)."""
        for k, (ttm, lam) in enumerate(zip(self.ttms, self.lambdas)):
            for n, g in enumerate(prior_grads(ttm.cores, lam)):
                self.grads[f"l{k}.g{n + 1}"] += weight * g

    def after_step(self) -> None:
        """BinaryConnect clipping of the shadow factors and biases, then the lambda update (eq. 4)."""
        if self.quantized:
            for ttm, fracs in zip(self.ttms, self.core_fracs):
                for core, frac in zip(ttm.cores, fracs):
                    fmt = tt_factor_format(frac)
                    np.clip(core, fmt.min_value, fmt.max_value, out=core)
            for bias in self.biases:
                np.clip(bias, TT_BIAS.min_value, TT_BIAS.max_value, out=bias)
        self.lambdas = [update_lambdas(t.cores) for t in self.ttms]

    def prune(self, threshold: float, optimizer=None) -> int:
        """Remove rank slices whose lambda is below ``threshold`` x the core's largest; returns how
        many went. Optimizer moments (``optimizer.state``) are sliced alongside."""
        removed = 0
        for k, ttm in enumerate(self.ttms):
            # Decide every core's slices from this step's lambdas, then cut.
            keeps = [ranks_to_keep(lam, threshold) for lam in self.lambdas[k]]
            for n, keep in enumerate(keeps):
                if keep.size == ttm.cores[n].shape[3]:
                    continue
                removed += ttm.cores[n].shape[3] - keep.size
                for i, axis in ((n, 3), (n + 1, 0)):
                    key = f"l{k}.g{i + 1}"
                    ttm.cores[i] = np.ascontiguousarray(np.take(ttm.cores[i], keep, axis=axis))
                    if optimizer is not None and key in optimizer.state:
                        st = optimizer.state[key]
                        for name in st:
                            st[name] = np.ascontiguousarray(np.take(st[name], keep, axis=axis))
            self.lambdas[k] = update_lambdas(ttm.cores)
        if removed:
            self.sync_params()
        return removed
