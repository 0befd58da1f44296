"""``insitu.nn``: the NumPy training core — explicit forward/backward layers, losses, SGD.

No autograd: each layer implements its own backward pass (contract in :mod:`insitu.nn.layers`).
What trainers built on top (LRT/SKS, TT, E2-Train) rely on:

* ``layer.forward(x, train=True)`` caches, ``layer.backward(dy)`` returns ``dx`` and *adds* into
  ``layer.grads`` (call ``zero_grad()`` per step); ``train=False`` caches nothing.
* weight layers expose ``weight_matrix`` (an ``(n_out, n_in)`` view) and, after a backward,
  ``kronecker_pairs() -> (dz, a)`` with ``grad = einsum('npo,npi->oi', dz, a)``; the arrays are
  the layer's own cached buffers (no copy), valid until its next forward. Depthwise layers give
  the per-channel analogue ``(N, P, C)``, ``(N, P, C, k*k)``.
* ``compute_weight_grad = False`` on a weight layer skips its weight-gradient GEMM.
* ``model.parameters()`` yields :class:`Param` handles (``.value``, ``.grad``, ``.key``).
"""

from . import functional, gradcheck
from .functional import col2im, im2col, softmax
from .layers import (
    AvgPool2d,
    Conv2d,
    Dense,
    DepthwiseConv2d,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    MaxPool2d,
    Param,
    PointwiseConv2d,
    ReLU,
    ReLU6,
    WeightLayer,
)
from .loss import mse_loss, softmax_cross_entropy
from .model import Sequential
from .norm import BatchNorm, StreamingBatchNorm
from .optim import SGD, Adam

__all__ = [
    "functional",
    "gradcheck",
    "im2col",
    "col2im",
    "softmax",
    "Layer",
    "Param",
    "WeightLayer",
    "Dense",
    "Conv2d",
    "PointwiseConv2d",
    "DepthwiseConv2d",
    "ReLU",
    "ReLU6",
    "MaxPool2d",
    "AvgPool2d",
    "GlobalAvgPool2d",
    "Flatten",
    "BatchNorm",
    "StreamingBatchNorm",
    "softmax_cross_entropy",
    "mse_loss",
    "SGD",
    "Adam",
    "Sequential",
]
