"""PSG in training and in hardware agree: the signs a PSGLayer trains with equal the PE3_PSG
op's signs on the simulated Ultra96-V2 (fast twin, driven through the PYNQ driver), for the same
layer, batch and threshold -- both come from insitu.numerics' psg_* spec."""

import numpy as np
import pytest

from insitu import numerics as nx
from insitu.boards import get_board
from insitu.e2train.psg import PSGLayer, quantize_tensor
from insitu.fpga.boards import open_board
from insitu.fpga.psg_op import run_psg
from insitu.fpga.twin import write_twin_overlay
from insitu.nn import Dense
from insitu.tt import pe_stream

pytestmark = pytest.mark.unit

LANES = 16


@pytest.fixture(scope="module")
def acc(tmp_path_factory):
    board = get_board("ultra96v2-sim")
    overlay = write_twin_overlay(board.twin_of, tmp_path_factory.mktemp("overlay"))
    return open_board(board, mode="fast", bitstream=overlay, timeout_s=2.0)


def _pe3_operands(dy_codes, x_codes):
    """A weight gradient (n_out, n_in) as one PE3_PSG op: a row per (16-input chunk, output),
    the chunk's inputs as that block's X (d = n_out rows share it), the batch along b."""
    k, n_out = dy_codes.shape
    chunks = x_codes.shape[1] // LANES
    x_blocks = x_codes.reshape(k, chunks, LANES).transpose(1, 0, 2)          # (chunks, b, 16)
    dy_rows = np.tile(dy_codes.T, (chunks, 1))                                # (chunks * n_out, b)
    return dy_rows, x_blocks, chunks


@pytest.mark.parametrize("beta, seed", [(0.05, 0), (0.3, 1), (0.01, 2)])
def test_psg_layer_signs_equal_the_pe3_psg_op(acc, beta, seed):
    rng = np.random.default_rng(seed)
    n_in, n_out, batch = 32, 6, 40
    layer = PSGLayer("fc", Dense(n_in, n_out, bias=False, seed=seed, dtype=np.float32), beta=beta)
    x = np.abs(rng.standard_normal((batch, n_in))).astype(np.float32)      # post-ReLU inputs
    dy = rng.standard_normal((batch, n_out)).astype(np.float32)
    layer.forward(x)
    layer.backward(dy)
    # The codes the layer computed with (its quantizers are the spec's max-abs grids).
    xq, x_frac = quantize_tensor(x, nx.PSG_ACTIVATION_BITS)
    dyq, dy_frac = quantize_tensor(dy, nx.PSG_GRADIENT_BITS)
    x_codes = np.rint(np.ldexp(xq.astype(np.float64), x_frac)).astype(np.int64)
    dy_codes = np.rint(np.ldexp(dyq.astype(np.float64), dy_frac)).astype(np.int64)
    _, g_msb = nx.psg_weight_gradient(dy_codes, x_codes)
    tau = nx.psg_threshold(g_msb, beta)

    dy_rows, x_blocks, chunks = _pe3_operands(dy_codes, x_codes)
    out = run_psg(acc, pe_stream.psg_config(chunks * n_out, batch, n_out, 0, tau), dy_rows, x_blocks)
    # Row (chunk j, output o), lane l is weight (o, 16 j + l).
    hw_sign = out.sign.reshape(chunks, n_out, LANES).transpose(1, 0, 2).reshape(n_out, n_in)
    np.testing.assert_array_equal(hw_sign, layer.grads["weight"])
    assert out.predicted == int(layer.last_predicted.sum())
    assert nx.psg_threshold([out.peak], beta) == tau          # the driver's next threshold rule
