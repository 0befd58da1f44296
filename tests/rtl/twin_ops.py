"""Random accelerator ops for the tests that run two twins side by side (fast vs compiled RTL,
compiled vs Amaranth RTL): codes with their extremes, and small valid TT op shapes."""

from __future__ import annotations

import numpy as np

from insitu.accel.regmap import ErrorCode
from insitu.tt import pe_stream
from insitu.tt.pe_stream import PEConfig


def codes(rng, shape, bits=16):
    """Random signed codes of ``bits`` bits, the first two the extremes."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    x = rng.integers(lo, hi + 1, size=shape, dtype=np.int64)
    if x.size >= 2:
        x.reshape(-1)[:2] = [lo, hi]
    return x


def random_tt_shapes(rng, fixed, count, *, d_max, b_max, a_max, pe3_blocks_max, beats_max):
    """``fixed`` (kind, a, b, c, d) shapes, then random valid ones up to ``count``, each moving
    at most ``beats_max`` beats (the Amaranth simulator is slow)."""
    shapes = list(fixed)
    while len(shapes) < count:
        kind = str(rng.choice(["PE1", "PE2", "PE3"]))
        c = 16 if kind == "PE3" else 16 * int(rng.integers(1, 3))
        d = int(rng.integers(1, d_max))
        a = d * int(rng.integers(1, pe3_blocks_max)) if kind == "PE3" else int(rng.integers(1, a_max))
        cfg = PEConfig(kind, a, int(rng.integers(1, b_max)), c, d)
        if pe_stream.cfg_error(cfg) == ErrorCode.NONE and cfg.in_beats() + cfg.out_beats() <= beats_max:
            shapes.append((kind, cfg.a, cfg.b, cfg.c, cfg.d))
    return shapes


def tt_operands(rng, kind, a, b, c, d):
    """Random (lhs, rhs) of a TT op: 16-bit data, 4-bit factor codes (PE3: 16 bits both)."""
    if kind == "PE1":
        return codes(rng, (a, b, c)), codes(rng, (b, d, c), bits=4)
    if kind == "PE2":
        return codes(rng, (a, b, c)), codes(rng, (b, d), bits=4)
    return codes(rng, (a, b)), codes(rng, (a // d, b, 16))
