"""The MCU path's float models, their int8 post-training quantization, new heads, tasks, cache."""

import time

import numpy as np
import pytest

import insitu.nn as nn
from insitu.errors import UsageError
from insitu.sparse import graph as g
from insitu.sparse import golden
from insitu.sparse import models as M
from insitu.sparse import pretrain as P
from insitu.sparse import quantize as Q
from insitu.sparse import tasks as T
from insitu.sparse.calibrate import calibrate_gradients
from insitu.sparse.compiler import compile_training
from insitu.sparse.scheme import bias_only
from insitu.sparse.simulate import Simulator
from insitu.nn.gradcheck import layer_gradient_errors
from test_sparse_pretrain import same_graph

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """mbv2-tiny pretrained with the defaults into a private cache (the one slow step, ~10 s)."""
    folder = tmp_path_factory.mktemp("mcu-cache")
    start = time.perf_counter()
    graph = P.pretrained("mbv2-tiny", cache_dir=folder)
    return graph, folder, time.perf_counter() - start


# --------------------------------------------------------------------------- float layers


@pytest.mark.parametrize("c_in,c_out,expand,stride", [(4, 4, 2, 1), (4, 6, 3, 2), (3, 3, 1, 1)])
def test_inverted_residual_gradients(c_in, c_out, expand, stride):
    block = M.InvertedResidual(c_in, c_out, expand, stride, seed=3, dtype=np.float64)
    assert block.residual == (stride == 1 and c_in == c_out)
    assert ("expand" in block.parts) == (expand != 1)
    x = np.random.default_rng(0).standard_normal((2, c_in, 5, 5))
    # eps 1e-4: the expand BN's gamma has a tiny true gradient (the dw BN after it undoes most
    # of a channel's scale), which central differences at 1e-6 measure only to ~1e-5 relative.
    errs = layer_gradient_errors(block, x, eps=1e-4)
    assert max(errs.values()) < 1e-6, errs
    keys = {p.key for p in block.parameters()}
    assert "dw.0.weight" in keys and "project.1.gamma" in keys


def test_inverted_residual_without_bn_gradients():
    block = M.InvertedResidual(4, 4, 2, 1, batchnorm=False, seed=1, dtype=np.float64)
    for p in block.parameters():
        if p.name == "bias":
            p.value[:] = np.random.default_rng(2).standard_normal(p.value.shape) * 0.1
    errs = layer_gradient_errors(block, np.random.default_rng(0).standard_normal((2, 4, 6, 6)))
    assert max(errs.values()) < 1e-6, errs


@pytest.mark.parametrize("stride", [1, 2])
def test_fast_layers_match_insitu_nn(stride):
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((3, 5, 7, 7))
    for fast, ref in [(M.FastDepthwiseConv2d(5, 3, stride=stride, padding=1, seed=4),
                       nn.DepthwiseConv2d(5, 3, stride=stride, padding=1, seed=4)),
                      (M.FastPointwiseConv2d(5, 6, stride=stride, seed=4), nn.PointwiseConv2d(5, 6, stride=stride, seed=4))]:
        fast.params["bias"][:] = ref.params["bias"][:] = rng.standard_normal(ref.params["bias"].shape)
        y = ref.forward(x)
        np.testing.assert_allclose(fast.forward(x), y, atol=1e-12)
        dy = rng.standard_normal(y.shape)
        np.testing.assert_allclose(fast.backward(dy), ref.backward(dy), atol=1e-12)
        for k in ref.grads:
            np.testing.assert_allclose(fast.grads[k], ref.grads[k], atol=1e-12)


def test_model_configurations():
    big = M.model_summary("mbv2-28")
    assert 1e6 <= big["macs"] <= 3e6 and 50e3 <= big["params"] <= 150e3
    assert M.MODELS["mbv2-28"].input_size == 28
    tiny = M.model_summary("mbv2-tiny")
    assert M.MODELS["mbv2-tiny"].input_size == 12 and 1000 <= tiny["params"] <= 10000
    model = M.build_model("mbv2-tiny", dtype=np.float64)
    units = M.folded_units(model)
    assert any(u.stride == 2 and u.groups > 1 for u in units)          # strided depthwise
    assert any(u.residual for u in units)
    assert units[0].name == "stem" and units[0].stride == 2 and units[-1].name == "classifier"
    with pytest.raises(UsageError, match="mbv2-28"):
        M.model_config("nope")


def _randomized_tiny(seed=0):
    rng = np.random.default_rng(seed)
    model = M.build_model("mbv2-tiny", seed=seed, dtype=np.float64)
    for p in model.parameters():       # BN affine away from (1, 0)
        if p.name in ("gamma", "beta"):
            p.value[:] = rng.uniform(0.5, 1.5, p.value.shape) if p.name == "gamma" else rng.normal(0, 0.3, p.value.shape)
    x = rng.uniform(-1, 1, (16, 1, 12, 12))
    for _ in range(3):                 # running statistics away from (0, 1)
        model.forward(x, train=True)
    return model, x


