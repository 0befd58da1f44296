"""The TT network for any dataset (insitu.tt.network): the input layout, the mode rule (the paper's
shapes unchanged), the output modes for the class count, and the PE limits named when a shape
breaks one."""

import math

import numpy as np
import pytest

from insitu.accel.params import AcceleratorParams
from insitu.tt.model import PAPER_LAYERS, TTNet, pad_images
from insitu.tt.network import (ARCHITECTURES, balanced_factorizations, broken_limit, fit_input,
                               parse_input_size, parse_modes, tt_shape)
from insitu.tt.pe_stream import PEConfig, broken_limit as cfg_broken_limit, cfg_error

pytestmark = pytest.mark.unit

#: The tiny network as it was written before the rule (2x2-pooled 28x28 images padded to 16x16).
TINY_28X28 = (((4, 4, 16), (1, 4, 16)), ((4, 16), (1, 16)))


# ------------------------------------------------------------------------- the paper unchanged

def test_the_paper_and_tiny_networks_for_fashion_mnist_are_as_before():
    paper = tt_shape((28, 28), 10)
    assert paper.layers == PAPER_LAYERS and paper.modes_from == "rule"
    assert paper.input_values == paper.input_width == 896
    tiny = tt_shape((28, 28), 10, model="tiny")
    assert tiny.layers == TINY_28X28 and tiny.architecture.rank == 4
    x = np.random.default_rng(0).random((5, 28, 28))
    np.testing.assert_array_equal(paper.vectors(x), pad_images(x))
    pooled = np.zeros((5, 16, 16))
    pooled[:, :14, :14] = x.reshape(5, 14, 2, 14, 2).mean(axis=(2, 4))
    np.testing.assert_array_equal(tiny.vectors(x), pooled.reshape(5, -1))


def test_the_rule_gives_the_paper_modes_at_any_rank_and_batch_that_fit():
    for rank, batch in ((16, 64), (4, 8), (8, 256), (1, 1)):
        assert tt_shape((28, 28), 10, rank=rank, batch=batch).layers == PAPER_LAYERS


# ------------------------------------------------------------------------- the mode rule

def test_balanced_factorizations_come_most_balanced_then_decreasing():
    assert balanced_factorizations(56, 3)[:3] == [(7, 4, 2), (7, 2, 4), (4, 7, 2)]
    assert balanced_factorizations(32, 3)[0] == (4, 4, 2)
    assert balanced_factorizations(7, 3)[0] == (7, 1, 1)
    for m, k in ((1, 3), (60, 3), (97, 2), (720, 3)):
        found = balanced_factorizations(m, k)
        assert len(found) == len(set(found)) and all(math.prod(t) == m for t in found)
        assert [max(t) for t in found] == sorted(max(t) for t in found)


@pytest.mark.parametrize("sample_shape,first_modes,values", [
    ((8, 8), (2, 2, 2, 16), 128),                  # digits: rows of 8 padded to 16
    ((12, 12, 3), (4, 3, 3, 16), 576),             # RGB as it is: rows of 36 padded to 48
    ((8, 8, 3), (4, 2, 2, 16), 256),
    ((20, 20), (5, 4, 2, 16), 640),
    ((32, 32), (4, 4, 4, 16), 1024),
    ((16,), (1, 1, 1, 16), 16),                    # features: one row
    ((600,), (19, 2, 1, 16), 608),
])
def test_the_rule_factors_the_laid_out_input(sample_shape, first_modes, values):
    shape = tt_shape(sample_shape, 10)
    assert shape.layers[0] == (first_modes, (4, 4, 2, 16)) and shape.input_values == values
    assert shape.input_width == values and broken_limit(shape.layers, 16, 64) is None


def test_the_rule_takes_the_most_balanced_modes_that_fit():
    # 2000 features: 125 = 5x5x5 is the most balanced, but a middle mode of 5 breaks PE1's row
    # tile at rank 16; the rule takes the first candidate that fits, and every one before it breaks.
    shape = tt_shape((2000,), 10)
    first = shape.layers[0][0]
    candidates = [(*c, 16) for c in balanced_factorizations(125, 3)]
    assert candidates[0] == (5, 5, 5, 16) and first != candidates[0]
    before = candidates[:candidates.index(first)]
    assert before and all(broken_limit(((c, (4, 4, 2, 16)),), 16, 64) for c in before)
    assert broken_limit(shape.layers, 16, 64) is None


