"""The PE op schedule of TT training (insitu.tt.schedule) and its executors (insitu.tt.execute).

* op sizes against the paper's Table 3 (eq. 8-19) for the paper's two layers, MAC counts, padding;
* every op's buffer sizes are consistent along the schedule (what the driver allocates);
* check_op / layer_schedule refuse what the PEs cannot take;
* the fixed-point executor is bit-exact against an independent int64 einsum reference followed by
  the numerics spec's rounding shift and saturation; its scales follow AutoScale and persist;
* the float executor runs the schedule to the dense results.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from insitu.accel.params import DEFAULT_PARAMS
from insitu.numerics import TT_PE_DATA_BITS, TT_PE_HEADROOM_BITS, saturate, shift_round, tt_pe_format
from insitu.tt import (DEFAULT_LIMITS, PE_KINDS, FixedExecutor, FloatExecutor, Op, PELimits, TTMatrix,
                       check_op, factor_grad_ops, forward_ops, grad_buffer, input_grad_ops, layer_schedule,
                       macs_by_kind, weight_grad_op)

pytestmark = pytest.mark.unit

LAYER1 = ((7, 4, 2, 16), (4, 4, 2, 16), 16)      # 28x32 input -> 512 hidden, rank 16
LAYER2 = ((32, 16), (1, 16), 16)                 # 512 hidden -> 16 outputs (10 classes padded)
QMIN, QMAX = -(1 << 15), (1 << 15) - 1
#: AutoScale keeps the mean |x| of PE data in [0.1, 0.3] of the unit 2**(15 - headroom - frac): a
#: 16-bit word read as Q<headroom>.<15 - headroom> (Q4.11 in the spec).
UNIT_BITS = TT_PE_DATA_BITS - 1 - TT_PE_HEADROOM_BITS


def _unit(frac):
    return math.ldexp(1.0, UNIT_BITS - frac)


def _sizes(op):
    return (op.kind, op.eq, op.a, op.b, op.c, op.d)


# ================================================================================ Table 3

def _table3_formulas(I, J, R, B):
    """Eq. 8-13 of the paper's Table 3 in 1-based notation (I[1..d] etc.), ``a`` times the batch.

    Eq. 9 and 12 are given in the table for their first instance only; the later instances follow
    the same pattern one mode further (eq. 9: step n absorbs i_n; eq. 12: step n absorbs j_n).
    """
    d = len(I) - 1
    P = math.prod
    fwd = [("PE1", 8, B * P(I[1:d]), R[d], I[d], R[d - 1] * J[d])]
    for n in range(d - 1, 0, -1):
        if n > 1:
            fwd.append(("PE2", 9, B * P(I[1:n]), I[n] * R[n], P(J[n + 1:]), R[n - 1] * J[n]))
        else:
            fwd.append(("PE2", 10, B, I[1] * R[1], P(J[2:]), J[1]))
    bwd = []
    if d > 1:
        bwd.append(("PE2", 11, B, J[1], P(J[2:]), I[1] * R[1]))
    for n in range(2, d):
        bwd.append(("PE2", 12, B * P(I[1:n]), R[n - 1] * J[n], P(J[n + 1:]), I[n] * R[n]))
    bwd.append(("PE1", 13, B * P(I[1:d]), R[d - 1], J[d], I[d] * R[d]))
    return fwd, bwd


@pytest.mark.parametrize("layer", [LAYER1, LAYER2], ids=["layer1", "layer2"])
@pytest.mark.parametrize("batch", [1, 64])
def test_forward_and_input_grad_ops_match_table3(layer, batch):
    in_modes, out_modes, rank = layer
    d = len(in_modes)
    I, J = (None, *in_modes), (None, *out_modes)
    R = (1, *([rank] * (d - 1)), 1)
    fwd, bwd = _table3_formulas(I, J, R, batch)
    assert [_sizes(op) for op in forward_ops(in_modes, out_modes, rank, batch)] == fwd
    assert [_sizes(op) for op in input_grad_ops(in_modes, out_modes, rank, batch)] == bwd


def test_table3_literal_rows_for_the_first_layer():
    # The rows of Table 3 for d = 4, I = (7,4,2,16), J = (4,4,2,16), R = 16, per sample.
    ops = {op.eq: op for op in reversed(layer_schedule(*LAYER1, batch=1))}   # first op of each eq
    assert _sizes(ops[8]) == ("PE1", 8, 7 * 4 * 2, 1, 16, 16 * 16)
    assert _sizes(ops[9]) == ("PE2", 9, 7 * 4, 2 * 16, 16, 16 * 2)
    assert _sizes(ops[10]) == ("PE2", 10, 1, 7 * 16, 4 * 2 * 16, 4)
    assert _sizes(ops[11]) == ("PE2", 11, 1, 4, 4 * 2 * 16, 7 * 16)
    assert _sizes(ops[12]) == ("PE2", 12, 7, 16 * 4, 2 * 16, 4 * 16)
    assert _sizes(ops[13]) == ("PE1", 13, 7 * 4 * 2, 16, 16, 16)


# The whole schedule of each paper layer, hand-derived from the paper's equations (a includes the
# batch B). Factor-grad rows follow the code's documented sizes: Table 3 drops R_{d-1} from c of
# eq. 15 (c = J_{d-1} I_{d-1} R_{d-1} is what the buffers hold); the other rows match the table.
def _layer1_expected(B):
    return [
        ("PE1", 8, 56 * B, 1, 16, 256),
        ("PE2", 9, 28 * B, 32, 16, 32),
        ("PE2", 9, 7 * B, 64, 32, 64),
        ("PE2", 10, B, 112, 128, 4),
        ("PE2", 11, B, 4, 128, 112),
        ("PE2", 12, 7 * B, 64, 32, 64),
        ("PE2", 12, 28 * B, 32, 16, 32),
        ("PE1", 13, 56 * B, 16, 16, 16),
        ("PE3", None, 512 * 56, B, 16, 1),        # full-weight gradient (unnumbered in the paper)
        ("PE1", 14, 28 * 16 * 4, 1, 256, 16),     # J1I1 J2I2 J3I3 | 1 | J4I4 | R3
        ("PE1", 15, 28 * 16, 1, 4 * 16, 16),      # J1I1 J2I2 | 1 | J3I3 R3 | R2
        ("PE1", 16, 28, 1, 16 * 16, 16),          # J1I1 | 1 | J2I2 R2 | R1
        ("PE2", 17, 1, 28, 16 * 16, 16),          # 1 | J1I1 | J2I2 R2 | R1
        ("PE2", 18, 1, 28, 16 * 4 * 16, 16),      # 1 | J1I1 | J2I2 J3I3 R3 | R1
        ("PE2", 19, 1, 16 * 16, 4 * 16, 16),      # 1 | R1 J2I2 | J3I3 R3 | R2
        ("PE2", 18, 1, 28, 16 * 4 * 256, 16),     # gradient of G4: sweep by G1, G2, G3
        ("PE2", 19, 1, 16 * 16, 4 * 256, 16),
        ("PE2", 19, 1, 16 * 4, 256, 16),
    ]


def _layer2_expected(B):
    return [
        ("PE1", 8, 32 * B, 1, 16, 256),
        ("PE2", 10, B, 512, 16, 1),
        ("PE2", 11, B, 1, 16, 512),
        ("PE1", 13, 32 * B, 16, 16, 16),
        ("PE3", None, 16 * 32, B, 16, 1),
        ("PE1", 14, 32, 1, 256, 16),
        ("PE2", 17, 1, 32, 256, 16),
    ]


@pytest.mark.parametrize("layer,expected", [(LAYER1, _layer1_expected), (LAYER2, _layer2_expected)],
                         ids=["layer1", "layer2"])
@pytest.mark.parametrize("batch", [1, 64])
def test_whole_layer_schedule_of_the_paper(layer, expected, batch):
    ops = layer_schedule(*layer, batch=batch)
    assert [_sizes(op) for op in ops] == expected(batch)
    phases = [op.phase for op in ops]
    n_fwd = len(layer[0])
    assert phases == (["forward"] * n_fwd + ["input-grad"] * n_fwd + ["weight-grad"]
                      + ["factor-grad"] * (len(ops) - 2 * n_fwd - 1))
    assert ops[n_fwd - 1].dst == "y" and ops[2 * n_fwd - 1].dst == "dx"
    assert ops[2 * n_fwd].src == "dy" and ops[2 * n_fwd].src2 == "x" and ops[2 * n_fwd].dst == "dw"
    # without the input gradient (the first layer of a network) those ops are left out
    no_dx = layer_schedule(*layer, batch=batch, input_grad=False)
    assert [_sizes(op) for op in no_dx] == expected(batch)[:n_fwd] + expected(batch)[2 * n_fwd:]
    # the paper's layers fit the default PEs; the largest factor operand fills the buffer exactly
    assert max(op.factor_words for op in ops) == DEFAULT_LIMITS.factor_words == 4096


@pytest.mark.parametrize("layer", [LAYER1, LAYER2], ids=["layer1", "layer2"])
def test_macs(layer):
    ops = layer_schedule(*layer, batch=8)
    for op in ops:
        if op.kind == "PE3":
            assert op.macs == op.useful_macs == op.a * op.b * op.c
            assert op.c_padded == op.c
        else:
            assert op.macs == op.a * op.b * op.c_padded * op.d
            assert op.useful_macs == op.a * op.b * op.c * op.d <= op.macs
        desc = op.describe()
        assert (desc["macs"], desc["c_padded"], desc["factor_words"]) == (op.macs, op.c_padded, op.factor_words)
        assert desc["kind"] == op.kind and desc["a"] == op.a
        assert op.kind in str(op) and f"macs={op.macs}" in str(op)
    totals = macs_by_kind(ops)
    assert set(totals) == set(PE_KINDS)
    for kind in PE_KINDS:
        assert totals[kind] == sum(op.macs for op in ops if op.kind == kind)
    assert sum(totals.values()) == sum(op.macs for op in ops)
    assert macs_by_kind([]) == {kind: 0 for kind in PE_KINDS}


def test_macs_of_the_first_layer_by_hand():
    B = 2
    totals = macs_by_kind(layer_schedule(*LAYER1, batch=B))
    pe1 = pe2 = pe3 = 0
    for kind, _, a, b, c, d in _layer1_expected(B):
        if kind == "PE3":
            pe3 += a * b * c
        elif kind == "PE1":
            pe1 += a * b * (-(-c // 16) * 16) * d
        else:
            pe2 += a * b * (-(-c // 16) * 16) * d
    assert totals == {"PE1": pe1, "PE2": pe2, "PE3": pe3}
    assert totals["PE3"] == 512 * 896 * B         # the outer product: J * I per sample


# ================================================================================ structure

@st.composite
def layouts(draw, max_d=4, max_mode=5, max_rank=6, last_in=None):
    d = draw(st.integers(1, max_d))
    in_modes = draw(st.lists(st.integers(1, max_mode), min_size=d, max_size=d))
    if last_in is not None:
        in_modes[-1] = draw(st.sampled_from(last_in))
    out_modes = draw(st.lists(st.integers(1, max_mode), min_size=d, max_size=d))
    ranks = draw(st.lists(st.integers(1, max_rank), min_size=d - 1, max_size=d - 1))
    return tuple(in_modes), tuple(out_modes), tuple(ranks)


def _check_buffer_sizes(ops, in_modes, out_modes, ranks, batch):
    """Every op reads buffers of the size its a, b, c say and that an earlier op wrote."""
    d = len(in_modes)
    I, J = math.prod(in_modes), math.prod(out_modes)
    R = (1, *ranks, 1)
    core_sizes = [R[n] * out_modes[n] * in_modes[n] * R[n + 1] for n in range(d)]
    size = {"x": batch * I, "dy": batch * J}
    for op in ops:
        assert op.src in size, f"{op} reads {op.src} before it is written"
        if op.kind == "PE3":
            assert (op.src, op.src2, op.d) == ("dy", "x", 1)
            assert size["dy"] == op.b * J and size["x"] == op.b * I
            assert op.a * op.c == I * J and op.c == in_modes[-1]
            size[op.dst] = op.a * op.c
            continue
        assert size[op.src] == op.a * op.b * op.c, str(op)
        # the factor operand is the whole core, reordered
        if op.kind == "PE1":
            assert op.b * op.d * op.c == core_sizes[op.core], str(op)
            size[op.dst] = op.a * op.d
        else:
            assert op.b * op.d == core_sizes[op.core], str(op)
            size[op.dst] = op.a * op.d * op.c
        assert sorted(op.factor_axes) == [0, 1, 2, 3]
    return size, core_sizes


@settings(max_examples=60, deadline=None)
@given(layouts(max_mode=9, max_rank=9, last_in=(16, 32)), st.integers(1, 8))
def test_schedule_buffer_sizes_are_consistent(layout, batch):
    in_modes, out_modes, ranks = layout
    d = len(in_modes)
    ops = _all_ops(in_modes, out_modes, ranks, batch)          # layer_schedule without check_op
    try:
        assert layer_schedule(in_modes, out_modes, ranks, batch) == ops
    except ValueError:                                          # some op exceeds the default PEs
        with pytest.raises(ValueError):
            for op in ops:
                check_op(op)
    size, core_sizes = _check_buffer_sizes(ops, in_modes, out_modes, ranks, batch)
    assert size["y"] == batch * math.prod(out_modes)
    assert size["dx"] == batch * math.prod(in_modes)
    assert size["dw"] == math.prod(in_modes) * math.prod(out_modes)
    for n in range(d):
        assert size[grad_buffer(n, d)] == core_sizes[n]
    assert len(ops) == 2 * d + 1 + (d - 1) + d * (d - 1) // 2
    for op in ops:
        assert op.kind in PE_KINDS
        assert op.c_padded % 16 == 0 and op.c <= op.c_padded < op.c + 16
        if op.kind != "PE3":
            assert op.factor_words == op.b * op.d * (op.c_padded if op.kind == "PE1" else 1)


@pytest.mark.parametrize("layer", [LAYER1, LAYER2], ids=["layer1", "layer2"])
def test_paper_layer_buffer_sizes_are_consistent(layer):
    in_modes, out_modes, rank = layer
    d = len(in_modes)
    ops = layer_schedule(in_modes, out_modes, rank, batch=4)
    size, core_sizes = _check_buffer_sizes(ops, in_modes, out_modes, (rank,) * (d - 1), 4)
    assert [size[grad_buffer(n, d)] for n in range(d)] == core_sizes
    assert all(op.c % 16 == 0 for op in ops)      # the paper pads so that no op needs padding


def test_grad_buffer_names():
    assert grad_buffer(0, 1) == "dw"
    assert [grad_buffer(n, 3) for n in range(3)] == ["dg.1", "dg.2", "dg.3"]
    assert {op.dst for op in factor_grad_ops((2, 3, 4), (2, 2, 2), 2)} >= {"dg.1", "dg.2", "dg.3"}
    assert factor_grad_ops((16,), (4,), 1) == []


# ================================================================================ check_op

def _op(kind="PE1", a=4, b=2, c=16, d=3, **kw):
    return Op(kind, "forward", 8, "src", "dst.name", a=a, b=b, c=c, d=d, **kw)


@pytest.mark.parametrize("op,limits,match", [
    (_op("PE4"), DEFAULT_LIMITS, r"op 'dst.name': unknown PE kind 'PE4'"),
    (_op("pe1"), DEFAULT_LIMITS, r"unknown PE kind 'pe1'"),
    (_op(a=0), DEFAULT_LIMITS, r"PE1 op 'dst.name': size a=0 must be an integer >= 1"),
    (_op("PE2", b=0), DEFAULT_LIMITS, r"PE2 op 'dst.name': size b=0 must be an integer >= 1"),
    (_op(c=-16), DEFAULT_LIMITS, r"size c=-16 must be an integer >= 1"),
    (_op(d=2.0), DEFAULT_LIMITS, r"size d=2.0 must be an integer >= 1"),
    (_op(d=True), DEFAULT_LIMITS, r"size d=True must be an integer >= 1"),
    (_op(a=(1 << 16)), DEFAULT_LIMITS, r"PE1 op 'dst.name': size a=65536 exceeds the PE's size register \(max 65535\)"),
    (_op("PE2", c=200), PELimits(size_max=100), r"PE2 op 'dst.name': size c=200 exceeds .*max 100"),
    (_op("PE1", b=16, d=16, c=32), DEFAULT_LIMITS,
     r"PE1 op 'dst.name': the factor operand needs 8192 words; the PE buffer holds 4096"),
    (_op("PE1", b=1, d=16, c=1), PELimits(factor_words=255),
     r"needs 256 words; the PE buffer holds 255"),                   # c pads to 16 lanes
    (_op("PE2", b=65, d=64), DEFAULT_LIMITS, r"PE2 op 'dst.name': the factor operand needs 4160 words"),
    (_op("PE3", a=4, b=8, c=10, d=1), DEFAULT_LIMITS,
     r"PE3 op 'dst.name': c = I_d = 10 must be a multiple of 16"),
    (_op("PE3", a=4, b=8, c=16, d=2), DEFAULT_LIMITS, r"PE3 op 'dst.name': d must be 1"),
    (_op("PE3", a=4, b=8, c=4112, d=1), DEFAULT_LIMITS, r"PE3 op 'dst.name': the factor operand needs 4112 words"),
])
def test_check_op_refuses(op, limits, match):
    with pytest.raises(ValueError, match=match):
        check_op(op, limits)


def test_check_op_accepts_the_limits_exactly():
    assert check_op(_op(a=(1 << 16) - 1)) is None
    assert check_op(_op("PE1", b=16, d=16, c=16)) is None          # 4096 words
    assert check_op(_op("PE1", b=1, d=16, c=5), PELimits(factor_words=256)) is None
    assert check_op(_op("PE2", b=64, d=64, c=3)) is None
    assert check_op(_op("PE3", a=7, b=3, c=32, d=1)) is None
    for op in layer_schedule(*LAYER1, batch=64) + layer_schedule(*LAYER2, batch=64):
        check_op(op)


@pytest.mark.parametrize("batch", [0, -1, 2.0, True, None])
def test_layer_schedule_refuses_a_bad_batch(batch):
    with pytest.raises(ValueError, match=r"batch must be an integer >= 1"):
        layer_schedule(*LAYER2, batch=batch)


def test_layer_schedule_checks_every_op():
    with pytest.raises(ValueError, match=r"PE3 op 'dw': c = I_d = 10 must be a multiple of 16"):
        layer_schedule((3, 10), (2, 2), 2, batch=4)
    with pytest.raises(ValueError, match=r"PE1 op 'fwd.1': the factor operand needs 4096 words; the PE buffer holds 2048"):
        layer_schedule(*LAYER1, batch=4, limits=PELimits(factor_words=2048))
    with pytest.raises(ValueError, match=r"size a=.* exceeds the PE's size register"):
        layer_schedule(*LAYER1, batch=2048)                           # a = 56 * 2048 > 65535
    with pytest.raises(ValueError, match=r"same number of modes"):
        layer_schedule((3, 16), (2,), 2, batch=4)


# ================================================================================ float executor

def _dense(ttm):
    return ttm.full()


def _run_float(ops, buffers, ttm):
    ex = FloatExecutor()
    assert not ex.quantized
    for op in ops:
        ex.run(op, buffers, ttm.cores, (ttm.out_modes, ttm.in_modes))
    return buffers


@pytest.mark.parametrize("layer", [LAYER1, LAYER2, ((3, 2, 16), (2, 3, 2), 5), ((16,), (5,), 1)],
                         ids=["layer1", "layer2", "rank5", "d1"])
def test_float_executor_runs_the_schedule_to_the_dense_results(layer):
    in_modes, out_modes, ranks = layer
    rng = np.random.default_rng(1)
    ttm = TTMatrix(in_modes, out_modes, ranks, seed=2)
    w = _dense(ttm)
    batch = 3
    x, dy = rng.standard_normal((batch, w.shape[1])), rng.standard_normal((batch, w.shape[0]))
    # the forward schedule alone equals TTMatrix.forward and X W^T
    fwd = _run_float(forward_ops(in_modes, out_modes, ranks, batch), {"x": x.ravel()}, ttm)
    y = fwd["y"].reshape(batch, -1)
    np.testing.assert_array_equal(y, ttm.forward(x))
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-9, atol=1e-12)
    # the whole training step of the layer
    buffers = _run_float(layer_schedule(in_modes, out_modes, ranks, batch),
                         {"x": x.ravel(), "dy": dy.ravel()}, ttm)
    np.testing.assert_allclose(buffers["y"].reshape(batch, -1), x @ w.T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(buffers["dx"].reshape(batch, -1), dy @ w, rtol=1e-9, atol=1e-12)
    dw = buffers["dw"].reshape(*(m for pair in zip(out_modes, in_modes) for m in pair))
    d = len(in_modes)
    order = [2 * n for n in range(d)] + [2 * n + 1 for n in range(d)]
    np.testing.assert_allclose(dw.transpose(order).reshape(w.shape), dy.T @ x, rtol=1e-12, atol=1e-12)
    direct = ttm.factor_grads(x, dy, "direct") if d < 4 else ttm.factor_grads(x, dy, "full")
    for n in range(d):
        g = buffers[grad_buffer(n, d)].reshape(ttm.cores[n].shape)
        np.testing.assert_allclose(g, direct[n], rtol=1e-8, atol=1e-10 * np.abs(direct[n]).max())


def test_padding_changes_no_result():
    # Ranks 5: several ops have a c that is not a multiple of 16 and run zero-padded.
    in_modes, out_modes, ranks = (3, 2, 16), (2, 3, 2), 5
    ops = layer_schedule(in_modes, out_modes, ranks, batch=3)
    padded = [op for op in ops if op.c % 16]
    assert {op.kind for op in padded} == {"PE1", "PE2"}
    assert any(op.phase == "factor-grad" for op in padded)
    ttm = TTMatrix(in_modes, out_modes, ranks, seed=3)
    rng = np.random.default_rng(4)
    ex = FloatExecutor()
    for op in padded:
        src = rng.standard_normal(op.a * op.b * op.c)
        buffers = {op.src: src}
        ex.run(op, buffers, ttm.cores, (out_modes, in_modes))
        g = ttm.cores[op.core].transpose(op.factor_axes)
        z = src.reshape(op.a, op.b, op.c)
        if op.kind == "PE1":
            expected = np.einsum("abc,bdc->ad", z, g.reshape(op.b, op.d, op.c))
        else:
            expected = np.einsum("abc,bd->adc", z, g.reshape(op.b, op.d))
        np.testing.assert_allclose(buffers[op.dst], expected.ravel(), rtol=1e-12, atol=1e-12)


# ================================================================================ fixed executor

def _reference_acc(op, src, other, out_modes, in_modes):
    """Exact int64 sums of one op, written from the op definitions (no code shared with execute)."""
    src = np.asarray(src, dtype=np.int64)
    if op.kind == "PE3":
        d = len(in_modes)
        letters = iter("abcdefghijklmnopqr")
        j_ax = [next(letters) for _ in range(d)]
        i_ax = [next(letters) for _ in range(d)]
        out = "".join(j + i for j, i in zip(j_ax, i_ax))          # interleaved j_1 i_1 .. j_d i_d
        spec = f"s{''.join(j_ax)},s{''.join(i_ax)}->{out}"
        dy = src.reshape(op.b, *out_modes)
        x = np.asarray(other, dtype=np.int64).reshape(op.b, *in_modes)
        return np.einsum(spec, dy, x).ravel()
    g = np.asarray(other, dtype=np.int64).transpose(op.factor_axes)
    z = src.reshape(op.a, op.b, op.c)
    if op.kind == "PE1":
        return np.einsum("abc,bdc->ad", z, g.reshape(op.b, op.d, op.c)).ravel()
    return np.einsum("abc,bd->adc", z, g.reshape(op.b, op.d)).ravel()


def _random_codes(rng, n, bits, amplitude_bits=None):
    top = 1 << ((amplitude_bits if amplitude_bits is not None else bits) - 1)
    return rng.integers(-top, top, size=n, dtype=np.int64)


def _all_ops(in_modes, out_modes, ranks, batch):
    return (forward_ops(in_modes, out_modes, ranks, batch) + input_grad_ops(in_modes, out_modes, ranks, batch)
            + [weight_grad_op(in_modes, out_modes, batch)] + factor_grad_ops(in_modes, out_modes, ranks))


def _run_one_fixed(op, rng, cores, core_fracs, modes, amplitude_bits=16, src_frac=None, executor=None):
    """Runs ``op`` once on fresh random codes; returns (executor, buffers, fracs, acc, acc_frac)."""
    out_modes, in_modes = modes
    ex = executor or FixedExecutor()
    src = _random_codes(rng, op.b * math.prod(out_modes) if op.kind == "PE3" else op.a * op.b * op.c,
                        16, amplitude_bits)
    fracs = {op.src: int(rng.integers(-4, 21)) if src_frac is None else src_frac}
    buffers = {op.src: src}
    if op.kind == "PE3":
        buffers[op.src2] = _random_codes(rng, op.b * math.prod(in_modes), 16, amplitude_bits)
        fracs[op.src2] = int(rng.integers(-4, 21))
        other, other_frac = buffers[op.src2], fracs[op.src2]
    else:
        other, other_frac = cores[op.core], core_fracs[op.core]
    acc = _reference_acc(op, src, other, out_modes, in_modes)
    acc_frac = fracs[op.src] + other_frac
    ex.run(op, buffers, fracs, cores, core_fracs, modes)
    return ex, buffers, fracs, acc, acc_frac


def _check_bit_exact(op, buffers, fracs, acc, acc_frac):
    out, out_frac = buffers[op.dst], fracs[op.dst]
    expected = saturate(shift_round(acc, acc_frac - out_frac), TT_PE_DATA_BITS)
    assert out.dtype == np.int64 and out.shape == expected.shape
    np.testing.assert_array_equal(out, expected, err_msg=str(op))
    np.testing.assert_array_equal(out, tt_pe_format(out_frac).requantize(acc, acc_frac))
    assert out.min() >= QMIN and out.max() <= QMAX


def _check_first_scale(op, buffers, fracs, acc, acc_frac):
    """The first run's scale puts the mean |output| in [0.1, 0.3] units (see UNIT_BITS)."""
    out, out_frac = buffers[op.dst], fracs[op.dst]
    if not acc.any():
        # nothing to scale by: the default scale, as near as the PEs' SHIFT range allows
        shift = min(max(acc_frac - 15, DEFAULT_PARAMS.shift_min), DEFAULT_PARAMS.shift_max)
        assert out_frac == acc_frac - shift and not out.any()
        return
    unit = _unit(out_frac)
    exact = np.mean(np.abs(np.ldexp(acc.astype(np.float64), -acc_frac))) / unit
    assert 0.1 <= exact <= 0.3, (str(op), exact)
    if out.min() > QMIN and out.max() < QMAX:                 # not saturating
        quantized = np.mean(np.abs(tt_pe_format(out_frac).to_float(out))) / unit
        lsb = 2.0**-UNIT_BITS                                 # rounding moves the mean by <= 1/2 LSB
        assert 0.1 - lsb <= quantized <= 0.3 + lsb, (str(op), quantized)


