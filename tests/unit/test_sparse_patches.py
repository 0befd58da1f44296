"""Patch-based inference of the first stage (insitu.sparse.patches and the compiler's use of it):
a program whose first layers run in patches computes and trains bit for bit as the program on
whole maps, and the compiler uses patches where they make the plan smaller."""

import numpy as np
import pytest

from insitu.errors import UsageError
from insitu.sparse import scheme as S
from insitu.sparse.calibrate import calibrate_gradients
from insitu.sparse.compiler import Options, compile_training
from insitu.sparse.graph import Conv, random_graph
from insitu.sparse.patches import AUTO_GRIDS, candidate_cuts, input_window, patch_windows, whole
from insitu.sparse.quantize import int8_forward, untrained_graph
from insitu.sparse.simulate import Simulator

pytestmark = pytest.mark.unit


def _setup(seed):
    g = random_graph(seed)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(8,) + g.tensors[g.input].shape).astype(np.int8)
    y = rng.integers(0, g.num_classes, size=8)
    return g, calibrate_gradients(g, x, y), x, y


def _logits(sim: Simulator, x) -> np.ndarray:
    """The logits the program's forward pass leaves in the arena for the sample ``x``."""
    sim.predict(x)
    z = next(b for b in sim.c.buffers if b.name == f"act:{sim.c.graph.output}")
    return sim.A[z.offset:z.offset + sim.c.graph.num_classes].view(np.int8).copy()


@pytest.mark.parametrize("seed", range(6))
def test_a_program_in_patches_trains_bit_for_bit_as_on_whole_maps(seed):
    g, scales, x, y = _setup(seed)
    staged = 0
    for scheme in (S.classifier_only(g), S.last_k_layers(g, 2), S.bias_only(g, 1)):
        runs = []
        for grid in (1, 2, 3):
            c = compile_training(g, scheme, scales, Options(lr=0.05, patches=grid))
            staged += c.stats["patches"] is not None
            sim = Simulator(c)
            np.testing.assert_array_equal(_logits(sim, x[0]), int8_forward(g, x[0]).reshape(-1))
            sim.train(x, y)
            runs.append((sim.trained_bytes(), [sim.predict(xi) for xi in x], _logits(sim, x[1]).tolist()))
        assert runs[1] == runs[0] and runs[2] == runs[0], scheme.describe()
    assert staged, "no scheme of this graph ran in patches"


@pytest.mark.parametrize("seed", range(4))
def test_the_input_arrives_a_window_at_a_time_where_patches_read_it(seed):
    """A patched program takes a sample window by window (one per patch, each with its halo),
    never holds the whole image, and each window's stage is its patch's forward ops."""
    g, scales, x, y = _setup(seed)
    (C, H, W), staged = g.tensors[g.input].shape, 0
    for grid in (2, 3):
        c = compile_training(g, S.classifier_only(g), scales, Options(lr=0.05, patches=grid))
        if c.stats["patches"] is None:
            continue
        staged += 1
        assert c.stages == len(c.input_windows) == grid * grid
        assert c.input_bytes == sum(c.window_bytes()) == c.input_stream(x[0]).size
        inputs = [b for b in c.buffers if b.kind == "input" and b.offset >= 0]
        assert len(inputs) == 1 and max(c.window_bytes()) <= inputs[0].nbytes < max(c.window_bytes()) + 4  # aligned
        assert max(c.window_bytes()) <= C * H * W          # (a middle patch of a tiny map may read all of it)
        covered = np.zeros((H, W), bool)
        for w in c.input_windows:
            covered[w.r0:w.r1, w.c0:w.c1] = True
        assert covered.all(), "the windows cover the image"
        assert all(c.calls[f"stage{p}"] for p in range(c.stages))
        assert not set().union(*(c.calls[f"stage{p}"] for p in range(c.stages))) & set(c.calls["train"] + c.calls["infer"])
    assert staged, "no program of this graph ran in patches"


def test_patch_windows_tile_the_cut_and_hold_what_every_conv_reads():
    g = untrained_graph("mbv2-w0.35", num_classes=10)
    k = candidate_cuts(g, set())[3]
    nodes, cut = g.nodes[:k], g.nodes[k - 1].y
    for grid in (2, 3):
        windows = patch_windows(g, nodes, cut, grid)
        covered = np.zeros(g.tensors[cut].shape[1:], int)
        for need in windows:
            covered[need[cut].r0:need[cut].r1, need[cut].c0:need[cut].c1] += 1
            for n in nodes:
                if isinstance(n, Conv):
                    inp, have = input_window(n, need[n.y], g.tensors[n.x].shape), need[n.x]
                    assert have.r0 <= inp.r0 and inp.r1 <= have.r1 and have.c0 <= inp.c0 and inp.c1 <= have.c1
        assert (covered == 1).all()
        assert windows[0][g.input].r0 == 0 and windows[-1][g.input].r1 == whole(g.tensors[g.input].shape).r1


def test_cuts_stop_at_the_first_map_the_backward_pass_reads():
    g = untrained_graph("mbv2-w0.35", num_classes=10)
    assert candidate_cuts(g, set())
    first = g.nodes[0].y
    assert candidate_cuts(g, {first}) == []          # the stem's output saved: no stage
    assert all(k >= 2 for k in candidate_cuts(g, set()))


def test_the_compiler_uses_patches_where_they_shrink_the_plan():
    wide = untrained_graph("mbv2-w0.35", num_classes=10)
    scales = {t: 1 / 127 for t in wide.tensors}
    plain = compile_training(wide, S.classifier_only(wide), scales, Options(lr=0.01, patches=1))
    auto = compile_training(wide, S.classifier_only(wide), scales, Options(lr=0.01))
    assert plain.stats["patches"] is None and auto.stats["patches"]["grid"] in AUTO_GRIDS
    # 128x128: the forward's 48x64x64 expansion no longer held whole (130 KB -> 109 KB planned,
    # the tables streamed from flash).
    assert auto.arena_bytes < 0.9 * plain.arena_bytes
    assert all(auto.arena_bytes <= compile_training(wide, S.classifier_only(wide), scales,
                                                    Options(lr=0.01, patches=g)).arena_bytes for g in AUTO_GRIDS)
    full = compile_training(wide, S.full_update(wide), scales, Options(lr=0.01))
    assert full.stats["patches"] is None                     # every map is saved for the backward pass
    small = untrained_graph("mbv2-28", num_classes=10)
    c = compile_training(small, S.classifier_only(small), {t: 1 / 127 for t in small.tensors}, Options(lr=0.01))
    assert c.stats["patches"] is None                        # 28x28: its peak is not the first maps
    assert c.arena_bytes <= compile_training(small, S.classifier_only(small), {t: 1 / 127 for t in small.tensors},
                                             Options(lr=0.01, patches=2)).arena_bytes


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_a_bad_patch_grid_is_refused(bad):
    with pytest.raises(UsageError, match="patches"):
        Options(patches=bad)
