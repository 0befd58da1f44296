"""Stateless array functions used by the layers: im2col/col2im, softmax, one-hot.

Layout conventions (shared with :mod:`insitu.nn.layers` and the LRT trainer):

* images are NCHW;
* ``im2col`` returns ``(N, P, C*kh*kw)`` where ``P = H_out*W_out`` in row-major order and the
  last axis is ordered ``(c, i, j)``, i.e. exactly ``weight.reshape(c_out, -1)``'s column order,
  so a convolution is the GEMM ``cols @ weight.reshape(c_out, -1).T``.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "pair",
    "conv_output_size",
    "pad2d",
    "im2col",
    "col2im",
    "softmax",
    "log_softmax",
    "one_hot",
]


def pair(v: int | tuple[int, int]) -> tuple[int, int]:
    """``3 -> (3, 3)``; a 2-sequence passes through. Used for kernel_size, stride and padding."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    a, b = v
    return int(a), int(b)


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output length of a (pooling or) convolution window sliding over ``size`` inputs."""
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        raise ValueError(
            f"window {kernel} with stride {stride} and padding {padding} does not fit input size {size}"
        )
    return out


def pad2d(x: np.ndarray, padding: tuple[int, int]) -> np.ndarray:
    """Zero-pad the two trailing (spatial) axes of an NCHW array."""
    ph, pw = padding
    if ph == 0 and pw == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def im2col(x: np.ndarray, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] = 1,
           padding: int | tuple[int, int] = 0) -> np.ndarray:
    """Unfold NCHW ``x`` into patches of shape ``(N, H_out*W_out, C*kh*kw)``.

    ``cols[n, p, c*kh*kw + i*kw + j] = x_padded[n, c, oh*sh + i, ow*sw + j]`` with ``p = oh*W_out + ow``.
    Always returns a fresh contiguous array (the layers keep it for the backward pass).
    """
    kh, kw = pair(kernel_size)
    sh, sw = pair(stride)
    ph, pw = pair(padding)
    n, c, h, w = x.shape
    ho = conv_output_size(h, kh, sh, ph)
    wo = conv_output_size(w, kw, sw, pw)
    if kh == 1 and kw == 1 and ph == 0 and pw == 0:
        # 1x1 convolution: the patch is the pixel, no window view needed.
        sub = x[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw]
        return np.ascontiguousarray(sub.transpose(0, 2, 3, 1)).reshape(n, ho * wo, c)
    xp = pad2d(x, (ph, pw))
    # (N, C, H', W', kh, kw) view; striding the window origins gives the output grid.
    # (NumPy's stubs type `axis` as one int; it takes a tuple, as documented.)
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[  # pyright: ignore[reportCallIssue, reportArgumentType]
        :, :, ::sh, ::sw][:, :, :ho, :wo]
    # -> (N, Ho, Wo, C, kh, kw); reshape copies into the GEMM-friendly layout.
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n, ho * wo, c * kh * kw)


def col2im(cols: np.ndarray, x_shape, kernel_size: int | tuple[int, int],
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0) -> np.ndarray:
    """Adjoint of :func:`im2col`: scatter-add patches back into an array of shape ``x_shape``.

    Overlapping windows accumulate, which is exactly the input gradient of a convolution when
    ``cols`` holds the patch gradients. Loops over the kh*kw kernel offsets only.
    """
    kh, kw = pair(kernel_size)
    sh, sw = pair(stride)
    ph, pw = pair(padding)
    n, c, h, w = x_shape
    ho = conv_output_size(h, kh, sh, ph)
    wo = conv_output_size(w, kw, sw, pw)
    # (N, P, C*kh*kw) -> (N, C, kh, kw, Ho, Wo) so each kernel offset is one strided slab.
    g = cols.reshape(n, ho, wo, c, kh, kw).transpose(0, 3, 4, 5, 1, 2)
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            xp[:, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw] += g[:, :, i, j]
    if ph or pw:
        return np.ascontiguousarray(xp[:, :, ph : ph + h, pw : pw + w])
    return xp


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax (shifts by the max so ``exp`` never overflows)."""
    z = logits - logits.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax (log-sum-exp with the max shift)."""
    z = logits - logits.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def one_hot(labels: np.ndarray, num_classes: int, dtype=np.float64) -> np.ndarray:
    """``(N,)`` int labels -> ``(N, num_classes)`` one-hot rows."""
    labels = np.asarray(labels)
    out = np.zeros((labels.shape[0], num_classes), dtype=dtype)
    out[np.arange(labels.shape[0]), labels] = 1
    return out