def _random_cores(rng, in_modes, out_modes, ranks, bits=4):
    R = (1, *ranks, 1)
    shapes = [(R[n], out_modes[n], in_modes[n], R[n + 1]) for n in range(len(in_modes))]
    return ([_random_codes(rng, math.prod(s), bits).reshape(s) for s in shapes],
            [int(rng.integers(0, 7)) for _ in shapes])


@settings(max_examples=30, deadline=None)
@given(layouts(max_d=3, max_mode=4, max_rank=5), st.integers(1, 3), st.integers(1, 16),
       st.integers(0, 2**31 - 1))
def test_fixed_executor_is_bit_exact_on_random_ops(layout, batch, amplitude_bits, seed):
    in_modes, out_modes, ranks = layout
    rng = np.random.default_rng(seed)
    cores, core_fracs = _random_cores(rng, in_modes, out_modes, ranks)
    for op in _all_ops(in_modes, out_modes, ranks, batch):
        try:
            check_op(op)
        except ValueError:
            continue          # the golden model refuses what the PEs cannot take (PE3: I_d % 16)
        ex, buffers, fracs, acc, acc_frac = _run_one_fixed(op, rng, cores, core_fracs, (out_modes, in_modes),
                                                           amplitude_bits)
        _check_bit_exact(op, buffers, fracs, acc, acc_frac)
        _check_first_scale(op, buffers, fracs, acc, acc_frac)
        assert set(ex.state()) == {op.dst}


