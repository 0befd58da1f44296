"""Training the quantized network: offline pre-training, then online training sample by sample.

Online schemes (the LRT paper's figure 2):

* ``inference`` — no training at all (normalization statistics frozen too);
* ``bias``      — only the 1-D parameters (biases, normalization γ/β) at 16 b, every sample;
* ``sgd``       — 1-D parameters plus plain online SGD on the NVM weights. As in the paper, a
  convolution applies one update per output pixel; every update is rounded to the weight LSB,
  so contributions below half an LSB are lost (that is SGD's weakness the paper shows);
* ``lrt``       — 1-D parameters every sample; weights accumulate in a rank-r
  :class:`~insitu.lrt.sks.KroneckerSum` per layer (pseudo-batch B: 10 samples for convolutions,
  fed one pair per output pixel, 100 for dense layers) and are written only when an update would
  change at least ρ_min = 1 % of the layer's cells; otherwise accumulation continues, so the
  effective batch is a multiple of B;
* ``lrt-maxnorm`` — ``lrt`` with the paper's gradient max-norm on every applied update.

Learning rates follow the paper's square-root scaling: an update after an effective batch of
``B_eff`` samples is ``ΔW = -η·√B_eff·Ĝ`` with ``Ĝ`` the mean gradient ``L·Rᵀ / B_eff`` (or its
max-normed form), rounded to the weight LSB; SGD is the same rule with ``B_eff = 1``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from insitu import nn
from insitu.checkpoint import load_checkpoint, save_checkpoint
from insitu.lrt import SCHEMES
from insitu.lrt.maxnorm import MaxNorm
from insitu.lrt.nvm import NVMArray, NVMModel
from insitu.lrt.qnet import QNet, QNormalize
from insitu.lrt.sks import KroneckerSum
from insitu.nn.functional import log_softmax, softmax
from insitu.numerics import LRT_BIAS, LRT_GRADIENT, round_half_up

__all__ = ["SCHEMES", "LRTConfig", "OnlineTrainer", "check_rank", "learning_rate", "loss_gradient", "pretrain",
           "evaluate"]



@dataclass
class LRTConfig:
    lr: float = 0.01
    bias_lr: float = 0.01
    rank: int = 4
    conv_batch: int = 10
    dense_batch: int = 100
    rho_min: float = 0.01
    kappa_th: float | None = 100.0
    unbiased: bool = True
    factor_bits: int | None = 16

    def validate(self) -> None:
        for name in ("lr", "bias_lr"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name in ("rank", "conv_batch", "dense_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.kappa_th is not None and not (np.isfinite(self.kappa_th) and self.kappa_th > 0):
            raise ValueError(f"kappa_th must be a positive number or None, got {self.kappa_th!r}")
        if not 0 <= self.rho_min <= 1:
            raise ValueError(f"rho_min must be in [0, 1], got {self.rho_min!r}")


def check_rank(net: QNet, rank: int) -> None:
    """A clear error when ``rank`` is too large for one of the network's layers."""
    for layer in net.weight_layers:
        n_out, n_in = layer.weight_matrix.shape
        if rank >= min(n_out, n_in):
            classes = (f"; its {n_out} outputs are the dataset's classes"
                       if layer is net.weight_layers[-1] and n_out <= n_in else "")
            raise ValueError(f"rank {rank} is too large for layer {layer.name} "
                             f"({n_out} x {n_in}): it must be < {min(n_out, n_in)}{classes}")


def loss_gradient(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-sample softmax cross-entropy gradient ``p - onehot`` (in [-1, 1]), quantized by Qg."""
    p = softmax(logits, axis=1)
    p[np.arange(len(labels)), labels] -= 1.0
    return LRT_GRADIENT.quantize(p)


def cross_entropy(logits: np.ndarray, label: int) -> float:
    """One sample's softmax cross-entropy, from its logits (``(classes,)``)."""
    return float(-log_softmax(logits)[label])


def evaluate(net: QNet, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(net.predict(x), axis=1) == y))


# ------------------------------------------------------------------------------ pre-training