def test_an_input_without_fitting_factors_is_padded_further():
    # 37x37: 37 x 48 = 1776 values, m = 111 = 3 x 37 (a first mode of 37 breaks PE2's tile);
    # 112 = 7x4x4 fits: the vector gets 16 more zeros.
    shape = tt_shape((37, 37), 10)
    assert shape.input_values == 1776 and shape.input_width == 1792
    assert shape.layers[0][0] == (7, 4, 4, 16)
    x = np.random.default_rng(1).random((3, 37, 37))
    v = shape.vectors(x)
    assert v.shape == (3, 1792) and not v[:, 1776:].any()
    np.testing.assert_array_equal(v[:, :1776].reshape(3, 37, 48)[:, :, :37], x)


def test_rgb_is_laid_out_channel_last_and_features_as_one_row():
    rgb = tt_shape((2, 3, 3), 10)
    x = np.arange(18.0).reshape(1, 2, 3, 3) / 18
    v = rgb.vectors(x).reshape(-1, 16)
    np.testing.assert_array_equal(v[:2, :9], x.reshape(2, 9))          # rows of W*3 values
    assert not v[:2, 9:].any() and rgb.input_values == 32
    features = tt_shape((5,), 10)
    f = np.random.default_rng(2).random((4, 5))
    np.testing.assert_array_equal(features.vectors(f)[:, :5], f)
    assert features.vectors(f).shape == (4, 16) and not features.vectors(f)[:, 5:].any()


@pytest.mark.parametrize("classes,out_modes", [(2, (1, 16)), (10, (1, 16)), (16, (1, 16)),
                                               (17, (2, 16)), (100, (7, 16)), (128, (8, 16))])
def test_the_output_modes_cover_the_classes(classes, out_modes):
    shape = tt_shape((8, 8), classes)
    assert shape.layers[1] == ((32, 16), out_modes) and shape.classes == classes
    net = TTNet(shape.layers, rank=2, classes=classes)
    assert net.forward(np.zeros((3, 128))).shape == (3, classes)     # padded outputs sliced off


def test_given_modes_are_taken_as_they_are():
    shape = tt_shape((8, 8), 10, modes="4,2,1,16")
    assert shape.layers[0][0] == (4, 2, 1, 16) and shape.modes_from == "--tt-modes"
    wider = tt_shape((8, 8), 10, modes=(3, 3, 1, 16))                  # 144 >= 128: zero-padded
    assert wider.input_width == 144 and not wider.vectors(np.ones((1, 8, 8)))[:, 128:].any()
    assert tt_shape((8, 8), 10, model="tiny", modes=(2, 2, 16)).layers[0][0] == (2, 2, 16)


def test_the_dense_baseline_takes_the_rule_without_the_limits():
    # 64x64 images do not fit the PEs at all; the dense variant still gets the padded sizes.
    shape = tt_shape((64, 64), 10, check=False)
    assert shape.input_width == 4096 and shape.layers[0][0] == (8, 8, 4, 16)