def test_bn_folding_preserves_the_function():
    model, x = _randomized_tiny()
    expected = model.forward(x, train=False)
    rec = {}
    got = M.folded_forward(M.folded_units(model), x, rec)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    assert {"stem", "b1.dw", "b1.add", "head.conv", "pool", "classifier"} <= set(rec)


# --------------------------------------------------------------------------- int8 graph


def test_quantized_graph_structure_and_accuracy(tiny):
    graph, _, _ = tiny
    graph.validate()
    names = [n.name for n in graph.nodes]
    assert names[0] == "stem" and names[-2:] == ["pool", "classifier"]
    assert {"b1.dw", "b1.project", "b1.add", "b2.expand", "head.conv"} <= set(names)
    assert graph.input == "input" and graph.output == "logits" and graph.num_classes == 10
    assert graph.tensors["input"].scale == g.INPUT_SCALE
    assert graph.node("stem").act == "relu6" and graph.node("b1.project").act == "none"
    assert graph.node("classifier").is_dense
    add = graph.node("b1.add")
    assert isinstance(add, g.Add) and add.a == "b1.project" and add.b == "stem"
    meta = graph.meta["pretrain"]
    # The int8 graph stays within 2 points of its float model (FashionMNIST test set).
    assert meta["float_test_accuracy"] > 0.75
    assert abs(meta["int8_test_accuracy"] - meta["float_test_accuracy"]) < 0.02
    x, y = T.pretrain_task(12)[2:4]
    assert Q.int8_accuracy(graph, x[:2000], y[:2000]) == pytest.approx(
        Q.int8_accuracy(graph, x[:1000], y[:1000]) / 2 + Q.int8_accuracy(graph, x[1000:2000], y[1000:2000]) / 2)


def test_int8_forward_one_sample_equals_batch(tiny, monkeypatch):
    graph, _, _ = tiny
    codes = g.input_codes(T.pretrain_task(12)[2][:5])
    batch = Q.int8_forward(graph, codes)
    assert batch.dtype == np.int8 and batch.shape == (5, 10)
    rec = {}
    one = Q.int8_forward(graph, codes[3], record=rec)
    np.testing.assert_array_equal(one, batch[3])
    assert rec["pool"].shape == (graph.tensors["head.conv"].shape[0], 1, 1)
    # the batch goes through in chunks: the chunks' codes (every tensor's) are the samples'
    monkeypatch.setattr(Q, "FORWARD_CHUNK", 2)
    recs = {}
    np.testing.assert_array_equal(Q.int8_forward(graph, codes, record=recs), batch)
    assert set(recs) == set(rec) and all(recs[k].shape == (5, *rec[k].shape) for k in rec)
    for k in rec:
        np.testing.assert_array_equal(recs[k][3], rec[k])
    # ops without the `batched` flag (the golden model itself) get one sample at a time
    np.testing.assert_array_equal(Q.int8_forward(graph, codes, ops=golden), batch)
    assert Q.REFERENCE_OPS.conv_fwd is golden.conv_fwd           # one implementation of eq. 1
    with pytest.raises(ValueError, match="int8"):
        Q.int8_forward(graph, codes.astype(np.int16))


def test_int8_forward_equals_the_compiled_program_on_the_arena(tiny):
    """The graph walk on a batch (int8_forward) and the compiled inference program run by the
    arena interpreter, one sample at a time (the host simulator), give the same logit codes."""
    graph, _, _ = tiny
    x, y = T.pretrain_task(12)[2:4]
    codes = g.input_codes(x[:6])
    compiled = compile_training(graph, bias_only(graph, 2), calibrate_gradients(graph, codes, y[:6]))
    logits = next(b for b in compiled.buffers if b.name == f"act:{graph.output}")
    sim = Simulator(compiled)
    expect = Q.int8_forward(graph, codes)
    for i, c in enumerate(codes):
        assert sim.predict(c) == int(np.argmax(expect[i]))
        np.testing.assert_array_equal(sim.A[logits.offset:logits.offset + expect.shape[1]].view(np.int8), expect[i])


def test_new_head(tiny):
    graph, _, _ = tiny
    before = graph.node("classifier").weight.copy()
    head = Q.new_head(graph, 5, seed=1)
    head.validate()
    c = graph.tensors["pool"].shape[0]
    cls = head.node("classifier")
    assert cls.weight.shape == (5, c, 1, 1) and cls.weight.dtype == np.int8 and not cls.weight.any()
    assert cls.bias.shape == (5,) and not cls.bias.any()
    assert np.all(cls.w_scale == Q.HEAD_RANGE * np.median(graph.node("classifier").w_scale))
    assert head.tensors["logits"].shape == (5, 1, 1) and head.num_classes == 5
    assert head.tensors["logits"].scale == graph.tensors["logits"].scale
    for a, b in zip(graph.nodes[:-1], head.nodes[:-1]):        # the backbone is untouched
        assert a.name == b.name
        if isinstance(a, g.Conv):
            np.testing.assert_array_equal(a.weight, b.weight)
    np.testing.assert_array_equal(graph.node("classifier").weight, before)   # a copy, not an edit
    logits = Q.int8_forward(head, g.input_codes(T.load_task("digits", 12)[0][:3]))
    assert logits.shape == (3, 5) and not logits.any()
    with pytest.raises(UsageError):
        Q.new_head(graph, 1)


