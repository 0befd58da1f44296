"""Benchmark (prints figures): the Cortex-M7 twin's cycles per instruction, calibrated by CoreMark
(host/insitu/mcu/calibrate.py). For each optimization level CoreMark is built with insitu's port
for the board's core (-mthumb -mcpu=cortex-m7 -mfpu=fpv5-sp-d16 -mfloat-abi=hard), its
instructions per iteration are counted on the twin (QEMU mps2-an500 under -icount, N and 2N
iterations differenced), and the CPI is Arm's published 199,600 cycles per iteration (5.01
CoreMark/MHz) over that count. It also checks that the count is deterministic: a second run gives
the same ticks, and -icount shift=1 (2 ns per instruction) the same instructions.

Run (pytest collects this file only when named: its name does not start with test_):

  COREMARK_DIR=DIR .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_cpi.py

Settings by environment variable:

  COREMARK_DIR        a CoreMark checkout (git clone https://github.com/eembc/coremark);
                      the benchmark skips when it is unset
  INSITU_CPI_OPTS     optimization levels (-O2,-O3,-Ofast)
  INSITU_CPI_ITERS    N (2000: about 1 s of QEMU per run)
"""

import os
import time

import pytest

from insitu.mcu import calibrate

pytestmark = pytest.mark.benchmark


@pytest.fixture(scope="module")
def coremark_dir():
    folder = os.environ.get("COREMARK_DIR")
    if not folder:
        pytest.skip("COREMARK_DIR is unset: point it at a CoreMark checkout "
                    "(git clone https://github.com/eembc/coremark)")
    return folder


def test_cpi_per_optimization_level(coremark_dir):
    opts = os.environ.get("INSITU_CPI_OPTS", "-O2,-O3,-Ofast").split(",")
    n = int(os.environ.get("INSITU_CPI_ITERS", "2000"))
    rows = []
    for opt in opts:
        start = time.perf_counter()
        result = calibrate.coremark_cpi(coremark_dir, opt, n)
        wall = time.perf_counter() - start
        again = calibrate.coremark_cpi(coremark_dir, opt, n)
        doubled = calibrate.coremark_cpi(coremark_dir, opt, n, shift=1)
        assert again["ticks"] == result["ticks"], "two runs of the twin counted differently"
        # shift=1 doubles the virtual time, so the ticks, to within the one tick read quantizes
        assert all(abs(2 * t - d) <= 1 for t, d in zip(result["ticks"], doubled["ticks"]))
        assert doubled["instructions_per_iteration"] == pytest.approx(
            result["instructions_per_iteration"], abs=2 * result["instructions_per_tick"] / n)
        rows.append((result, wall))
    print(f"\nCoreMark on the Cortex-M7 twin ({result['compiler']}; {result['qemu']})")
    print(f"published: {calibrate.COREMARK_PER_MHZ} CoreMark/MHz = "
          f"{result['cycles_per_iteration']:,.0f} cycles per iteration; N = {n} and {2 * n}")
    print(f"{'opt':>6} {'instr/iter':>12} {'CPI':>6} {'wall s':>7}  CRCs")
    for r, wall in rows:
        crc = " ".join(f"{k}={v}" for k, v in r["crc"].items())
        print(f"{r['opt']:>6} {r['instructions_per_iteration']:12,.1f} {r['cpi']:6.3f} "
              f"{wall:7.1f}  {crc}")
