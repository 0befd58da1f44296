"""Energy: of a sampled power trace (:func:`integrate`), or estimated from a run's operation
counts with a per-operation table (:func:`estimate_energy`, :class:`EnergyTable`).

Both are platform-neutral: a board's table (its static power) lives with the board
(:mod:`insitu.fpga.power`), and E²-Train prices its ablations with the same figures
(:mod:`insitu.e2train.energy`).

Where the per-operation figures come from
-----------------------------------------
M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, 45 nm,
0.9 V: integer add 8 b 0.03 pJ, 32 b 0.1 pJ; integer multiply 8 b 0.2 pJ, 32 b 3.1 pJ; float add
16 b 0.4 pJ, 32 b 0.9 pJ; float multiply 16 b 1.1 pJ, 32 b 3.7 pJ; 64-bit read of an 8 KB SRAM
10 pJ; 64-bit DRAM read 1.3-2.6 nJ. E²-Train (``shared/papers/e2-train-energy-efficient-training.md``,
ref. [59]) cites this table only through the savings of 8-bit fixed point over 32-bit float -- 95 %
for a multiply, 97 % for an add, 75 % for data movement -- which these figures reproduce
(1 - 0.2/3.7 = 94.6 %, 1 - 0.03/0.9 = 96.7 %, 8/32 bits moved); the unit tests check that.

How they are carried over (rules, not measurements):

* A multiplier's energy grows with its partial-product array, i.e. with the product of the operand
  widths ``a*b``: the energy is interpolated linearly in ``a*b`` between the 8x8 (64, 0.2 pJ) and
  32x32 (1024, 3.1 pJ) points. A MAC adds one accumulator add, taken at 32 bits (0.1 pJ), an upper
  bound for the PEs' narrower accumulators. So 16x4: 0.2 + 0.1 = 0.30 pJ, 16x16: 0.78 + 0.1 = 0.88 pJ.
* An on-chip buffer access moves a 16-bit word: a quarter of the 64-bit SRAM read, 2.5 pJ.
* A DRAM byte moved by DMA: the middle of the 1.3-2.6 nJ range per 64 bits, 1.95 nJ / 8 = 244 pJ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Horowitz, ISSCC 2014 (45 nm), in pJ. Kept as published so the derived fields can be checked.
HOROWITZ_PJ = {
    "int8_add": 0.03, "int32_add": 0.1, "int8_mult": 0.2, "int32_mult": 3.1,
    "fp16_add": 0.4, "fp16_mult": 1.1, "fp32_add": 0.9, "fp32_mult": 3.7,
    "sram_8kb_read_64b": 10.0, "dram_read_64b_low": 1300.0, "dram_read_64b_high": 2600.0,
}


def mult_pj(a_bits: int, b_bits: int) -> float:
    """Energy of an ``a_bits`` x ``b_bits`` integer multiply: linear in ``a*b`` through Horowitz's
    8x8 and 32x32 points (a multiplier's array, hence its switched capacitance, grows as ``a*b``)."""
    (p0, e0), (p1, e1) = (64, HOROWITZ_PJ["int8_mult"]), (1024, HOROWITZ_PJ["int32_mult"])
    return e0 + (a_bits * b_bits - p0) * (e1 - e0) / (p1 - p0)


#: A 32-bit accumulator add: what a MAC adds to its multiply (an upper bound for narrower ones).
ACCUMULATE_PJ = HOROWITZ_PJ["int32_add"]
#: One 16-bit word of on-chip buffer: a quarter of the 64-bit SRAM read.
SRAM_WORD_PJ = HOROWITZ_PJ["sram_8kb_read_64b"] * 16 / 64
#: One byte moved by DMA: the middle of the DRAM range per 64 bits, over 8 bytes.
DRAM_BYTE_PJ = (HOROWITZ_PJ["dram_read_64b_low"] + HOROWITZ_PJ["dram_read_64b_high"]) / 2 / 8


@dataclass(frozen=True)
class EnergyTable:
    """Energy per operation (pJ) and static power (W) of one device."""

    name: str
    mac_16x4_pj: float          # one 16-bit x 4-bit MAC (TT factors)
    mac_16x16_pj: float         # one 16-bit x 16-bit MAC
    sram_word_pj: float         # one 16-bit on-chip buffer read or write
    dram_byte_pj: float         # one byte moved between DRAM and the accelerator by DMA
    pl_static_w: float          # static power of the programmable logic (or accelerator)
    ps_static_w: float          # power of the processing system while the run lasts
    cpu_active_w: float         # extra power of one busy CPU core


#: The counters :func:`estimate_energy` understands, and the table field that prices each.
COUNTERS = {"macs_16x4": "mac_16x4_pj", "macs_16x16": "mac_16x16_pj", "sram_words": "sram_word_pj",
            "dram_bytes": "dram_byte_pj", "processor_seconds": None}


def estimate_energy(counters: dict, seconds: float, table: EnergyTable) -> dict:
    """Energy of a run from its operation counters (see :data:`COUNTERS`) and its wall time.

    Dynamic energy: each counter times its per-operation energy, plus ``processor_seconds`` times
    the busy-core power. Static energy: PL and PS static power times ``seconds``. Missing counters
    count as zero; an unknown name is an error (it is usually a typo that would drop a term).
    """
    unknown = set(counters) - set(COUNTERS)
    if unknown:
        raise ValueError(f"unknown energy counters {sorted(unknown)}; known: {', '.join(COUNTERS)}")
    if seconds < 0 or any(v < 0 for v in counters.values()):
        raise ValueError("energy counters and seconds must not be negative")
    by_kind = {}
    for counter, field in COUNTERS.items():
        if field is not None:
            by_kind[counter] = counters.get(counter, 0) * getattr(table, field) * 1e-12
    by_kind["processor"] = counters.get("processor_seconds", 0) * table.cpu_active_w
    dynamic = sum(by_kind.values())
    by_kind["pl_static"] = table.pl_static_w * seconds
    by_kind["ps_static"] = table.ps_static_w * seconds
    static = by_kind["pl_static"] + by_kind["ps_static"]
    total = dynamic + static
    return {"energy_j": total, "dynamic_j": dynamic, "static_j": static, "by_kind": by_kind,
            "seconds": seconds, "mean_w": total / seconds if seconds > 0 else None,
            "table": table.name, "source": "estimate"}


def integrate(t, w, start: float | None = None, stop: float | None = None) -> float:
    """Trapezoidal integral of ``w`` over ``t`` (sorted), clipped to ``[start, stop]``; the value
    at a clipped edge is interpolated linearly between its neighbours. Joules for watts over
    seconds. Fewer than two samples, or an interval outside the trace, integrate to 0."""
    t = np.asarray(t, dtype=float)
    w = np.asarray(w, dtype=float)
    if t.shape != w.shape or t.ndim != 1:
        raise ValueError(f"integrate: t and w must be 1-D and of one length, got {t.shape} and {w.shape}")
    if t.size < 2:
        return 0.0
    a = t[0] if start is None else max(float(start), t[0])
    b = t[-1] if stop is None else min(float(stop), t[-1])
    if not b > a:
        return 0.0
    i0, i1 = np.searchsorted(t, a, side="right"), np.searchsorted(t, b, side="left")
    tt = np.concatenate(([a], t[i0:i1], [b]))
    ww = np.concatenate(([np.interp(a, t, w)], w[i0:i1], [np.interp(b, t, w)]))
    return float(np.sum((ww[1:] + ww[:-1]) * np.diff(tt)) / 2)