def learning_rate(step: int, total: int, lr: float, warmup: int = 0, schedule: str = "cosine") -> float:
    """The pre-training learning rate at optimizer step ``step`` of ``total``: a linear warm-up over
    the first ``warmup`` steps, then ``lr`` (``"constant"``) or a cosine decay to 0 (``"cosine"``)."""
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    return 0.5 * lr * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def _centred_bn_backward(bn):
    """The batch-norm backward that differentiates through the statistics (pre-training only).

    The streaming batch norm's own backward treats its statistics as constants (what a device can
    afford, sample by sample). Offline, with batches, that gradient pushes every channel's mean and
    scale before the norm along with β and γ; the norm cancels them in the forward pass, so nothing
    holds them back: they drift until the 16-b accumulator saturates at ±8 (measured: 18–20 % of
    fc1's outputs after two epochs, and the loss rising again at η = 0.02–0.05). Projecting out the
    mean and ``x̂`` directions (the standard batch-norm gradient) removes the drift; the forward pass
    stays the streaming norm as deployed.
    """
    def backward(dy):
        xhat, inv_std = bn._saved()
        bn._affine_grads(dy, xhat)
        axes = (0,) if dy.ndim == 2 else (0, 2, 3)
        gamma = bn.params["gamma"]
        d = dy * (gamma[:, None, None] if dy.ndim == 4 else gamma)
        d = d - d.mean(axis=axes, keepdims=True) - xhat * (d * xhat).mean(axis=axes, keepdims=True)
        return d * inv_std           # per sample and channel, already broadcastable
    return backward