@pytest.mark.parametrize("seed", range(4))
def test_every_chosen_shape_fits_the_pes(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        sample = tuple(int(s) for s in rng.integers(2, 30, 2)) + ((3,) if rng.random() < 0.3 else ())
        rank, batch = int(rng.choice([2, 4, 8, 16])), int(rng.choice([8, 32, 64]))
        model = str(rng.choice(list(ARCHITECTURES)))
        try:
            shape = tt_shape(sample, int(rng.integers(2, 40)), model=model, rank=rank, batch=batch)
        except ValueError as exc:
            assert "does not fit the PEs" in str(exc)
            continue
        assert broken_limit(shape.layers, rank, batch) is None
        assert math.prod(shape.layers[0][0]) >= shape.input_values
        assert shape.layers[0][0][-1] == 16


# ------------------------------------------------------------------------- the limits, named

def test_an_input_too_large_names_the_limit_and_what_to_do():
    with pytest.raises(ValueError) as info:
        tt_shape((28, 28, 3), 10)
    message = str(info.value)
    assert "28x28 RGB images (2688 values: rows of 84 padded to 96)" in message
    assert "no modes fit" in message and "layer 1" in message
    assert "the PE buffer holds 4096 (factor_words" in message
    assert "--input-size 28x28x1" in message and "--input-size 25x25" in message
    assert "--tt-modes" in message and "resized only when asked" in message
    tt_shape((25, 25, 3), 10)                         # the suggestions fit
    tt_shape((28, 28), 10)


def test_the_size_register_is_named():
    # 127 x 16 values is the largest first layer: PE3's a = 512 x m is a 16-bit size register.
    with pytest.raises(ValueError, match=r"size a=65536 exceeds the PE's size register \(max 65535\)"):
        tt_shape((1, 2048), 10, modes=(32, 4, 1, 16))
    assert tt_shape((2016,), 10).layers[0][0] == (7, 3, 6, 16)          # m = 126
    with pytest.raises(ValueError, match="no modes fit"):
        tt_shape((2048,), 10)                                            # m = 128


@pytest.mark.parametrize("kwargs,needles", [
    ({"batch": 512}, ["--batch-size 512", "pe3_b_max = 256"]),
    ({"rank": 64, "batch": 256}, ["--rank 64 with --batch-size 256 does not fit", "factor_words"]),
    ({"params": AcceleratorParams(pe2_b_max=256)}, ["layer 2 (modes 32,16 -> 1,16)", "PE2 op",
                                                   "pe2_b_max = 256"]),
    ({"params": AcceleratorParams(pe1_row_entries=8)}, ["pe1_row_entries = 8", "PE1's row tile"]),
    ({"modes": (7, 4, 1, 32), "rank": 2}, ["layer 1 (modes 7,4,1,32", "PE3 takes exactly c_lanes = 16"]),
])
def test_a_limit_the_shape_breaks_is_named_with_its_value(kwargs, needles):
    with pytest.raises(ValueError) as info:
        tt_shape((28, 28), 10, **kwargs)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert "Lower --rank or --batch-size" in str(info.value)


def test_too_many_classes_and_bad_modes_are_refused():
    with pytest.raises(ValueError, match="fewer than 200 classes"):
        tt_shape((8, 8), 200)
    with pytest.raises(ValueError, match=r"--tt-modes takes 4 modes for --model paper .* got 4,4,16"):
        tt_shape((8, 8), 10, modes=(4, 4, 16))
    with pytest.raises(ValueError, match="--tt-modes 2,2,1,16 hold 64 values; the input has 128"):
        tt_shape((8, 8), 10, modes=(2, 2, 1, 16))
    with pytest.raises(ValueError, match="pools images 2x2: 1x5 images leave nothing"):
        tt_shape((1, 5), 10, model="tiny")
    with pytest.raises(ValueError, match="at least 2 classes"):
        tt_shape((8, 8), 1)


def test_broken_limit_gives_cfg_errors_code_with_a_reason():
    for cfg in (PEConfig("PE1", 8, 32, 16, 2), PEConfig("PE2", 1, 600, 16, 8),
                PEConfig("PE3", 16, 300, 16, 16), PEConfig("PE3", 16, 4, 32, 16),
                PEConfig("PE2", 1, 4, 24, 8), PEConfig("PE1", 8, 1, 16, 8, shift=99)):
        broken = cfg_broken_limit(cfg)
        assert broken is not None
        code, reason = broken
        assert code == cfg_error(cfg) and code and reason
    assert cfg_broken_limit(PEConfig("PE1", 8, 1, 16, 8)) is None


# ------------------------------------------------------------------------- the options

def test_option_values_parse_or_name_the_option():
    assert parse_modes("7,4,2,16") == (7, 4, 2, 16) and parse_modes([2, 16]) == (2, 16)
    assert parse_input_size("20x24") == (20, 24) and parse_input_size("20") == (20, 20)
    assert parse_input_size("28X28x1") == (28, 28, 1) and parse_input_size((8, 8, 3)) == (8, 8, 3)
    for bad in ("", "7,a", "7,0,16", "7.5"):
        with pytest.raises(ValueError, match="--tt-modes takes comma-separated integers"):
            parse_modes(bad)
    for bad in ("20x", "0x4", "4x4x2", "1x2x3x4", "big"):
        with pytest.raises(ValueError, match=r"--input-size takes HxW or HxWxC"):
            parse_input_size(bad)


def test_fit_input_resizes_images_only_and_only_when_asked():
    from insitu.data import load_dataset

    digits = load_dataset("digits")
    assert fit_input(digits, None) is digits
    fitted = fit_input(digits, (12, 10, 3))
    assert fitted.sample_shape == (12, 10, 3) and len(fitted.y_train) == len(digits.y_train)

    class Features:
        kind, name, sample_shape = "features", "csv:t.csv", (16,)

    with pytest.raises(ValueError, match="--input-size resizes images, and --dataset csv:t.csv holds"):
        fit_input(Features(), (8, 8))