@pytest.mark.parametrize("layer", [LAYER1, LAYER2, ((3, 2, 16), (2, 3, 2), (5, 3))],
                         ids=["layer1", "layer2", "rank5"])
def test_fixed_executor_is_bit_exact_on_the_paper_layers(layer):
    in_modes, out_modes, ranks = layer
    d = len(in_modes)
    ranks = (ranks,) * (d - 1) if isinstance(ranks, int) else ranks
    rng = np.random.default_rng(11)
    cores, core_fracs = _random_cores(rng, in_modes, out_modes, ranks)
    shifts = set()
    for op in layer_schedule(in_modes, out_modes, ranks, batch=2):
        # full 16-bit gradients, and 8-bit activations (which need left shifts on small sums)
        for amplitude_bits, src_frac in ((16, 12), (3, 6)):
            _, buffers, fracs, acc, acc_frac = _run_one_fixed(op, rng, cores, core_fracs,
                                                              (out_modes, in_modes), amplitude_bits, src_frac)
            _check_bit_exact(op, buffers, fracs, acc, acc_frac)
            _check_first_scale(op, buffers, fracs, acc, acc_frac)
            shifts.add(np.sign(acc_frac - fracs[op.dst]))
    assert {-1, 1} <= shifts                              # both right and left shifts were exercised


