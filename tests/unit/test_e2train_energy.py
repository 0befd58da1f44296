"""E²-Train's energy accounting: counts from what ran, bit-width-aware prices."""

import pytest

from insitu.e2train import energy
from insitu.measure.energy import HOROWITZ_PJ

pytestmark = pytest.mark.unit

# A 3x3 convolution of 8 -> 8 channels on 5x5: 72 MACs per output element.
SPECS = [
    {"name": "conv", "kind": "conv", "macs": 14400, "in_elems": 100, "out_elems": 200, "weight_elems": 50},
    {"name": "bn", "kind": "bn", "macs": 0, "in_elems": 200, "out_elems": 200, "weight_elems": 0},
    {"name": "gate", "kind": "gate", "macs": 10, "in_elems": 8, "out_elems": 1, "weight_elems": 0},
]


def test_psg_macs_are_far_cheaper_than_float32_ones():
    fp32 = HOROWITZ_PJ["fp32_mult"] + HOROWITZ_PJ["fp32_add"]
    assert energy.FP32_SGD.forward_mac_pj == pytest.approx(fp32)
    assert energy.PSG.forward_mac_pj == pytest.approx(0.2 + 0.1)           # 8x8 multiply + int32 add
    assert energy.PSG.forward_mac_pj / fp32 < 0.1
    # The predictor's 10x4 MAC is cheaper than the full 16x8 one it replaces.
    assert energy.PSG.predicted_weight_grad_mac_pj < energy.PSG.full_weight_grad_mac_pj
    assert energy.int_mac_pj(16, 16) == pytest.approx(0.2 + (256 - 64) * 2.9 / 960 + 0.1)


def test_counts_follow_the_executed_samples():
    c = energy.EnergyCounter(SPECS, energy.FP32_SGD)
    c.add_step({"conv": 4, "bn": 4, "gate": 4}, batch=4)
    assert c.macs["forward"] == c.macs["input_grad"] == c.macs["weight_grad"] == 57600
    assert c.macs["gate"] == 3 * 40
    assert c.total_macs == 3 * 57600 + 120
    e_one = c.total_j
    # A step where the conv ran for half the batch (SLU skipped it for the others) costs less;
    # a layer that ran for no sample costs nothing but the update.
    half = energy.EnergyCounter(SPECS, energy.FP32_SGD)
    half.add_step({"conv": 2, "bn": 2, "gate": 4}, batch=4)
    assert half.macs["forward"] == 28800 and half.total_j < e_one
    none = energy.EnergyCounter(SPECS, energy.FP32_SGD)
    none.add_step({"conv": 0, "bn": 0, "gate": 0}, batch=4)
    assert none.total_macs == 0 and none.energy_pj["compute"] == 0 and none.energy_pj["update"] > 0


def test_predicted_fraction_lowers_psg_energy_only():
    full = energy.EnergyCounter(SPECS, energy.PSG)
    full.add_step({"conv": 4}, batch=4, predicted={"conv": 0.0})
    pred = energy.EnergyCounter(SPECS, energy.PSG)
    pred.add_step({"conv": 4}, batch=4, predicted={"conv": 1.0})
    assert pred.total_macs == full.total_macs
    saved = (energy.PSG.full_weight_grad_mac_pj - energy.PSG.predicted_weight_grad_mac_pj) * 57600
    assert (full.energy_pj["compute"] - pred.energy_pj["compute"]) == pytest.approx(saved)


def test_savings_against_a_baseline():
    base = energy.EnergyCounter(SPECS, energy.FP32_SGD)
    run = energy.EnergyCounter(SPECS, energy.PSG)
    for _ in range(4):
        base.add_step({"conv": 8, "bn": 8, "gate": 8}, batch=8)
    for _ in range(2):                    # SMD dropped half the steps: they are never counted
        run.add_step({"conv": 8, "bn": 8, "gate": 8}, batch=8, predicted={"conv": 0.6})
    s = energy.savings(run.report(), base.report())
    assert s["computational_saving"] == pytest.approx(0.5)
    assert s["energy_saving"] > 0.8             # half the steps, each at a fraction of the energy
    assert energy.savings(base.report(), base.report()) == {"computational_saving": 0.0, "energy_saving": 0.0}


def test_the_activation_stash_moves_through_dram_at_the_activation_width():
    fp32 = energy.EnergyCounter(SPECS[:1], energy.FP32_SGD)
    psg = energy.EnergyCounter(SPECS[:1], energy.PSG)
    for c in (fp32, psg):
        c.add_step({"conv": 10}, batch=10)
    weights = 50 * energy.DRAM_PJ_PER_BIT
    stash = 2 * 10 * 100 * energy.DRAM_PJ_PER_BIT               # written forward, read backward
    assert fp32.energy_pj["dram"] == pytest.approx(32 * stash + weights * (32 + 32))
    assert psg.energy_pj["dram"] == pytest.approx(8 * stash + weights * (8 + 32 + 8))
