"""LRT and E²-Train on the user's own datasets (issue 30): RGB images taken grey by LRT's networks
and as 3 channels by E²-Train's ResNet, at the dataset's size; feature vectors for the dense nets
only, with the shift stream's vector augmentations; K classes; the pre-training cache and E²-Train's
rows keyed by a hash of the arrays; what the LRT PE cannot take refused, naming the limit."""

import functools

import numpy as np
import pytest

from insitu.accel.params import DEFAULT_PARAMS
from insitu.data import load_dataset
from insitu.data.images import fit_images
from insitu.e2train.experiment import E2Config, load_data
from insitu.errors import UsageError
from insitu.fpga.lrt_board import LRTBoardTrainer
from insitu.lrt.adapt import build_network, pretrained_model
from insitu.lrt.online import VECTOR_AUGMENTATIONS, OnlineData
from insitu.lrt.qnet import dense_net, paper_cnn
from insitu.lrt.schemes import LRTConfig
from insitu.lrt.transfer import run_transfer
from own_data import write_csv, write_image_folder

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("insitu_cache")]     # each test its own cache


def few_classes_npz(path, classes=3, size=None):
    """Digits of the first ``classes`` classes, cropped to ``size`` x ``size`` when given."""
    ds = load_dataset("digits")
    keep = ds.y_train < classes
    x = ds.x_train[keep] if size is None else ds.x_train[keep][:, :size, :size]
    np.savez(path, x=x, y=ds.y_train[keep])
    return f"npz:{path}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    # Every image RGB at 12x12: a colour folder of another size than digits' 8x8.
    return {"rgb": f"folder:{write_image_folder(root / 'rgb', n=300, rgb_every=1)}",
            "csv": f"csv:{write_csv(root / 'table.csv')}", "root": root}


# ------------------------------------------------------------------------------ LRT's data

def test_rgb_images_stream_grey_at_their_own_size(files):
    data = OnlineData(files["rgb"], seed=0, alpha=0.0)           # alpha 0: no elastic warp
    ds = load_dataset(files["rgb"])
    assert ds.channels == 3 and data.sample_shape == (1, 12, 12) and data.num_classes == 10
    x, y = data.test()
    np.testing.assert_array_equal(np.rint(x[:, 0] * 255), fit_images(ds.x_test, channels=1))
    np.testing.assert_array_equal(y, ds.y_test)


def test_feature_vectors_stream_plain_and_shift_only_by_the_vector_augmentations(files):
    data = OnlineData(files["csv"], seed=0, segment=40)
    ds = data.dataset
    assert data.sample_shape == (16,) and data.augmentations == VECTOR_AUGMENTATIONS == ("CD", "WN")
    x, y = data.online("control", 100)
    # No elastic transform: every sample is one of the train vectors, exactly.
    rows = {tuple(v) for v in ds.x_train}
    assert x.shape == (100, 16) and all(tuple(v) in rows for v in x)
    combos = [tuple(s["augmentations"]) for s in data.segments(120)]
    assert sorted(combos) == [("CD",), ("CD", "WN"), ("WN",)]   # each of the 3 once per 3 segments
    xs, ys = data.online("shift", 120)
    assert xs.shape == (120, 16) and xs.min() >= 0 and xs.max() <= 1
    noisy = [k for k, c in enumerate(combos) if "WN" in c]
    clean = [k for k, c in enumerate(combos) if c == ("CD",)]
    for k in noisy:
        assert not all(tuple(v) in rows for v in xs[40 * k:40 * k + 40])
    for k in clean:      # CD only reorders: the vectors are the plain ones
        assert all(tuple(v) in rows for v in xs[40 * k:40 * k + 40])


