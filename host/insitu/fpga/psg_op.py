"""E2-Train's sign predictor on the board: one PE3_PSG op through the driver.

The op's operand layout is the TT golden model's (:mod:`insitu.tt.pe_stream`), which the driver,
code for any op, does not know.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from insitu.accel.regmap import Op
from insitu.tt import pe_stream

from .driver import Accelerator


class PSGOutput(NamedTuple):
    """What :func:`run_psg` returns: ``g_msb`` (``(a, 16)``, rescaled by SHIFT), ``sign``
    (``(a, 16)``, eq. 2), and the PSG_PREDICTED and PSG_MAX registers after the op."""

    g_msb: np.ndarray
    sign: np.ndarray
    predicted: int
    peak: int


def run_psg(accelerator: Accelerator, cfg: pe_stream.PSGConfig, dy_rows, x_blocks) -> PSGOutput:
    """One PE3_PSG op (:func:`insitu.tt.pe_stream.psg_config`): ``dy_rows`` ``(a, b)`` 16-bit
    gradient codes, ``x_blocks`` ``(a/d, b, 16)`` 8-bit activation codes (PE3's operands).
    The next threshold: ``numerics.psg_threshold``'s rule on ``peak``."""
    words = accelerator.run(Op.PE3_PSG, pe_stream.stream_in(cfg, dy_rows, x_blocks), SIZE_A=cfg.a,
                            SIZE_B=cfg.b, SIZE_C=cfg.c, SIZE_D=cfg.d, SHIFT=cfg.shift,
                            PSG_TAU=cfg.tau)
    out = pe_stream.unpack_out(cfg, words)
    return PSGOutput(out[:, 0], out[:, 1], accelerator.read("PSG_PREDICTED"),
                     accelerator.read("PSG_MAX"))
