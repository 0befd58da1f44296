"""The MCU training compiler: autodiff, pruning, DCE, reordering, memory plan, generated module."""

import re

import numpy as np
import pytest

from insitu.errors import InsituError, UsageError
from insitu.sparse import abi
from insitu.sparse import scheme as S
from insitu.sparse.calibrate import calibrate_gradients
from insitu.sparse.compiler import Options, compile_training, lifetimes, live_peak, reads, writes
from insitu.sparse.graph import random_graph
from insitu.resources import package_dir

pytestmark = pytest.mark.unit


def _setup(seed):
    g = random_graph(seed)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(12, 1) + g.tensors[g.input].shape[1:]).astype(np.int8)
    y = rng.integers(0, g.num_classes, size=12)
    return g, calibrate_gradients(g, x, y)


def _schemes(g):
    convs = [c.name for c in g.convs]
    return [S.full_update(g), S.bias_only(g, 2), S.classifier_only(g), S.last_k_layers(g, 3),
            S.Scheme(3, {"b1.dw": 0.5, convs[-1]: 1.0}), S.Scheme(1, {"b1.expand": 0.25, convs[-1]: 1.0})]


@pytest.mark.parametrize("seed", range(4))
def test_live_buffers_never_share_arena_bytes(seed):
    g, gs = _setup(seed)
    for sch in _schemes(g):
        for reorder in (False, True):
            c = compile_training(g, sch, gs, Options(reorder=reorder))
            span = lifetimes(c.train_ops)
            bufs = [b for b in span if b.offset >= 0]
            for i, a in enumerate(bufs):
                assert a.offset + a.nbytes <= c.arena_bytes
                assert a.offset % 4 == 0
                for b in bufs[i + 1:]:
                    both_live = a.persistent or b.persistent or not (span[a][1] < span[b][0] or span[b][1] < span[a][0])
                    disjoint = a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
                    assert not both_live or disjoint, (sch.describe(), a, b)


@pytest.mark.parametrize("seed", range(3))
def test_the_live_peak_is_the_most_bytes_live_at_one_op_and_bounds_the_arena(seed):
    # Brute force over the timeline: at each op, every placed persistent buffer plus the
    # transient ones whose lifetime covers it. (c.train_ops is the plan's timeline without argmax,
    # which only reads the logits the loss reads next, and the apply segment, empty without
    # accumulation: the same live sets.)
    g, gs = _setup(seed)
    for sch in _schemes(g):
        c = compile_training(g, sch, gs, Options(reorder=True))
        span = lifetimes(c.train_ops)
        always = sum(b.nbytes for b in c.buffers if b.persistent and b.offset >= 0)
        most = max(always + sum(b.nbytes for b, (lo, hi) in span.items() if not b.persistent and lo <= i <= hi)
                   for i in range(len(c.train_ops)))
        peak = c.stats["live_peak"]
        assert peak["bytes"] == most, sch.describe()
        assert sum(peak["by_kind"].values()) == peak["bytes"] <= c.arena_bytes
        assert "program" not in peak["by_kind"], "the program table is not in the arena"
        less = live_peak(c.buffers, c.train_ops, ("input",))
        assert "input" not in less["by_kind"] and less["bytes"] <= peak["bytes"]
        assert peak["bytes"] >= 0.75 * c.arena_bytes, "the plan wastes a quarter of the arena"


@pytest.mark.parametrize("seed", range(3))
def test_pruning_and_dce_keep_exactly_the_scheme_updates(seed):
    g, gs = _setup(seed)
    for sch in _schemes(g):
        c = compile_training(g, sch, gs)
        updated = {(op.node, op.kind) for op in c.train_ops if op.sink}
        expect = {(n, "conv_upd_w") for n in sch.weights} | {(n, "bias_upd") for n in sch.bias_layers(g)}
        assert updated == expect
        # backpropagation stops at the deepest trained layer: no input gradient below it
        depth = sch.depth(g)
        below = {c_.name for c_ in g.convs[:depth + 1]}
        assert not [op for op in c.train_ops if op.kind == "conv_bwd_x" and op.node in below]
        # DCE: nothing computed that no update needs
        needed = set()
        for op in reversed(c.train_ops):
            if op.phase == "bwd":
                assert writes(op) & needed, f"dead op {op.kind} of {op.node} survived"
            if op.phase != "fwd":
                needed |= reads(op)