def test_fixed_executor_rounds_half_up_and_saturates():
    # A hand-made PE2 op: out = sum_b z(a, b, c) g(b, d), one term, so the sums are the codes.
    op = Op("PE2", "forward", 10, "z", "out", a=1, b=1, c=6, d=1, core=0, factor_axes=(0, 1, 2, 3),
            len_b=2, len_d=2)
    core = np.ones((1, 1, 1, 1), dtype=np.int64)
    ex = FixedExecutor()
    ex.load_state({"out": 1})                             # fix the output scale: frac 1
    z = np.array([3, -3, 5, -5, QMAX, QMIN], dtype=np.int64)
    buffers, fracs = {"z": z}, {"z": 2}
    ex.run(op, buffers, fracs, [core], [0], ((1,), (1,)))
    # codes of 2**-2 -> codes of 2**-1: x / 2 rounded half up
    np.testing.assert_array_equal(buffers["out"], [2, -1, 3, -2, 1 << 14, -(1 << 14)])
    assert fracs["out"] == 1
    buffers, fracs = {"z": z}, {"z": -2}                  # left shift by 3: saturates
    ex.load_state({"out": 1})
    ex.run(op, buffers, fracs, [core], [0], ((1,), (1,)))
    np.testing.assert_array_equal(buffers["out"], [24, -24, 40, -40, QMAX, QMIN])


