"""`insitu tt train` and `insitu train --algo tt` are one loop (the run harness driving a
TTLearner) with two executors of the PE ops: the golden model on the host and the accelerator of
a board. On a simulated board they agree step for step."""

from __future__ import annotations

import numpy as np
import pytest

from insitu.boards import get_board
from insitu.fpga.boards import open_board
from insitu.fpga.tt_board import NETWORKS, BoardExecutor
from insitu.harness import RunPlan, run_training
from insitu.tt.experiment import Model, TTLearner, TTTrainConfig

pytestmark = pytest.mark.unit


def _run(executor, x, y, config, layers):
    learner = TTLearner(Model(config, len(x), layers=layers, executor=executor), x, y, config.seed)
    # Two epochs of 48 samples in steps of 16: pruning runs at both epoch ends.
    plan = RunPlan("test", {}, 2 * len(x), config.batch_size, epoch_size=len(x))
    outcome = run_training(plan, learner, end_of_epoch=learner.end_of_epoch)
    return learner, outcome


def test_the_golden_model_and_the_twin_train_step_for_step_alike():
    layers, transform, rank = NETWORKS["tiny"]
    config = TTTrainConfig(variant="fixed-prior", batch_size=16, lr=3e-3, rank=rank, seed=4,
                           lr_schedule="constant", prune_threshold=0.3, prior_weight=50.0)
    rng = np.random.default_rng(4)
    x, y = transform(rng.random((48, 28, 28))), rng.integers(0, 10, 48)
    golden, golden_run = _run(None, x, y, config, layers)
    accel = open_board(get_board("ultra96v2-sim"), "fast")
    board, board_run = _run(BoardExecutor(accel), x, y, config, layers)
    assert len(golden_run.losses) == 6 and golden_run.losses == board_run.losses
    assert golden.pruned == board.pruned and golden.model.net.ranks == board.model.net.ranks
    golden_arrays, golden_meta = golden.state()
    board_arrays, board_meta = board.state()
    assert golden_arrays.keys() == board_arrays.keys() and golden_meta == board_meta
    for key, value in golden_arrays.items():
        np.testing.assert_array_equal(value, board_arrays[key], err_msg=key)
    assert accel.ops["PE1"] > 0 and accel.ops["PE3"] > 0        # the twin did the PE work