@pytest.mark.parametrize("seed", range(3))
def test_reordering_removes_gradient_buffers_and_never_plans_more(seed):
    g, gs = _setup(seed)
    for sch in _schemes(g):
        plain = compile_training(g, sch, gs, Options(reorder=False))
        fused = compile_training(g, sch, gs, Options(reorder=True))
        assert "gradbuf" in plain.stats["bytes_by_kind"]
        assert "gradbuf" not in fused.stats["bytes_by_kind"]
    # where gradients are most of the memory (the full update), applying them in place pays
    full = compile_training(g, S.full_update(g), gs, Options(reorder=False))
    assert compile_training(g, S.full_update(g), gs).arena_bytes < full.arena_bytes
    # and a sparse scheme plans far less than the full update
    assert compile_training(g, S.bias_only(g, 2), gs).arena_bytes < full.arena_bytes


def test_program_records_decode_and_the_module_calls_them_in_order():
    g, gs = _setup(0)
    c = compile_training(g, S.Scheme(3, {"b1.dw": 0.5, g.convs[-1].name: 1.0}), gs)
    for seg, calls in c.calls.items():
        for o in calls:
            op, fields = abi.fields(c.program, o)
            assert set(fields) == set(abi.OPS[op])
    train_calls = [line for line in c.module.split("def train")[1].split("def infer")[0].splitlines()
                   if line.strip() and not line.strip().startswith(('"', "#"))]
    assert [int(line.split(",")[2].split(")")[0]) for line in train_calls[1:]] == c.calls["train"]
    assert f"ARENA_BYTES = {c.arena_bytes}" in c.module
    compile(c.module, "tte_model.py", "exec")          # valid Python (and so MicroPython) syntax
    # the blob starts with the program table
    assert c.blob[:4 * len(c.program)] == c.program.astype("<i4").tobytes()


def test_bad_schemes_and_missing_scales_are_refused():
    g, gs = _setup(1)
    with pytest.raises(UsageError, match="no layer"):
        compile_training(g, S.Scheme(1, {"nope": 1.0}), gs)
    with pytest.raises(UsageError, match="ratio"):
        compile_training(g, S.Scheme(1, {"b1.dw": 0.3}), gs)
    with pytest.raises(UsageError, match="nothing to train"):
        compile_training(g, S.Scheme(0), gs)
    with pytest.raises(InsituError, match="calibrate"):
        compile_training(g, S.bias_only(g, 1), {})
    with pytest.raises(UsageError, match="unknown scheme"):
        S.preset(g, "most")


def test_channel_selection_takes_the_largest_weights():
    g, _ = _setup(2)
    conv = g.node("b1.expand")
    for ratio in S.RATIOS:
        idx = S.Scheme(0, {conv.name: ratio}).selected_channels(conv)
        norms = np.abs(conv.weight.astype(int)).reshape(conv.out_channels, -1).sum(1)
        assert len(idx) == max(1, int(np.ceil(ratio * conv.out_channels)))
        assert norms[idx].min() >= np.delete(norms, idx).max(initial=-1)



def test_a_conv_wider_than_the_firmware_row_buffer_is_refused(monkeypatch):
    text = (package_dir("firmware") / "tte_kernels.py").read_text()
    chunk = re.search(r"^_CHUNK = const\((\d+)\)", text, re.M)
    assert chunk and int(chunk[1]) == abi.MAX_ROW          # the firmware's buffer is the limit
    g = random_graph(0)
    scales = calibrate_gradients(g, np.random.default_rng(0).integers(-128, 128, (4, *g.tensors[g.input].shape)),
                                 np.zeros(4, int))
    monkeypatch.setattr(abi, "MAX_ROW", 4)                  # narrower than any random graph's rows
    with pytest.raises(InsituError, match="rows of .* pixels.*at most 4"):
        compile_training(g, S.preset(g, "classifier"), scales)


