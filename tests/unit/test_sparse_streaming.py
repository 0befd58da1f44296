"""Streaming from flash (Options.stream): tables loaded by the kernels that read them and large
frozen layers' weights loaded a piece at a time compute and train bit for bit as the program
that holds them in RAM, and make the plan of the paper's networks smaller."""

import numpy as np
import pytest

from insitu.sparse import compiler
from insitu.sparse import scheme as S
from insitu.sparse.compiler import Options, compile_training
from insitu.sparse.quantize import untrained_graph
from insitu.sparse.simulate import Simulator

from test_sparse_patches import _logits, _setup

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("seed", range(5))
def test_a_streamed_program_trains_bit_for_bit_as_one_in_ram(seed, monkeypatch):
    # Pieces of one channel: every frozen full conv of these small graphs is streamed in pieces.
    monkeypatch.setattr(compiler, "STREAM_CHUNK_BYTES", 1)
    monkeypatch.setattr(compiler, "FLASH_TABLE_MIN_BYTES", 4)
    g, scales, x, y = _setup(seed)
    pieces = {"conv_fwd": 0, "conv_bwd_x": 0}
    for scheme in (S.classifier_only(g), S.last_k_layers(g, 2), S.bias_only(g, 3),
                   S.Scheme(2, {g.convs[-1].name: 1.0, g.convs[-2].name: 0.5})):
        runs, kinds = [], []
        for stream in (False, True):
            # no patches: the automatic choice may differ between the two, and patches run
            # conv_fwd in pieces of their own
            c = compile_training(g, scheme, scales, Options(lr=0.05, stream=stream, patches=1))
            kinds.append(c.stats["bytes_by_kind"].get("const", 0))
            for k in pieces:
                pieces[k] += (1 if stream else -1) * c.stats["kernels"].get(k, 0)
            sim = Simulator(c)
            sim.train(x, y)
            runs.append((sim.trained_bytes(), [sim.predict(xi) for xi in x], _logits(sim, x[2]).tolist()))
        assert runs[1] == runs[0], scheme.describe()
        assert kinds[1] < kinds[0] or kinds[0] == 0                  # the tables left RAM
    assert pieces["conv_fwd"] > 0 and pieces["conv_bwd_x"] > 0             # layers ran in pieces


@pytest.mark.parametrize("seed", range(5))
def test_relu_masks_train_bit_for_bit_as_the_saved_activations(seed):
    g, scales, x, y = _setup(seed)
    masked = 0
    for scheme in (S.bias_only(g, 3), S.last_k_layers(g, 2), S.full_update(g)):
        runs = []
        for masks in (False, True):
            c = compile_training(g, scheme, scales, Options(lr=0.05, masks=masks))
            masked += c.stats["kernels"].get("mask_bwd", 0)
            sim = Simulator(c)
            sim.train(x, y)
            runs.append((sim.trained_bytes(), [sim.predict(xi) for xi in x]))
        assert runs[1] == runs[0], scheme.describe()
    assert masked


def test_streaming_is_automatic_for_networks_whose_weights_live_in_flash():
    big = untrained_graph("mcunet-5fps", num_classes=10)
    scales = {t: 1 / 127 for t in big.tensors}
    scheme = S.preset(big, "paper-49kb")
    streamed = compile_training(big, scheme, scales, Options(lr=0.01))
    held = compile_training(big, scheme, scales, Options(lr=0.01, stream=False))
    assert streamed.arena_bytes < 0.8 * held.arena_bytes
    loads = streamed.stats["kernels"]["load"]
    assert loads > held.stats["kernels"]["load"]
    small = untrained_graph("mbv2-28", num_classes=10)
    s_scales = {t: 1 / 127 for t in small.tensors}
    auto = compile_training(small, S.bias_only(small, 6), s_scales, Options(lr=0.01))
    off = compile_training(small, S.bias_only(small, 6), s_scales, Options(lr=0.01, stream=False))
    assert auto.arena_bytes == off.arena_bytes and np.array_equal(auto.program, off.program)


def test_the_released_schemes_of_the_paper_resolve_on_its_networks():
    g = untrained_graph("mcunet-5fps", num_classes=10)
    s = S.preset(g, "paper-99kb")                  # tiny-training's sparse_update.sh example
    convs = [c.name for c in g.convs]
    assert s.bias_k == 23 and s.weights[convs[-1]] == 1.0
    assert {convs.index(n): r for n, r in s.weights.items() if n != convs[-1]} == \
        {21: 1.0, 24: 1.0, 27: 1.0, 30: 1.0, 36: 0.125, 39: 0.25}
    with pytest.raises(S.UsageError, match="paper-49kb"):
        S.preset(g, "paper-50kb")
    with pytest.raises(S.UsageError, match="released"):
        S.preset(untrained_graph("mbv2-28", num_classes=10), "paper-49kb")