def test_fixed_executor_refuses_codes_outside_their_width():
    op = Op("PE2", "forward", 10, "z", "out", a=1, b=1, c=2, d=1, core=0, factor_axes=(0, 1, 2, 3),
            len_b=2, len_d=2)
    ex = FixedExecutor()
    with pytest.raises(ValueError, match=r"operand z holds codes outside the 16-bit range"):
        ex.run(op, {"z": np.array([0, 1 << 15])}, {"z": 0}, [np.ones((1, 1, 1, 1), dtype=np.int64)],
               [0], ((1,), (1,)))
    with pytest.raises(ValueError, match=r"operand core 1 holds codes outside the 4-bit range"):
        ex.run(op, {"z": np.array([0, 1])}, {"z": 0}, [np.full((1, 1, 1, 1), 8, dtype=np.int64)],
               [0], ((1,), (1,)))


def _pe2_setup(seed=0):
    in_modes, out_modes, ranks = (3, 4), (2, 5), (3,)
    rng = np.random.default_rng(seed)
    cores, core_fracs = _random_cores(rng, in_modes, out_modes, ranks)
    op = forward_ops(in_modes, out_modes, ranks, batch=4)[1]   # PE2, eq. 10
    assert op.kind == "PE2"
    src = _random_codes(rng, op.a * op.b * op.c, 16, amplitude_bits=10)
    return op, src, cores, core_fracs, (out_modes, in_modes)