@pytest.mark.parametrize("seed", range(3))
def test_accumulated_gradients_update_once_every_n_samples(seed):
    from insitu.sparse.simulate import Simulator

    g, gs = _setup(seed)
    n = 3
    c = compile_training(g, S.last_k_layers(g, 2), gs, Options(lr=0.5, accumulate=n))
    accums = [b for b in c.buffers if b.kind == "accum"]
    assert accums and c.calls["apply"]
    assert all((b.offset, b.nbytes) in c.trained for b in accums)        # checkpointed
    assert "ACCUMULATE = 3" in c.module and "def apply(A, P, f):" in c.module
    sim = Simulator(c)
    params = [b for b in c.buffers if b.kind == "param"]
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(2 * n,) + g.tensors[g.input].shape).astype(np.int8)
    changed = []
    for i in range(2 * n):
        before = [sim.A[b.offset:b.offset + b.nbytes].copy() for b in params]
        sim.train_step(x[i], int(rng.integers(0, g.num_classes)))
        changed.append(any((sim.A[b.offset:b.offset + b.nbytes] != v).any() for b, v in zip(params, before)))
        summed = any(sim.A[b.offset:b.offset + b.nbytes].any() for b in accums)
        assert summed == ((i + 1) % n != 0)             # zeroed by each update, summing between
    assert changed == [False, False, True, False, False, True]


def test_a_bad_accumulation_is_refused():
    with pytest.raises(UsageError, match="gradient accumulation"):
        Options(accumulate=0)


def test_a_layer_learning_rate_factor_scales_its_update_multipliers_only():
    from insitu.sparse.compiler import LayerTables
    g, scales = _setup(0)
    head, other = g.convs[-1], g.convs[-2]
    plain, scaled = LayerTables(g, scales, 0.01), LayerTables(g, scales, 0.01, {head.name: 4.0})
    idx = np.arange(head.out_channels)
    for fn in (lambda t, n: t.update_scales(n, np.arange(n.out_channels)), lambda t, n: t.bias_scales(n)):
        m0, sh0 = (np.frombuffer(b, "<i4") for b in fn(plain, head))
        m1, sh1 = (np.frombuffer(b, "<i4") for b in fn(scaled, head))
        assert np.allclose(m1 * 2.0 ** -sh1, 4 * m0 * 2.0 ** -sh0, rtol=1e-6)
        assert fn(plain, other) == fn(scaled, other)
    assert idx.size
    with pytest.raises(UsageError, match="learning-rate factors"):
        compile_training(g, S.full_update(g), scales, Options(lr=0.01, lr_scale={"nope": 2.0}))
    with pytest.raises(UsageError, match="positive"):
        Options(lr_scale={head.name: 0})
    a = compile_training(g, S.full_update(g), scales, Options(lr=0.01))
    b = compile_training(g, S.full_update(g), scales, Options(lr=0.01, lr_scale={head.name: 4.0}))
    assert a.arena_bytes == b.arena_bytes and len(a.program) == len(b.program)


@pytest.mark.parametrize("seed", [0, 3, 4, 6, 7])     # graphs that peak at a depthwise conv for some scheme
def test_depthwise_convs_in_place_train_bit_for_bit_and_never_plan_more(seed):
    """Options.dw_in_place: the plan's peak depthwise conv (forward or input gradient) computed
    into its input's buffer, a few channels at a time, trains exactly as the two-map program."""
    from insitu.sparse.simulate import Simulator

    g, gs = _setup(seed)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(6,) + g.tensors[g.input].shape).astype(np.int8)
    y = rng.integers(0, g.num_classes, size=6)
    rewritten = 0
    for sch in _schemes(g):
        runs, arenas = [], []
        for in_place in (False, True):
            c = compile_training(g, sch, gs, Options(lr=0.05, dw_in_place=in_place))
            arenas.append(c.arena_bytes)
            rewritten += in_place and any(b.name.endswith((":gx", ":y")) for b in c.buffers if b.offset >= 0)
            sim = Simulator(c)
            sim.train(x, y)
            runs.append((sim.trained_bytes(), [sim.predict(xi) for xi in x]))
        assert runs[1] == runs[0], sch.describe()
        assert arenas[1] <= arenas[0] * 1.02, (sch.describe(), arenas)      # planner noise only
    assert rewritten, "no depthwise conv of this graph was computed in place"
