"""The golden model's output scale stays within the SHIFT range the PEs take: a layer whose sums
have collapsed (the prior pruned it on a small dataset) asks for a left shift beyond 16 bits; the
golden model and the twin's PEs both take the nearest shift instead (the twin refused it before)."""

import numpy as np
import pytest

from insitu.accel.params import DEFAULT_PARAMS
from insitu.boards import get_board
from insitu.fpga.boards import open_board
from insitu.fpga.tt_board import BoardExecutor
from insitu.numerics import tt_autoscale
from insitu.tt.execute import FixedExecutor
from insitu.tt.schedule import forward_ops

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("frac,shift", [(60, DEFAULT_PARAMS.shift_min), (-80, DEFAULT_PARAMS.shift_max)])
def test_an_out_of_range_scale_takes_the_nearest_shift_on_both_executors(frac, shift):
    in_modes, out_modes = (2, 16), (1, 16)
    op = forward_ops(in_modes, out_modes, 2, 4)[0]            # PE1: x * G2 -> fwd.1
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, 4 * 32)
    cores = [rng.integers(-8, 8, (1, 1, 2, 2)), rng.integers(-8, 8, (2, 16, 16, 1))]
    outputs = []
    for executor in (FixedExecutor(), BoardExecutor(open_board(get_board("ultra96v2-sim"), "fast"))):
        executor.scales["fwd.1"] = tt_autoscale("pe", "fwd.1", frac)
        buffers, fracs = {"x": x.copy()}, {"x": 6}
        executor.run(op, buffers, fracs, cores, [3, 3], (out_modes, in_modes), observe=False)
        assert fracs["fwd.1"] == 6 + 3 - shift               # acc_frac - the shift the PE took
        outputs.append(buffers["fwd.1"])
    np.testing.assert_array_equal(*outputs)
