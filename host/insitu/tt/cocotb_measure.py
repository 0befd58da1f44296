"""cocotb test that measures the cycles of PE ops on the top level (used by ``insitu rtl report``).

Reads a JSON list of PE configurations from ``$INSITU_MEASURE_IN``, runs each through the
registers and streams with no back-pressure (random operands: cycles do not depend on values,
and the outputs are still checked against the golden model), and writes the CYCLES register of
each to ``$INSITU_MEASURE_OUT``. The top level is the one :func:`insitu.rtl.sim.run` built: a
board's design (its accelerator parameters), so the cycles are that design's; the outputs do not
depend on the parameters.
"""

from __future__ import annotations

import json
import os

import numpy as np

import cocotb

from insitu.rtl.cocotb_bench import AccelBench

from . import pe_stream as ps


def _operands(rng, cfg: ps.PEConfig):
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if cfg.kind == "PE1":
        return rng.integers(-999, 999, (a, b, c)), rng.integers(-8, 8, (b, d, c))
    if cfg.kind == "PE2":
        return rng.integers(-999, 999, (a, b, c)), rng.integers(-8, 8, (b, d))
    return rng.integers(-999, 999, (a, b)), rng.integers(-999, 999, (a // d, b, 16))


@cocotb.test()
async def measure_ops(dut):
    with open(os.environ["INSITU_MEASURE_IN"]) as f:
        configs = [ps.PEConfig(**c) for c in json.load(f)]
    tb = AccelBench(dut)
    await tb.start()
    rng = np.random.default_rng(0)
    cycles = []
    for cfg in configs:
        lhs, rhs = _operands(rng, cfg)
        out, n = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs), timeout_cycles=10 * cfg.macs())
        assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs)), cfg
        cycles.append(n)
    tmp = os.environ["INSITU_MEASURE_OUT"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cycles, f)
    os.replace(tmp, os.environ["INSITU_MEASURE_OUT"])