def _run(ex, op, src, frac, cores, core_fracs, modes, prefix=""):
    buffers, fracs = {op.src: src}, {op.src: frac}
    ex.run(op, buffers, fracs, cores, core_fracs, modes, prefix)
    return buffers[op.dst], fracs[op.dst]


def test_scale_follows_data_eight_times_larger():
    op, src, cores, core_fracs, modes = _pe2_setup()
    ex = FixedExecutor()
    out1, f1 = _run(ex, op, src, 9, cores, core_fracs, modes)
    s1 = ex.state()[op.dst]
    assert abs(s1 - f1) <= 1
    # Second run on 8x the data: the output uses the scale carried from the first run; the scale
    # then moves toward larger values (smaller frac).
    out2, f2 = _run(ex, op, src * 8, 9, cores, core_fracs, modes)
    assert f2 == s1
    assert ex.state()[op.dst] < s1
    # after a few runs it has settled where the mean |output| is back in the band: about 3 steps
    for _ in range(4):
        out, f = _run(ex, op, src * 8, 9, cores, core_fracs, modes)
    assert f1 - 4 <= f <= f1 - 2
    assert 0.1 <= np.mean(np.abs(tt_pe_format(f).to_float(out))) / _unit(f) <= 0.3
    # and it comes back when the data shrinks again
    for _ in range(6):
        out, f = _run(ex, op, src, 9, cores, core_fracs, modes)
    assert abs(f - f1) <= 1
    # a fresh executor on the 8x data picks about 3 steps below the first
    _, f_fresh = _run(FixedExecutor(), op, src * 8, 9, cores, core_fracs, modes)
    assert f1 - 4 <= f_fresh <= f1 - 2