# --------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("name", T.TASKS)
def test_tasks_shapes_and_dtypes(name):
    x_train, y_train, x_test, y_test, k = T.load_task(name, 12)
    assert k == 10
    for x, y in ((x_train, y_train), (x_test, y_test)):
        assert x.dtype == np.uint8 and x.ndim == 3 and x.shape[1:] == (12, 12)
        assert y.dtype == np.int64 and y.shape == (len(x),) and 0 <= y.min() and y.max() < k
        assert len(np.unique(y)) == k
    assert T.load_task(name, 28)[0].shape[1:] == (28, 28)


def test_task_details():
    from insitu.data import load_dataset

    fashion = load_dataset("fashion-mnist")
    x_train, y_train, x_test, _, _ = T.load_task("fashion-shift", 28)
    assert len(x_train) == T.FASHION_SHIFT_TRAIN and len(x_train) + len(x_test) == len(fashion.x_test)
    # the shift is a 90 degree rotation of FashionMNIST test images
    rotated = np.rot90(fashion.x_test, 1, axes=(1, 2))
    i = np.flatnonzero((rotated.reshape(len(rotated), -1) == x_train[0].ravel()).all(axis=1))
    assert len(i) >= 1 and fashion.y_test[i[0]] == y_train[0]
    np.testing.assert_array_equal(T.pretrain_task(28)[0], fashion.x_train)
    digits = load_dataset("digits")
    assert len(T.load_task("digits", 12)[0]) == len(digits.x_train)
    with pytest.raises(UsageError, match="digits, fashion-shift"):
        T.load_task("cifar", 12)


def test_resize():
    flat = np.full((2, 28, 28), 77, np.uint8)
    assert (T.resize(flat, 12) == 77).all() and (T.resize(flat[:, :8, :8], 28) == 77).all()
    img = np.zeros((1, 8, 8), np.uint8)
    img[0, :, 4:] = 255                          # a vertical edge survives both directions
    up = T.resize(img, 28)[0]
    assert (up[:, :12] == 0).all() and (up[:, 16:] == 255).all()
    down = T.resize(up[None], 12)[0]
    assert (down[:, :5] == 0).all() and (down[:, 7:] == 255).all()
    x = T.float_inputs(np.array([[[0, 128, 255]]], np.uint8))
    assert x.shape == (1, 1, 1, 3) and np.allclose(x.ravel(), [-1, 0, 127 / 128])


# --------------------------------------------------------------------------- cache


def test_pretrained_cache_round_trip(tiny, monkeypatch):
    # (pretraining mbv2-tiny takes ~8 s on an idle 2-core machine; no wall-clock assertion here,
    # a shared machine makes it flaky)
    graph, folder, _ = tiny
    path = P.pretrained_path("mbv2-tiny", cache_dir=folder)
    assert path.is_file() and path.parent == folder and path.name.startswith("mbv2-tiny-")

    def no_training(*a, **k):
        raise AssertionError("a cached model was trained again")

    monkeypatch.setattr(P, "train_float", no_training)
    again = P.pretrained("mbv2-tiny", cache_dir=folder)
    same_graph(graph, again)
    assert again.meta == graph.meta
    # another configuration is another file; the root follows INSITU_CACHE
    assert P.pretrained_path("mbv2-tiny", cache_dir=folder, epochs=1) != path
    monkeypatch.setenv("INSITU_CACHE", str(folder / "root"))
    assert P.pretrained_path("mbv2-tiny").parent == folder / "root" / "mcu"
    assert P.pretrained_path("mbv2-tiny").name == path.name
    # an unreadable cache file is rebuilt, not an error
    monkeypatch.undo()
    bad = P.pretrained_path("mbv2-tiny", cache_dir=folder, samples=300, epochs=1)
    bad.write_bytes(b"not a graph")
    rebuilt = P.pretrained("mbv2-tiny", cache_dir=folder, samples=300, epochs=1)
    assert rebuilt.meta["pretrain"]["train_samples"] == 300
    assert P.pretrained_path("mbv2-tiny", cache_dir=folder, samples=300, epochs=1).stat().st_size > 1000
    with pytest.raises(UsageError):
        P.pretrained("mbv2-tiny", cache_dir=folder, epochs=0)
