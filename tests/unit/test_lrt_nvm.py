"""NVM write accounting, cost report and drift environments (insitu.lrt.nvm)."""

import json
import math

import numpy as np
import pytest

from insitu.lrt.nvm import (AnalogDrift, DigitalDrift, NoDrift, NVMArray, NVMModel, make_drift,
                            write_histogram)
from insitu.numerics import LRT_WEIGHT, FixedPoint, lrt_weight_format

pytestmark = pytest.mark.unit

LSB = LRT_WEIGHT.lsb


# -- writes ----------------------------------------------------------------------------------------

def test_construction_programs_the_callers_array_in_place_without_writes():
    w = np.array([[0.3, -0.71], [2.0, -5.0]], dtype=np.float32)
    arr = NVMArray("w", LRT_WEIGHT, w)
    assert arr.values is w
    np.testing.assert_array_equal(w, LRT_WEIGHT.quantize(np.array([[0.3, -0.71], [2.0, -5.0]])))
    assert w[1, 0] == LRT_WEIGHT.max_value and w[1, 1] == -1.0
    assert arr.total_writes == 0 and arr.writes.shape == w.shape and arr.writes.dtype == np.int64


def test_writes_are_counted_only_where_the_code_changes():
    w = np.zeros(5)
    arr = NVMArray("w", LRT_WEIGHT, w)
    assert arr.apply_delta(np.array([1, 0, -3, 0, 2])) == 3
    np.testing.assert_array_equal(arr.writes, [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(w, np.array([1, 0, -3, 0, 2]) * LSB)   # the caller's array moved
    assert arr.apply_delta(np.zeros(5, dtype=np.int64)) == 0
    assert arr.apply_delta(np.array([1, 1, 0, 0, 0])) == 2
    np.testing.assert_array_equal(arr.writes, [2, 1, 1, 0, 1])
    assert (arr.total_writes, arr.max_writes, arr.cells) == (5, 2, 5)


def test_saturated_cells_that_cannot_change_are_not_written():
    w = np.array([LRT_WEIGHT.max_value, -1.0, LRT_WEIGHT.max_value - LSB])
    arr = NVMArray("w", LRT_WEIGHT, w)
    assert arr.apply_delta(np.array([1, -7, 0])) == 0
    assert arr.total_writes == 0
    # A large step from one below the top saturates to the top: one real write.
    assert arr.apply_delta(np.array([10**12, -(10**12), 5])) == 1
    np.testing.assert_array_equal(arr.codes(), [127, -128, 127])
    np.testing.assert_array_equal(arr.writes, [0, 0, 1])


def test_a_drifted_cell_written_with_zero_delta_keeps_its_analog_value():
    w = np.zeros(3)
    arr = NVMArray("w", LRT_WEIGHT, w)
    w[0] += 0.3 * LSB                      # off-grid, nearest level still code 0
    w[1] += 0.7 * LSB                      # off-grid, nearest level is now code 1
    assert arr.apply_delta(np.zeros(3, dtype=np.int64)) == 0
    assert w[0] == 0.3 * LSB and w[1] == 0.7 * LSB
    np.testing.assert_array_equal(arr.codes(), [0, 1, 0])
    # A real change is written exactly onto the grid, from the drifted code.
    assert arr.apply_delta(np.array([1, 1, 0])) == 2
    np.testing.assert_array_equal(w, [LSB, 2 * LSB, 0.0])


def test_program_writes_only_cells_whose_level_changes():
    w = np.array([0.0, 0.5, -0.25])
    arr = NVMArray("w", LRT_WEIGHT, w)
    assert arr.program(w + 0.4 * LSB) == 0           # same nearest levels
    assert arr.program(np.array([0.0, 0.5 + LSB, 3.0])) == 2
    np.testing.assert_array_equal(w, [0.0, 0.5 + LSB, LRT_WEIGHT.max_value])
    np.testing.assert_array_equal(arr.writes, [0, 1, 1])


def test_reads_count_whole_array_reads_and_return_the_values():
    w = np.zeros((2, 3))
    arr = NVMArray("w", LRT_WEIGHT, w)
    assert arr.read() is w and arr.read() is w
    assert arr.reads == 2


def test_apply_delta_broadcasts_and_rejects_bad_deltas():
    arr = NVMArray("w", LRT_WEIGHT, np.zeros((2, 2)))
    assert arr.apply_delta(1) == 4
    assert arr.apply_delta(np.array([2.0, -1.0])) == 4       # integral floats are fine
    with pytest.raises(ValueError, match="integers"):
        arr.apply_delta(np.array([0.5, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        arr.apply_delta(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        arr.program(np.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        arr.program(np.array([[np.nan, 0], [0, 0]]))


def test_bad_arrays_are_refused():
    with pytest.raises(TypeError):
        NVMArray("w", LRT_WEIGHT, [0.0, 1.0])                       # not updatable in place
    with pytest.raises(TypeError):
        NVMArray("w", LRT_WEIGHT, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="cannot hold"):
        NVMArray("w", FixedPoint(32, 20), np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="finite"):
        NVMArray("w", LRT_WEIGHT, np.array([np.inf, 0.0]))
    with pytest.raises(ValueError, match="name"):
        NVMArray("", LRT_WEIGHT, np.zeros(3))


# -- the report ------------------------------------------------------------------------------------

def test_write_histogram_uses_log_edges_and_counts_every_cell():
    h = write_histogram(np.array([0, 1, 2, 3, 4, 7, 8]))
    assert h == {"edges": [0, 1, 2, 4, 8, 16], "counts": [1, 1, 2, 2, 1]}
    assert write_histogram(np.zeros(4, dtype=np.int64)) == {"edges": [0, 1], "counts": [4]}
    rng = np.random.default_rng(1)
    writes = rng.integers(0, 1000, size=(17, 9))
    h = write_histogram(writes)
    assert sum(h["counts"]) == writes.size and h["edges"][-1] > writes.max()


def test_report_energy_and_lifetime_on_a_hand_checked_case():
    model = NVMModel(write_pj_per_bit=10.0, read_pj_per_bit=2.0, endurance=100)
    a = model.add(NVMArray("a", LRT_WEIGHT, np.zeros(4)))
    model.add(NVMArray("b", lrt_weight_format(2), np.zeros(2)))
    a.apply_delta(np.array([1, 1, 0, 0]))
    a.apply_delta(np.array([1, 0, 0, 0]))
    a.read()
    a.read()
    rep = model.report(samples=10)
    ra, rb, tot = rep["arrays"]["a"], rep["arrays"]["b"], rep["total"]
    assert (ra["cells"], ra["bits_per_cell"], ra["total_writes"], ra["max_writes_per_cell"]) == (4, 8, 3, 2)
    assert ra["mean_writes_per_cell"] == 0.75
    assert ra["write_histogram"] == {"edges": [0, 1, 2, 4], "counts": [2, 1, 1]}
    assert ra["write_energy_j"] == pytest.approx(3 * 8 * 10.0e-12)          # cells written x bits x pJ
    assert ra["read_energy_j"] == pytest.approx(2 * 4 * 8 * 2.0e-12)        # reads x cells x bits x pJ
    assert ra["lifetime_samples"] == pytest.approx(100 / (2 / 10))           # 500 samples
    assert rb["bits_per_cell"] == 2 and rb["total_writes"] == 0 and rb["lifetime_samples"] is None
    assert (tot["cells"], tot["bits"], tot["total_writes"], tot["max_writes_per_cell"]) == (6, 36, 3, 2)
    assert tot["write_energy_j"] == pytest.approx(ra["write_energy_j"])
    assert tot["lifetime_samples"] == pytest.approx(500)
    assert sum(tot["write_histogram"]["counts"]) == 6
    assert rep["parameters"]["samples"] == 10
    counts = model.write_counts()
    np.testing.assert_array_equal(counts["a"], [2, 1, 0, 0])
    counts["a"][0] = 99                                                      # a copy
    assert a.writes[0] == 2


def test_report_is_valid_json_without_inf_or_nan():
    model = NVMModel()
    model.add(NVMArray("w", LRT_WEIGHT, np.zeros((3, 3))))
    for samples in (0, 5):
        text = json.dumps(model.report(samples), allow_nan=False)
        assert json.loads(text)["total"]["lifetime_samples"] is None
    model["w"].apply_delta(1)
    rep = json.loads(json.dumps(model.report(5), allow_nan=False))
    assert rep["total"]["lifetime_samples"] == pytest.approx(5e6)
    assert json.dumps(NVMModel().report(0), allow_nan=False)                 # an empty model too


@pytest.mark.parametrize("arg", ["write_pj_per_bit", "read_pj_per_bit", "endurance"])
@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "3"])
def test_model_parameters_are_validated(arg, bad):
    with pytest.raises(ValueError, match=arg):
        NVMModel(**{arg: bad})


def test_model_refuses_duplicates_and_bad_samples():
    model = NVMModel()
    model.add(NVMArray("w", LRT_WEIGHT, np.zeros(2)))
    with pytest.raises(ValueError, match="already"):
        model.add(NVMArray("w", LRT_WEIGHT, np.zeros(2)))
    with pytest.raises(ValueError, match="samples"):
        model.report(-1)
    with pytest.raises(ValueError, match="samples"):
        model.report(2.5)
    assert "w" in model and len(model) == 1 and list(model.arrays) == ["w"]


# -- drift -----------------------------------------------------------------------------------------

def test_analog_drift_is_brownian_with_the_papers_scale_and_is_not_a_write():
    w = np.zeros((100, 100))
    model = NVMModel()
    arr = model.add(NVMArray("w", LRT_WEIGHT, w))
    drift = AnalogDrift(sigma0=0.2, every=5, horizon=1000, seed=0)
    assert drift.sigma == pytest.approx(0.2 / math.sqrt(1000 / 5))
    steps = 500
    applied = sum(bool(drift.step(model, i)) for i in range(steps))
    assert applied == steps // 5
    expected = 0.2 * math.sqrt(steps / 1000)
    assert np.std(w) == pytest.approx(expected, rel=0.03)
    assert abs(np.mean(w)) < 3 * expected / 100
    assert arr.total_writes == 0
    assert np.any(w != LRT_WEIGHT.quantize(w))                              # off the grid


def test_analog_drift_stays_within_the_format_range():
    w = np.zeros(5000)
    arr = NVMArray("w", LRT_WEIGHT, w)
    drift = AnalogDrift(sigma0=50.0, every=1, horizon=100, seed=3)
    for i in range(20):
        drift.step([arr], i)
    assert w.min() >= LRT_WEIGHT.min_value and w.max() <= LRT_WEIGHT.max_value
    assert np.any(w == LRT_WEIGHT.min_value) and np.any(w == LRT_WEIGHT.max_value)


def test_drift_is_applied_after_every_every_steps_and_reports_code_changes():
    arr = NVMArray("w", LRT_WEIGHT, np.zeros(1000))
    drift = AnalogDrift(sigma0=100.0, every=3, horizon=300, seed=1)
    assert drift.step(arr, 0) == {} and drift.step(arr, 1) == {}
    assert np.all(arr.values == 0)
    changed = drift.step(arr, 2)
    assert set(changed) == {"w"} and 0 < changed["w"] <= 1000
    assert changed["w"] == np.count_nonzero(arr.codes())
    with pytest.raises(ValueError, match="step_index"):
        drift.step(arr, -1)


def test_digital_drift_flips_each_bit_at_rate_p():
    rng = np.random.default_rng(7)
    codes = rng.integers(LRT_WEIGHT.qmin, LRT_WEIGHT.qmax + 1, size=20000)
    w = LRT_WEIGHT.to_float(codes)
    arr = NVMArray("w", LRT_WEIGHT, w)
    drift = DigitalDrift(p0=0.2, every=1, horizon=1, seed=11)
    assert drift.p == pytest.approx(0.2)
    changed = drift.step(arr, 0)
    after = arr.codes()
    np.testing.assert_array_equal(w, LRT_WEIGHT.to_float(after))           # back on the grid
    flips = (codes & 0xFF) ^ (after & 0xFF)
    rates = [np.mean((flips >> b) & 1) for b in range(8)]
    assert rates == pytest.approx([0.2] * 8, abs=0.012)
    assert changed["w"] == np.count_nonzero(flips)
    assert changed["w"] == pytest.approx(20000 * (1 - 0.8**8), rel=0.03)
    assert arr.total_writes == 0


def test_digital_drift_flips_twos_complement_bits():
    # p = 1 flips every bit: a two's complement code c becomes ~c = -c - 1.
    codes = np.array([0, 1, 127, -128, -1, 42])
    arr = NVMArray("w", LRT_WEIGHT, LRT_WEIGHT.to_float(codes))
    DigitalDrift(p0=1.0, every=1, horizon=1, seed=0).step(arr, 0)
    np.testing.assert_array_equal(arr.codes(), -codes - 1)
    unsigned = FixedPoint(4, 2, signed=False)
    arr = NVMArray("u", unsigned, unsigned.to_float(np.array([5, 0, 15])))
    DigitalDrift(p0=1.0, every=1, horizon=1, seed=0).step({"u": arr}, 0)
    np.testing.assert_array_equal(arr.codes(), [10, 15, 0])
    # A transposed (non-contiguous) weight view is updated in place as well.
    base = np.zeros((3, 2))
    arr = NVMArray("t", LRT_WEIGHT, base.T)
    DigitalDrift(p0=1.0, every=1, horizon=1, seed=0).step(arr, 0)
    np.testing.assert_array_equal(base, -LSB)


def test_no_drift_and_the_environment_factory():
    arr = NVMArray("w", LRT_WEIGHT, np.full(4, 0.5))
    for step in range(30):
        assert NoDrift().step(arr, step) == {}
    np.testing.assert_array_equal(arr.values, 0.5)
    assert isinstance(make_drift("control", 0), NoDrift)
    assert isinstance(make_drift("shift", 0), NoDrift)
    analog = make_drift("analog", 0)
    assert isinstance(analog, AnalogDrift) and (analog.sigma0, analog.every, analog.horizon) == (10.0, 10, 1e6)
    digital = make_drift("digital", 0)
    assert isinstance(digital, DigitalDrift) and digital.p == pytest.approx(10 / 1e5)
    with pytest.raises(ValueError, match="control, shift, analog, digital"):
        make_drift("thermal", 0)


def test_drift_seeds_reproduce():
    runs = []
    for _ in range(2):
        arr = NVMArray("w", LRT_WEIGHT, np.zeros(100))
        drift = make_drift("analog", seed=5, sigma0=1.0, every=1, horizon=100)
        drift.step(arr, 0)
        runs.append(arr.values.copy())
    np.testing.assert_array_equal(*runs)


@pytest.mark.parametrize("make, arg", [
    (lambda: AnalogDrift(sigma0=0), "sigma0"),
    (lambda: AnalogDrift(sigma0=math.nan), "sigma0"),
    (lambda: AnalogDrift(every=0), "every"),
    (lambda: AnalogDrift(every=2.5), "every"),
    (lambda: AnalogDrift(horizon=-1), "horizon"),
    (lambda: DigitalDrift(p0=-1), "p0"),
    (lambda: DigitalDrift(every=0), "every"),
    (lambda: DigitalDrift(horizon=math.inf), "horizon"),
    (lambda: DigitalDrift(p0=2, every=1, horizon=1), "probability"),
    (lambda: make_drift("control", 0, sigma0=1.0), "no drift parameters"),
])
def test_drift_parameters_are_validated(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_apply_sequence_counts_each_code_change_and_walks_saturation():
    from insitu.lrt.nvm import NVMArray
    from insitu.numerics import LRT_WEIGHT

    values = LRT_WEIGHT.to_float(np.array([126, 0])).astype(np.float64)
    arr = NVMArray("w", LRT_WEIGHT, values)
    # cell 0 saturates at 127: +3 -> 127 (write), -1 -> 126 (write), 0 -> nothing
    # cell 1: +1, -1, +1 -> three writes, ends at 1
    written = arr.apply_sequence(np.array([[3, 1], [-1, -1], [0, 1]]))
    assert written == 5 and arr.writes.tolist() == [2, 3]
    assert arr.update_ops == 3                     # three updates addressed both cells
    arr.apply_delta(np.array([0, 0]))
    assert arr.update_ops == 4 and arr.writes.tolist() == [2, 3]
    assert arr.codes().tolist() == [126, 1]
    with pytest.raises(ValueError, match="steps must be integer codes"):
        arr.apply_sequence(np.array([[0.6, 0.0]]))