def test_state_round_trip_and_prefixes():
    op, src, cores, core_fracs, modes = _pe2_setup(seed=1)
    ex = FixedExecutor()
    _run(ex, op, src, 9, cores, core_fracs, modes)
    _run(ex, op, src * 8, 9, cores, core_fracs, modes, prefix="layer2.")
    state = ex.state()
    assert set(state) == {op.dst, "layer2." + op.dst}
    assert all(isinstance(v, int) for v in state.values())
    assert state[op.dst] - state["layer2." + op.dst] in (2, 3, 4)     # independent scales per prefix
    loaded = FixedExecutor()
    loaded.load_state(dict(state))
    assert loaded.state() == state
    for prefix, data in (("", src * 3), ("layer2.", src)):
        a = _run(ex, op, data, 9, cores, core_fracs, modes, prefix)
        b = _run(loaded, op, data, 9, cores, core_fracs, modes, prefix)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1] == b[1] == state[prefix + op.dst]                # the loaded scale was used
    assert loaded.state() == ex.state()
    # a loaded scale is used at the first run instead of a scale from the data
    pinned = FixedExecutor()
    pinned.load_state({op.dst: 2})
    out, frac = _run(pinned, op, src, 9, cores, core_fracs, modes)
    assert frac == 2


def test_fixed_executor_refuses_accumulators_beyond_53_bits():
    # PE3 with 16 x 16-bit products: 2**22 samples need a 54-bit accumulator. The check comes
    # before any buffer is read, so no large buffer is needed.
    # PEs with wider size registers than the default (else check_op refuses b first).
    wide = PELimits(size_max=1 << 30)
    op = Op("PE3", "weight-grad", None, "dy", "dw", a=1, b=1 << 22, c=16, d=1, src2="x")
    buffers = {"dy": np.zeros(1, dtype=np.int64), "x": np.zeros(1, dtype=np.int64)}
    with pytest.raises(ValueError, match=r"PE3 op 'dw': a 54-bit accumulator .* exceeds the 53 bits"):
        FixedExecutor(wide).run(op, buffers, {"dy": 0, "x": 0}, [], [], ((1,), (16,)))
    op = Op("PE3", "weight-grad", None, "dy", "dw", a=1, b=(1 << 21) - 1, c=16, d=1, src2="x")
    with pytest.raises(ValueError, match=r"buffer 'dy' holds 1 values"):   # 53 bits pass the check
        FixedExecutor(wide).run(op, buffers, {"dy": 0, "x": 0}, [], [], ((1,), (16,)))


