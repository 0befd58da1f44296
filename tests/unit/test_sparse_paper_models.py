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
