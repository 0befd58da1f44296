"""The Tiny Training paper's three networks (insitu.sparse.models.PAPER_MODELS) against the
paper's figures and the layer tables released with it (the tiny-training repository's
algorithm/assets/mcu_models/*.pkl: channels, kernels and strides of every conv)."""

import pytest

from insitu.sparse.models import PAPER_MODELS, build_model, folded_units, model_summary
from insitu.sparse.quantize import INPUT_TENSOR, untrained_graph

pytestmark = pytest.mark.unit

#: Sec. 4 "Setups": backbone MACs (M) and parameters (M) as the paper rounds them.
PAPER_FIGURES = {"mbv2-w0.35": (17, 0.25), "proxyless-w0.3": (19, 0.33), "mcunet-5fps": (23, 0.48)}

#: From the released layer tables: blocks, the depthwise kernels in order, the classifier's input.
RELEASED = {
    "mbv2-w0.35": (17, [3] * 17, 112),
    "proxyless-w0.3": (20, [3, 5, 3, 7, 3, 5, 5, 7, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7], 96),
    "mcunet-5fps": (14, [3, 3, 3, 7, 3, 3, 7, 5, 3, 3, 7, 5, 5, 3], 160),
}


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_macs_and_parameters_are_the_papers(name):
    s = model_summary(name)
    macs, params = PAPER_FIGURES[name]
    # The paper's figures are the MACs of the whole forward and the backbone's float parameters
    # with BN (the backbone's MACs alone round one lower for MCUNet: 22.45 M).
    assert round(s["macs"] / 1e6) == macs
    assert round(s["backbone_float_params"] / 1e4) / 100 == params
    assert s["backbone_macs"] < s["macs"] and s["backbone_params"] < s["backbone_float_params"]


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_layers_are_the_released_tables(name):
    blocks, kernels, last = RELEASED[name]
    config = PAPER_MODELS[name]
    units = folded_units(build_model(config))
    assert units[0].weight.shape == (16, 3, 3, 3) and units[0].stride == 2
    dws = [u for u in units if u.name.endswith(".dw")]
    assert len(dws) == blocks and [u.weight.shape[2] for u in dws] == kernels
    assert all(u.pad == u.weight.shape[2] // 2 for u in dws)
    assert "head.conv" not in [u.name for u in units]
    assert units[-1].name == "classifier" and units[-1].weight.shape[:2] == (1000, last)


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_the_int8_graph_takes_rgb_at_128(name):
    graph = untrained_graph(name)
    assert graph.tensors[INPUT_TENSOR].shape == (3, 128, 128)
    assert graph.num_classes == 1000
    # 128 -> 64 (stem) -> 4 after four more stride-2 blocks.
    pooled_from = graph.node("pool").x
    assert graph.tensors[pooled_from].shape[1:] == (4, 4)


def test_the_rgb_pretraining_task_resamples_only_the_images_it_uses():
    from insitu.data import load_dataset
    from insitu.sparse.tasks import pretrain_task

    x_train, y_train, x_test, y_test, classes = pretrain_task(32, 3, samples=12, test_samples=5)
    assert x_train.shape == (12, 32, 32, 3) and x_test.shape == (5, 32, 32, 3) and classes == 10
    assert (x_train[..., 0] == x_train[..., 2]).all()              # grey as RGB
    ds = load_dataset("fashion-mnist")
    assert y_train.tolist() == ds.y_train[:12].tolist() and y_test.tolist() == ds.y_test[:5].tolist()


def test_the_paper_networks_pretrain_as_rgb_scored_on_part_of_the_test_split():
    from insitu.sparse.pretrain import PRETRAIN_DEFAULTS, _settings

    for name in PAPER_MODELS:
        settings = _settings(name, None, None, 0)
        assert settings["test_samples"] == PRETRAIN_DEFAULTS[name]["test_samples"]
        assert settings["config"]["in_channels"] == 3
    assert "test_samples" not in _settings("mbv2-28", None, None, 0)     # (its cache key as before)