def test_fixed_executor_refuses_an_op_the_pes_cannot_take():
    op = Op("PE2", "forward", 9, "z", "out", a=1, b=70_000, c=16, d=1, core=0,
            factor_axes=(0, 1, 2, 3), len_b=2, len_d=2)
    with pytest.raises(ValueError, match=r"size b=70000 exceeds the PE's size register"):
        FixedExecutor().run(op, {"z": np.zeros(16 * 70_000, dtype=np.int64)}, {"z": 0},
                            [np.zeros((1, 1, 70_000, 1), dtype=np.int64)], [0], ((1,), (70_000,)))


def test_fixed_forward_chain_tracks_the_float_forward():
    # The forward schedule in fixed point (4-bit cores, 16-bit intermediates) against the float
    # forward with the same quantized cores: the 16-bit rounding errors are small.
    in_modes, out_modes, rank = LAYER2
    rng = np.random.default_rng(5)
    ttm = TTMatrix(in_modes, out_modes, rank, seed=6)
    fracs_core, codes = [], []
    for core in ttm.cores:
        frac = 3 - int(np.ceil(np.log2(np.abs(core).max())))       # 4-bit codes fill [-8, 7]
        codes.append(np.clip(np.round(np.ldexp(core, frac)), -8, 7).astype(np.int64))
        fracs_core.append(frac)
    q = TTMatrix(in_modes, out_modes, rank, cores=[np.ldexp(c.astype(float), -f) for c, f in zip(codes, fracs_core)])
    x = rng.random((8, 512))
    x_frac = 8                                                  # 8-bit activations in [0, 1)
    x_codes = np.floor(np.ldexp(x, x_frac)).astype(np.int64)
    expected = q.forward(np.ldexp(x_codes.astype(float), -x_frac))
    ex = FixedExecutor()
    buffers, fracs = {"x": x_codes.ravel()}, {"x": x_frac}
    for op in forward_ops(in_modes, out_modes, rank, batch=8):
        ex.run(op, buffers, fracs, codes, fracs_core, (out_modes, in_modes))
    y = tt_pe_format(fracs["y"]).to_float(buffers["y"]).reshape(8, -1)
    err = np.sqrt(np.mean((y - expected) ** 2)) / np.sqrt(np.mean(expected ** 2))
    assert err < 1e-3, err


def test_observe_false_leaves_the_scale_alone():
    op, src, cores, core_fracs, modes = _pe2_setup(seed=2)
    ex = FixedExecutor()
    out1, f1 = _run(ex, op, src, 9, cores, core_fracs, modes)
    state = ex.state()
    buffers, fracs = {op.src: src * 8}, {op.src: 9}
    ex.run(op, buffers, fracs, cores, core_fracs, modes, observe=False)
    assert ex.state() == state and fracs[op.dst] == state[op.dst]
    # the output is the same as an observing run at the same scale
    twin = FixedExecutor()
    twin.load_state(state)
    out, frac = _run(twin, op, src * 8, 9, cores, core_fracs, modes)
    np.testing.assert_array_equal(buffers[op.dst], out)
    assert frac == fracs[op.dst] and twin.state()[op.dst] < state[op.dst]
