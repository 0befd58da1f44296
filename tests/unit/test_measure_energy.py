"""Energy models: Horowitz's per-operation table, the estimate, and the integral of a trace."""

import numpy as np
import pytest

from insitu.measure.energy import HOROWITZ_PJ, EnergyTable, estimate_energy, integrate, mult_pj

pytestmark = pytest.mark.unit

TABLE = EnergyTable("test", mac_16x4_pj=0.3, mac_16x16_pj=0.88, sram_word_pj=2.5, dram_byte_pj=243.75,
                    pl_static_w=0.3, ps_static_w=0.75, cpu_active_w=0.3)


def test_table_reproduces_the_savings_e2_train_quotes():
    # E²-Train: 8-bit fixed point saves 95 % (multiply), 97 % (add), 75 % (data) over 32-bit float.
    assert 1 - HOROWITZ_PJ["int8_mult"] / HOROWITZ_PJ["fp32_mult"] == pytest.approx(0.95, abs=0.005)
    assert 1 - HOROWITZ_PJ["int8_add"] / HOROWITZ_PJ["fp32_add"] == pytest.approx(0.97, abs=0.005)


def test_multiplier_interpolation_hits_both_published_points():
    assert mult_pj(8, 8) == pytest.approx(0.2)
    assert mult_pj(32, 32) == pytest.approx(3.1)
    assert mult_pj(16, 4) == pytest.approx(0.2)           # same array size as 8x8
    assert mult_pj(16, 16) == pytest.approx(0.2 + 192 * 2.9 / 960)


def test_estimate_on_known_counters():
    counters = {"macs_16x4": 10**9, "macs_16x16": 10**8, "dram_bytes": 10**6, "sram_words": 10**7,
                "processor_seconds": 2.0}
    got = estimate_energy(counters, seconds=4.0, table=TABLE)
    t = TABLE
    expect_dyn = (1e9 * t.mac_16x4_pj + 1e8 * t.mac_16x16_pj + 1e6 * t.dram_byte_pj
                  + 1e7 * t.sram_word_pj) * 1e-12 + 2.0 * t.cpu_active_w
    expect_static = 4.0 * (t.pl_static_w + t.ps_static_w)
    assert got["source"] == "estimate"
    assert got["dynamic_j"] == pytest.approx(expect_dyn)
    assert got["static_j"] == pytest.approx(expect_static)
    assert got["energy_j"] == pytest.approx(expect_dyn + expect_static)
    assert sum(got["by_kind"].values()) == pytest.approx(got["energy_j"])
    assert got["by_kind"]["macs_16x4"] == pytest.approx(0.3e-3)     # 1e9 x 0.3 pJ
    assert got["mean_w"] == pytest.approx(got["energy_j"] / 4.0)


def test_estimate_refuses_typos_and_negatives():
    with pytest.raises(ValueError, match="unknown energy counters"):
        estimate_energy({"mac_16x4": 1}, 1.0, TABLE)
    with pytest.raises(ValueError, match="negative"):
        estimate_energy({"dram_bytes": -1}, 1.0, TABLE)
    assert estimate_energy({}, 0.0, TABLE)["energy_j"] == 0.0


def test_integration_of_a_known_curve_within_one_percent():
    t = np.arange(0, 10.0 + 1e-9, 0.05)
    w = 2 + np.sin(t)
    assert integrate(t, w) == pytest.approx(20 + 1 - np.cos(10), rel=0.01)
    assert integrate(t, w, 1.0, 3.0) == pytest.approx(4 + np.cos(1) - np.cos(3), rel=0.01)
    # A phase between two samples: power interpolated, times its 10 ms.
    assert integrate(t, w, 4.02, 4.03) == pytest.approx(0.01 * (2 + np.sin(4.025)), rel=0.01)


def test_integration_edges():
    # A step in power is exact for trapezoids of a piecewise-linear curve; an interval is clipped
    # to the trace (nothing is extrapolated past the last sample).
    assert integrate([0, 1, 2], [1, 1, 3]) == pytest.approx(1 + 2)
    assert integrate([0, 1, 2], [1, 1, 3], 1.5, 3.0) == pytest.approx(0.5 * 2.5)
    assert integrate([5.0], [2.0]) == 0.0
    with pytest.raises(ValueError, match="1-D"):
        integrate([0, 1], [1, 1, 1])