def test_the_cnn_refuses_features_and_images_smaller_than_its_pools(files, tmp_path):
    with pytest.raises(UsageError, match=rf"--model cnn .* --dataset {files['csv']} holds feature vectors"):
        build_network("cnn", OnlineData(files["csv"]), 0, LRTConfig())
    small = few_classes_npz(tmp_path / "small.npz", size=6)
    with pytest.raises(UsageError, match=r"at least 8x8 \(three 2x2 pools\).* has 6x6: resample"):
        build_network("cnn", OnlineData(small), 0, LRTConfig())
    assert build_network("mlp", OnlineData(small), 0, LRTConfig()).weight_layers[0].weight.shape == (128, 36)
    net = build_network("cnn", OnlineData(files["rgb"]), 0, LRTConfig())
    assert net.weight_layers[-2].weight.shape == (64, 16)     # 12 -> 6 -> 3 -> 1 after three pools
    assert net.predict(np.zeros((2, 1, 12, 12))).shape == (2, 10)


def test_the_pretrained_cache_is_keyed_by_the_files_contents(tmp_path):
    path = tmp_path / "d.npz"
    spec = few_classes_npz(path, classes=3)
    tiny = functools.partial(pretrained_model, arch="mlp", dataset=spec, offline_samples=40, epochs=1,
                             cache_dir=tmp_path / "lrt", say=lambda text: None)
    first = load_dataset(spec).key
    tiny()
    few_classes_npz(path, classes=4)                       # the same file name, other data
    second = load_dataset(spec).key
    assert first != second and first.startswith(spec) and second.startswith(spec)
    net, _ = tiny()
    assert len(list((tmp_path / "lrt").glob("pretrained-mlp-*.npz"))) == 2
    assert net.weight_layers[-1].weight.shape[0] == 4           # trained on the new file
    assert load_dataset("digits").key == "digits"      # built-ins keep their keys


@pytest.mark.parametrize("kind", ["rgb", "csv"])
def test_transfer_runs_on_images_and_on_features(files, kind):
    result = run_transfer(ranks=(1, 2), lrs=(0.1,), seeds=(0,), samples=100, batch=50,
                          dataset=files[kind], pretrain_samples=100, pretrain_epochs=1)
    assert result["pretrain"]["classes"] == 10 and result["pretrain"]["features"] == 512
    assert result["pretrained_accuracy"] > 0.1          # above chance (measured 0.19 and 0.25)


# ------------------------------------------------------------------------------ the LRT PE

def test_the_pe_takes_any_input_width_and_refuses_classes_past_its_memories():
    params = DEFAULT_PARAMS
    # The adapted layer is classes x hidden: the input width never reaches the PE.
    assert LRTBoardTrainer.check(dense_net((300,), classes=3), params, rank=2) == (3, 128)
    assert LRTBoardTrainer.check(paper_cnn((40, 24), classes=256), params) == (256, 64)
    with pytest.raises(ValueError, match=r"129 classes x 128.*adapts at most 128 classes"):
        LRTBoardTrainer.check(dense_net((16,), classes=129), params)
    with pytest.raises(ValueError, match=r"rank 4 is too large for the 3 classes.*--rank 2 or lower"):
        LRTBoardTrainer.check(dense_net((16,), classes=3), params, rank=4)


# ------------------------------------------------------------------------------ E²-Train

def test_e2train_takes_rgb_as_three_channels_at_its_size(files):
    config = E2Config(dataset=files["rgb"], train_samples=100, test_samples=20, downsample=1)
    data = load_data(config)
    assert data.x_train.shape == (100, 3, 12, 12) and data.num_classes == 10
    assert load_data(E2Config(dataset=files["rgb"], train_samples=100, test_samples=20)).x_train.shape \
        == (100, 3, 6, 6)
    assert data.key is not None and data.key.startswith(files["rgb"] + "#")
    # A built-in's rows keep the keys they had before datasets were files.
    assert config.key((), "fashion-mnist") != config.key((), data.key)
    builtin = E2Config()
    assert builtin.key(("psg",), "fashion-mnist") == builtin.key(("psg",))


def test_e2train_refuses_features_and_a_pooling_larger_than_the_images(files):
    with pytest.raises(UsageError, match=rf"ResNet takes images, and --dataset {files['csv']} holds"):
        load_data(E2Config(dataset=files["csv"], train_samples=10, test_samples=10))
    with pytest.raises(ValueError, match=r"--downsample 13 .* has 12x12 images: use --downsample 12"):
        load_data(E2Config(dataset=files["rgb"], train_samples=10, test_samples=10, downsample=13))