def pretrain(net: QNet, x: np.ndarray | Callable[[int], tuple], y: np.ndarray | None = None,
             epochs: int = 1, lr: float = 0.01, batch: int = 32, momentum: float = 0.9,
             seed: int = 0, advance=lambda n: None, *,
             warmup: float = 0.0, schedule: str = "cosine", clip: float | None = None,
             centred_bn: bool = True, checkpoint=None, checkpoint_key=None,
             on_epoch=lambda epoch, record: None) -> list[dict]:
    """Offline quantization-aware pre-training (the model a device is shipped with).

    Float shadow copies of every parameter take the SGD steps (momentum, the learning rate of
    :func:`learning_rate` with ``warmup`` in epochs, the weight gradients clipped to a global
    norm ``clip``); the network always computes with their quantized values (straight-through
    estimator, gradients quantized by Qg as on the device), so the result is a valid NVM image.
    The streaming batch norms normalize as deployed; ``centred_bn`` differentiates through their
    statistics (:func:`_centred_bn_backward`).

    ``x`` and ``y``: the training set of every epoch, or ``x`` a function ``epoch -> (x, y)`` (a
    fresh window of an augmented stream per epoch) and ``y`` None. ``checkpoint``: a path the
    whole training state is saved to atomically after every epoch but the last (the caller
    keeps the trained network) and resumed from when it
    exists and its ``checkpoint_key`` matches (it is left in place; delete it when done).
    Returns one record per epoch: ``{"epoch", "loss", "lr", "seconds"}``.
    """
    if callable(x):
        epoch_data = x
    elif y is None:
        raise ValueError("pretrain: the training set x needs its labels y")
    else:
        epoch_data = lambda epoch: (x, y)  # noqa: E731
    layers = net.weight_layers
    shadows = {l.name: l.weight.copy() for l in layers}
    velocity = {k: np.zeros_like(v) for k, v in shadows.items()}
    one_d = {key: (value, value.copy(), np.zeros_like(value)) for key, value, _ in net.one_d_params()}
    history, first = [], 0
    if checkpoint is not None and Path(checkpoint).exists():
        arrays, meta = load_checkpoint(checkpoint)
        if meta.get("key") == checkpoint_key:
            net.load_state_dict({k[4:]: v for k, v in arrays.items() if k.startswith("net/")})
            for name in shadows:
                shadows[name][...] = arrays[f"shadow/{name}"]
                velocity[name][...] = arrays[f"velocity/{name}"]
            for key, (_, shadow, vel) in one_d.items():
                shadow[...] = arrays[f"shadow/{key}"]
                vel[...] = arrays[f"velocity/{key}"]
            history, first = meta["history"], int(meta["epoch"])
    norms = [s for s in net.stages if isinstance(s, QNormalize)]
    for layer in layers:
        layer.core.compute_weight_grad = True
    if centred_bn:
        for stage in norms:
            stage.backward = _centred_bn_backward(stage.bn)
    try:
        for epoch in range(first, epochs):
            started = time.perf_counter()
            xe, ye = epoch_data(epoch)
            per_epoch = -(-len(xe) // batch)
            step, total, warm = epoch * per_epoch, epochs * per_epoch, round(warmup * per_epoch)
            order = np.random.default_rng([seed, epoch]).permutation(len(xe))
            loss_sum, rate = 0.0, lr
            for start in range(0, len(xe), batch):
                idx = order[start:start + batch]
                for layer in layers:
                    layer.core.zero_grad()
                net.zero_grad()
                logits = net.forward(np.asarray(xe[idx], dtype=np.float64), train=True)
                p = softmax(logits, axis=1)
                loss_sum += float(-np.log(np.maximum(p[np.arange(len(idx)), ye[idx]], 1e-12)).sum())
                net.backward(loss_gradient(logits, ye[idx]))
                rate = learning_rate(step, total, lr, warm, schedule)
                step += 1
                scale = 1.0 / len(idx)
                if clip is not None:
                    norm = math.sqrt(sum(float(np.sum(l.core.grads["weight"] ** 2)) for l in layers))
                    scale *= min(1.0, clip / max(norm * scale, 1e-30))
                for layer in layers:
                    v = velocity[layer.name]
                    v *= momentum
                    v += scale * layer.core.grads["weight"]
                    shadow = shadows[layer.name]
                    shadow -= rate * v
                    np.clip(shadow, -1.0, 1.0, out=shadow)
                    layer.weight[...] = layer.weight_format.quantize(shadow)
                for key, value, grad in net.one_d_params():
                    target, shadow, vel = one_d[key]
                    vel *= momentum
                    vel += grad / len(idx)
                    shadow -= rate * vel
                    np.clip(shadow, LRT_BIAS.min_value, LRT_BIAS.max_value, out=shadow)
                    value[...] = LRT_BIAS.quantize(shadow)
                advance(len(idx))
            record = {"epoch": epoch + 1, "loss": round(loss_sum / len(xe), 4), "lr": rate,
                      "seconds": round(time.perf_counter() - started, 1)}
            on_epoch(epoch + 1, record)
            history.append(record)
            if checkpoint is not None and epoch + 1 < epochs:
                arrays = {f"net/{k}": v for k, v in net.state_dict().items()}
                arrays.update({f"shadow/{k}": v for k, v in shadows.items()})
                arrays.update({f"velocity/{k}": v for k, v in velocity.items()})
                arrays.update({f"shadow/{k}": s for k, (_, s, _) in one_d.items()})
                arrays.update({f"velocity/{k}": v for k, (_, _, v) in one_d.items()})
                save_checkpoint(checkpoint, arrays,
                                {"key": checkpoint_key, "epoch": epoch + 1, "history": history})
    finally:
        for layer in layers:
            layer.core.compute_weight_grad = False
        for stage in norms:
            stage.__dict__.pop("backward", None)
    return history


# ----------------------------------------------------------------------------- online training

class _LayerLRT:
    """Per-layer state of low-rank training: the estimator, the pseudo-batch count, max-norm."""

    def __init__(self, layer, config: LRTConfig, batch: int, seed: int, maxnorm: bool):
        n_out, n_in = layer.weight_matrix.shape
        self.sks = KroneckerSum(n_out, n_in, config.rank, unbiased=config.unbiased, seed=seed,
                                kappa_th=config.kappa_th, factor_bits=config.factor_bits)
        self.batch = batch
        self.samples = 0                    # samples accumulated since the last weight write
        self.maxnorm = MaxNorm() if maxnorm else None
        self.updates = 0                    # weight writes applied
        self.attempts = 0                   # pseudo-batches that ended (written or not)


class OnlineTrainer:
    """One online-learning device: predict a sample, get its label, learn from it."""

    def __init__(self, net: QNet, scheme: str, config: LRTConfig | None = None,
                 nvm: NVMModel | None = None, seed: int = 0):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
        self.config = config or LRTConfig()
        self.config.validate()
        self.net, self.scheme = net, scheme
        self.nvm = nvm if nvm is not None else NVMModel()   # an empty model is falsy
        self.arrays = {}
        for layer in net.weight_layers:
            self.arrays[layer.name] = NVMArray(layer.name, layer.weight_format, layer.weight)
            self.nvm.add(self.arrays[layer.name])
        maxnorm = scheme == "lrt-maxnorm"
        self.bias_norms = {key: MaxNorm() for key, _, _ in net.one_d_params()} if maxnorm else {}
        self.lrt = {}
        if scheme in ("lrt", "lrt-maxnorm"):
            check_rank(net, self.config.rank)
            for i, layer in enumerate(net.weight_layers):
                conv = isinstance(layer.core, nn.Conv2d)
                batch = self.config.conv_batch if conv else self.config.dense_batch
                self.lrt[layer.name] = _LayerLRT(layer, self.config, batch, seed * 1000 + i, maxnorm)
        self.samples = 0
        self.last_loss = 0.0                # the cross-entropy of the last sample, before learning
        self.last_losses = np.zeros(0)      # those of the samples of the last train()

    # -- one sample --------------------------------------------------------------------------
    def step(self, x: np.ndarray, label: int) -> bool:
        """Predict sample ``x`` (shape ``(1, ...)``), learn from ``label``; True if predicted right."""
        if np.shape(x)[:1] != (1,):
            raise ValueError(f"OnlineTrainer.step takes one sample at a time: x must have shape "
                             f"(1, ...), got {np.shape(x)}")
        if not np.isfinite(x).all():
            raise ValueError("OnlineTrainer.step: x contains NaN or inf")
        classes = self.net.weight_layers[-1].weight_matrix.shape[0]
        if not 0 <= label < classes:
            raise ValueError(f"OnlineTrainer.step: label must be in [0, {classes}), got {label}")
        if self.scheme == "inference":
            for layer in self.net.weight_layers:
                self.arrays[layer.name].read()
            logits = self.net.forward(x, train=False)
            self.last_loss = cross_entropy(logits[0], label)
            self.samples += 1
            return bool(np.argmax(logits[0]) == label)
        self.net.zero_grad()
        logits = self.net.forward(x, train=True)
        for layer in self.net.weight_layers:
            self.arrays[layer.name].read()
        correct = bool(np.argmax(logits[0]) == label)
        self.last_loss = cross_entropy(logits[0], label)
        self.net.backward(loss_gradient(logits, np.array([label])))
        self._update_one_d()
        if self.scheme == "sgd":
            for layer in self.net.weight_layers:
                self._sgd_pixels(layer)
        elif self.lrt:
            for layer in self.net.weight_layers:
                self._lrt_accumulate(layer)
        self.samples += 1
        return correct

    def train(self, x: np.ndarray, y: np.ndarray, after_each=lambda i, correct: None) -> np.ndarray:
        """Samples ``x`` (``(N, ...)``) one at a time, ``after_each(i, correct)`` after each (the
        drift of the weight cells, say); returns whether each was predicted right. Their losses
        (each sample's cross-entropy before it was learnt) are left in :attr:`last_losses`."""
        right = np.zeros(len(y), bool)
        self.last_losses = np.zeros(len(y))
        for i in range(len(y)):
            right[i] = self.step(x[i:i + 1], int(y[i]))
            self.last_losses[i] = self.last_loss
            after_each(i, bool(right[i]))
        return right

    def _update_one_d(self) -> None:
        lr = self.config.bias_lr
        for key, value, grad in self.net.one_d_params():
            g = self.bias_norms[key](grad) if key in self.bias_norms else grad
            value[...] = LRT_BIAS.quantize(value - lr * g)

    def _sgd_pixels(self, layer) -> None:
        """Plain SGD: every Kronecker pair (pixel) is one rounded update of the weight cells."""
        dz, a = layer.kronecker_pairs()
        dz, a = dz[0], a[0]                                   # one sample: (P, n_out), (P, n_in)
        live = np.flatnonzero(np.any(dz != 0, axis=1))
        if live.size == 0:
            return
        fmt = layer.weight_format
        # Δcode of pixel p = round(-η·dz_p ⊗ a_p / LSB); the weight is a grid value, so rounding
        # the step equals rounding the updated weight (saturation is handled by the NVM array).
        steps = round_half_up(np.einsum("po,pi->poi", dz[live], a[live])
                              * (-self.config.lr * 2.0 ** fmt.frac))
        self.arrays[layer.name].apply_sequence(steps)

    def _lrt_accumulate(self, layer) -> None:
        state = self.lrt[layer.name]
        dz, a = layer.kronecker_pairs()
        state.sks.add_many(dz.reshape(-1, dz.shape[-1]), a.reshape(-1, a.shape[-1]))
        state.samples += 1
        if state.samples % state.batch:
            return
        state.attempts += 1
        L, R = state.sks.factors()
        mean_grad = (L @ R.T) / state.samples
        norm = state.maxnorm
        direction = norm.peek(mean_grad) if norm is not None else mean_grad
        fmt = layer.weight_format
        step = -self.config.lr * math.sqrt(state.samples) * direction
        codes = round_half_up(step * 2.0 ** fmt.frac).reshape(layer.weight.shape)
        stored = self.arrays[layer.name].codes()
        changed = np.count_nonzero(fmt.saturate(stored + codes) != stored)
        if changed < self.config.rho_min * codes.size:
            return                  # too sparse: keep accumulating (the effective batch grows)
        if norm is not None:
            norm(mean_grad)         # the update happens: commit the max-norm state
        self.arrays[layer.name].apply_delta(codes)
        state.sks.reset()
        state.samples = 0
        state.updates += 1

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything needed to resume: ``(arrays, meta)`` for :func:`insitu.checkpoint.save_checkpoint`."""
        arrays = {f"net/{k}": v for k, v in self.net.state_dict().items()}
        meta = {"samples": self.samples, "nvm": {}, "lrt": {}, "bias_norms": {}}
        for name, arr in self.arrays.items():
            arrays[f"writes/{name}"] = arr.writes.copy()
            meta["nvm"][name] = {"reads": arr.reads, "update_ops": arr.update_ops}
        for name, st in self.lrt.items():
            sks = st.sks.state_dict()
            for key in ("QL", "QR", "cx", "counts"):
                arrays[f"sks/{name}/{key}"] = sks[key]
            meta["lrt"][name] = {"rng": sks["rng"], "samples": st.samples, "updates": st.updates,
                                 "attempts": st.attempts,
                                 "maxnorm": st.maxnorm.state_dict() if st.maxnorm else None}
        meta["bias_norms"] = {k: n.state_dict() for k, n in self.bias_norms.items()}
        return arrays, meta

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Resume from :meth:`state` (of a trainer built the same way)."""
        self.net.load_state_dict({k[4:]: v for k, v in arrays.items() if k.startswith("net/")})
        self.samples = int(meta["samples"])
        for name, arr in self.arrays.items():
            arr.writes[...] = arrays[f"writes/{name}"]
            arr.reads = int(meta["nvm"][name]["reads"])
            arr.update_ops = int(meta["nvm"][name]["update_ops"])
        for name, st in self.lrt.items():
            saved = meta["lrt"][name]
            st.sks.load_state_dict({**{key: arrays[f"sks/{name}/{key}"]
                                       for key in ("QL", "QR", "cx", "counts")}, "rng": saved["rng"]})
            st.samples, st.updates, st.attempts = saved["samples"], saved["updates"], saved["attempts"]
            if st.maxnorm:
                st.maxnorm.load_state_dict(saved["maxnorm"])
        for key, norm in self.bias_norms.items():
            norm.load_state_dict(meta["bias_norms"][key])

    # -- reports -------------------------------------------------------------------------------
    def max_writes_per_cell(self) -> int:
        return max((int(arr.max_writes) for arr in self.arrays.values()), default=0)

    def max_update_ops_per_cell(self) -> int:
        """Update operations addressed to the busiest cell, code change or not."""
        return max((arr.update_ops for arr in self.arrays.values()), default=0)

    def total_writes(self) -> int:
        return sum(int(arr.total_writes) for arr in self.arrays.values())

    def lrt_summary(self) -> dict:
        return {name: {"updates": s.updates, "pseudo_batches": s.attempts,
                       "pairs_added": s.sks.pairs_added, "pairs_skipped": s.sks.pairs_skipped}
                for name, s in self.lrt.items()}
