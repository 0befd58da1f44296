"""Offline pre-training of the quantized network: schedule, centred batch-norm gradient, resuming."""

import numpy as np
import pytest

from insitu.data import load_dataset
from insitu.lrt.adapt import pretrained_model
from insitu.lrt.qnet import QNormalize, dense_net, paper_cnn
from insitu.lrt.schemes import learning_rate, pretrain
from insitu.numerics import LRT_BIAS, LRT_WEIGHT


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds.float_images("train")[:, None].astype(np.float64), ds.y_train.astype(np.int64)


class Interrupted(Exception):
    pass


def test_learning_rate_warms_up_then_decays_to_zero():
    assert learning_rate(0, 100, 0.1, warmup=10) == pytest.approx(0.01)
    assert learning_rate(9, 100, 0.1, warmup=10) == pytest.approx(0.1)
    assert learning_rate(10, 100, 0.1, warmup=10) == pytest.approx(0.1)
    assert learning_rate(55, 100, 0.1, warmup=10) == pytest.approx(0.05)
    assert learning_rate(99, 100, 0.1, warmup=10) < 0.001
    assert learning_rate(99, 100, 0.1, schedule="constant") == 0.1
    with pytest.raises(ValueError, match="schedule"):
        learning_rate(0, 10, 0.1, schedule="step")


def test_centred_norm_backward_is_only_for_pretraining(digits):
    x, y = digits
    net = dense_net(sample_shape=(8, 8), hidden=(16,), seed=0)
    pretrain(net, x[:64], y[:64], epochs=1, lr=0.05)
    for stage in net.stages:
        if isinstance(stage, QNormalize):
            assert "backward" not in vars(stage)       # the class's (deployed) backward again


def _state(net):
    return net.state_dict()


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_an_interrupted_pretraining_resumes_to_identical_weights(digits, tmp_path, arch):
    x, y = digits
    make = ((lambda: dense_net(sample_shape=(8, 8), hidden=(16,), seed=3)) if arch == "mlp"
            else (lambda: paper_cnn(sample_shape=(8, 8), seed=3)))
    n = 96
    windows = lambda epoch: (x[epoch * n:(epoch + 1) * n], y[epoch * n:(epoch + 1) * n])
    kw = dict(epochs=3, lr=0.05, batch=16, warmup=0.5, clip=2.0, seed=3)

    whole = make()
    history = pretrain(whole, windows, **kw)

    ckpt = tmp_path / "partial.npz"
    def stop_in_epoch_2(epoch, record):
        if epoch == 2:
            raise Interrupted
    cut = make()
    with pytest.raises(Interrupted):
        pretrain(cut, windows, checkpoint=ckpt, checkpoint_key={"k": 1}, on_epoch=stop_in_epoch_2, **kw)
    assert ckpt.exists()
    resumed = make()                                   # a new process: a fresh network
    again = pretrain(resumed, windows, checkpoint=ckpt, checkpoint_key={"k": 1}, **kw)
    assert [r["loss"] for r in again] == [r["loss"] for r in history]
    a, b = _state(whole), _state(resumed)
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for layer in resumed.weight_layers:
        np.testing.assert_array_equal(LRT_WEIGHT.quantize(layer.weight), layer.weight)
    for _, value, _ in resumed.one_d_params():
        np.testing.assert_array_equal(LRT_BIAS.quantize(value), value)


def test_a_checkpoint_of_other_settings_is_not_resumed(digits, tmp_path):
    x, y = digits
    ckpt = tmp_path / "partial.npz"
    kw = dict(epochs=2, lr=0.05, batch=32, seed=0)
    def stop(epoch, record):
        raise Interrupted
    with pytest.raises(Interrupted):
        pretrain(dense_net(sample_shape=(8, 8), hidden=(16,), seed=1), x[:64], y[:64],
                 checkpoint=ckpt, checkpoint_key={"other": True}, on_epoch=lambda e, r: None
                 if e < 2 else stop(e, r), **kw)
    fresh = dense_net(sample_shape=(8, 8), hidden=(16,), seed=0)
    pretrain(fresh, x[:64], y[:64], checkpoint=ckpt, checkpoint_key={"mine": True}, **kw)
    plain = dense_net(sample_shape=(8, 8), hidden=(16,), seed=0)
    pretrain(plain, x[:64], y[:64], **kw)
    for key, value in plain.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[key], value)


def test_pretrained_model_resumes_caches_and_announces(tmp_path):
    kw = dict(arch="mlp", dataset="digits", seed=0, offline_samples=128, epochs=3)
    said = []
    def say_then_stop(msg):
        said.append(msg)
        if "epoch 2/3" in msg:
            raise Interrupted
    with pytest.raises(Interrupted):
        pretrained_model(cache_dir=tmp_path / "a", say=say_then_stop, **kw)
    assert "once" in said[0] and str(tmp_path / "a") in said[0]
    assert list((tmp_path / "a").glob("*.partial.npz"))
    said.clear()
    net, info = pretrained_model(cache_dir=tmp_path / "a", say=said.append, **kw)
    assert "resuming" in said[0]
    assert [r["epoch"] for r in info["epoch_log"]] == [1, 2, 3]
    assert not list((tmp_path / "a").glob("*.partial.npz"))      # cached: the partial is gone
    whole, info_whole = pretrained_model(cache_dir=tmp_path / "b", say=lambda m: None, **kw)
    assert info["validation_accuracy"] == info_whole["validation_accuracy"]
    for key, value in whole.state_dict().items():
        np.testing.assert_array_equal(net.state_dict()[key], value)
    said.clear()
    cached, info_cached = pretrained_model(cache_dir=tmp_path / "a", say=said.append, **kw)
    assert said == [] and info_cached == info                       # from the cache, silently


def test_zero_offline_samples_is_the_network_from_scratch_not_a_division_by_zero(tmp_path):
    # lrt_fig6.toml trains from scratch (offline_samples = 0), as `lrt adapt --offline-samples 0`
    net, info = pretrained_model("mlp", "digits", seed=0, offline_samples=0, cache_dir=tmp_path)
    fresh, _ = pretrained_model("mlp", "digits", seed=0, offline_samples=0, cache_dir=tmp_path / "b")
    assert info["from_scratch"] and info["epochs"] == 0 and not list(tmp_path.iterdir())
    assert 0.0 <= info["validation_accuracy"] <= 1.0
    for name, value in net.state_dict().items():       # the seed's initialization, untrained
        np.testing.assert_array_equal(value, fresh.state_dict()[name])
