"""The LRT paper's online dataset: splits, the indexable streams, the augmentations, the shift."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from insitu.data import FASHION_MNIST_DIR, load_dataset
from insitu.errors import UsageError
from insitu.lrt.online import (AUGMENTATIONS, ENVS, OnlineData, background_gradient,
                               class_clustering, elastic_transform, spatial_transform,
                               white_noise)

pytestmark = pytest.mark.unit

needs_fashion = pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"FashionMNIST not installed in {FASHION_MNIST_DIR}")

# Small segments so that a few hundred digits samples cross several shift segments.
SEGMENT = 200


@pytest.fixture(scope="module")
def digits():
    return OnlineData("digits", seed=0, segment=SEGMENT)


@pytest.fixture(scope="module")
def fashion():
    return OnlineData("fashion-mnist", seed=0)


@pytest.fixture(scope="module")
def fashion_images():
    """A few real 28x28 images (float, [0, 1]) and their labels."""
    ds = load_dataset("fashion-mnist")
    return ds.x_train[:64].astype(np.float32) / 255, ds.y_train[:64]


def corr(a, b):
    return np.corrcoef(np.ravel(a), np.ravel(b))[0, 1]


# --- splits --------------------------------------------------------------------------------------

@needs_fashion
def test_fashion_split_is_the_papers_9k_1k_50k(fashion):
    sizes = {name: len(idx) for name, idx in fashion.indices.items()}
    assert sizes == {"offline": 9000, "validation": 1000, "online": 50000}
    assert fashion.sizes == {"offline_train": 50000, "validation": 10000, "online": 100000,
                             "test": 10000}


@pytest.mark.parametrize("dataset", [pytest.param("fashion-mnist", marks=needs_fashion),
                                     "digits"])
def test_split_partitions_the_train_set(dataset):
    data = OnlineData(dataset, seed=3)
    parts = [data.indices[k] for k in ("offline", "validation", "online")]
    union = np.concatenate(parts)
    n = len(data.dataset.y_train)
    assert len(union) == n and len(np.unique(union)) == n  # disjoint and complete
    assert union.min() == 0 and union.max() == n - 1
    assert abs(len(parts[0]) / n - 0.15) < 0.01 and abs(len(parts[1]) / n - 1 / 60) < 0.005


def test_split_follows_the_seed(digits):
    same = OnlineData("digits", seed=0)
    other = OnlineData("digits", seed=1)
    np.testing.assert_array_equal(same.indices["online"], digits.indices["online"])
    assert not np.array_equal(other.indices["online"], digits.indices["online"])


# --- streams: shapes, determinism, windows --------------------------------------------------------

GETTERS = {
    "offline_train": lambda d, n, start=0: d.offline_train(n, start),
    "validation": lambda d, n, start=0: d.validation(n, start),
    "test": lambda d, n, start=0: d.test(n, start),
    **{f"online-{env}": functools.partial(lambda env, d, n, start=0: d.online(env, n, start), env)
       for env in ENVS},
}


@pytest.mark.parametrize("getter", GETTERS)
def test_stream_shapes_dtypes_ranges(digits, getter):
    x, y = GETTERS[getter](digits, 300)
    assert x.shape == (300, 1, 8, 8) and x.dtype == np.float32
    assert y.shape == (300,) and y.dtype == np.int64
    assert x.min() >= 0 and x.max() <= 1 and x.max() > 0.5
    # Digits' validation split has only 24 base images: not every class need be there.
    assert y.min() >= 0 and y.max() < 10 and len(np.unique(y)) >= 5


@pytest.mark.parametrize("getter", GETTERS)
def test_window_equals_slice_of_longer_request(digits, getter):
    # 450 crosses the 200-sample shift segments and the online split's cycles would not matter;
    # start=130 lands inside a segment.
    x_all, y_all = GETTERS[getter](digits, 450)
    x_part, y_part = GETTERS[getter](digits, 250, start=130)
    np.testing.assert_array_equal(x_part, x_all[130:380])
    np.testing.assert_array_equal(y_part, y_all[130:380])


@pytest.mark.parametrize("getter", GETTERS)
def test_streams_are_reproducible_and_follow_the_seed(digits, getter):
    x, y = GETTERS[getter](digits, 120, start=500)
    x2, y2 = GETTERS[getter](OnlineData("digits", seed=0, segment=SEGMENT), 120, start=500)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    x3, _ = GETTERS[getter](OnlineData("digits", seed=1, segment=SEGMENT), 120, start=500)
    assert not np.array_equal(x, x3)


def test_streams_differ_from_each_other(digits):
    # Each stream has its own randomness: the test images at the same index are distorted
    # differently from one stream to another, and offline/online use disjoint base images.
    x_off, _ = digits.offline_train(100)
    x_val, _ = digits.validation(100)
    x_on, _ = digits.online("control", 100)
    assert not np.array_equal(x_off, x_val) and not np.array_equal(x_off, x_on)


def test_offline_cycle_visits_each_base_image_once(digits):
    base = digits.indices["offline"]
    n = len(base)
    _, y = digits.offline_train(2 * n)
    expected = np.bincount(digits.dataset.y_train[base], minlength=10)
    np.testing.assert_array_equal(np.bincount(y[:n], minlength=10), expected)
    np.testing.assert_array_equal(np.bincount(y[n:], minlength=10), expected)
    assert not np.array_equal(y[:n], y[n:])  # a fresh order each cycle


def test_test_stream_is_the_test_set_in_order(digits):
    x, y = digits.test()
    np.testing.assert_array_equal(y, digits.dataset.y_test)
    # A second cycle: same labels, fresh distortions.
    x2, y2 = digits.test(len(y), start=len(y))
    np.testing.assert_array_equal(y2, y)
    assert not np.array_equal(x2, x)


def test_default_lengths(digits):
    assert len(digits.validation()[1]) == 10 * len(digits.indices["validation"])
    assert len(digits.test()[1]) == len(digits.dataset.y_test)
    assert digits.online("control", 0)[0].shape == (0, 1, 8, 8)


def test_samples_carry_their_base_images_label():
    # Undistorted (alpha=0), every sample is exactly one image of its own split, with its label.
    data = OnlineData("digits", seed=0, alpha=0.0)
    train = data.dataset.x_train.reshape(len(data.dataset.y_train), -1)
    lookup = {row.tobytes(): i for i, row in enumerate(train)}
    for split, (x, y) in {"offline": data.offline_train(300, start=100),
                          "validation": data.validation(60),
                          "online": data.online("control", 300, start=1000)}.items():
        pixels = np.rint(x.reshape(len(x), -1) * 255).astype(np.uint8)
        index = np.array([lookup[row.tobytes()] for row in pixels])
        assert np.isin(index, data.indices[split]).all(), split
        np.testing.assert_array_equal(data.dataset.y_train[index], y)
    x, y = data.test(50, start=359)  # the second cycle starts over
    np.testing.assert_array_equal(np.rint(x[:, 0] * 255), data.dataset.x_test[:50])


@needs_fashion
def test_samples_are_distorted_copies_of_their_base_images(fashion):
    x, y = fashion.offline_train(60, start=20000)
    plain = OnlineData("fashion-mnist", seed=0, alpha=0.0)
    x0, y0 = plain.offline_train(60, start=20000)
    np.testing.assert_array_equal(y, y0)
    similarity = np.array([corr(a, b) for a, b in zip(x, x0)])
    assert np.median(similarity) > 0.6 and similarity.min() > 0.2
    assert np.all(np.abs(x - x0).max(axis=(1, 2, 3)) > 0.1)


@needs_fashion
def test_ten_thousand_online_samples_come_in_one_call(fashion):
    x, y = fashion.online("control", 10_000)
    assert x.shape == (10_000, 1, 28, 28) and y.shape == (10_000,)


# --- the elastic transform ------------------------------------------------------------------------

@needs_fashion
def test_elastic_changes_the_image_but_keeps_it_similar(fashion_images):
    images, _ = fashion_images
    out = elastic_transform(images, np.random.default_rng(0))
    assert out.shape == images.shape and out.dtype == np.float32
    assert out.min() >= 0 and out.max() <= 1
    similarity = np.array([corr(before, after) for before, after in zip(images, out)])
    assert np.all(np.abs(out - images).max(axis=(1, 2)) > 0.1)
    # Simard's alpha=34, sigma=4 are tuned for digit strokes; the textures of a few clothes
    # decorrelate faster, so most (not all) images stay above 0.5.
    assert np.median(similarity) > 0.6 and np.mean(similarity > 0.5) >= 0.85
    assert similarity.min() > 0.25
    # Stronger distortion, lower similarity.
    strong = elastic_transform(images, np.random.default_rng(0), alpha=200.0)
    assert np.mean([corr(a, b) for a, b in zip(images, strong)]) < similarity.mean() - 0.1


@needs_fashion
def test_elastic_with_alpha_zero_is_the_identity(fashion_images):
    images, _ = fashion_images
    out = elastic_transform(images, np.random.default_rng(0), alpha=0.0)
    np.testing.assert_allclose(out, images, atol=1e-6)


def test_elastic_single_image_and_generators():
    image = np.zeros((8, 8), dtype=np.float64)
    image[2:6, 3:5] = 1.0
    out = elastic_transform(image, np.random.default_rng(5))
    assert out.shape == (8, 8) and out.dtype == np.float32
    assert not np.allclose(out, image) and corr(out, image) > 0.5
    np.testing.assert_array_equal(out, elastic_transform(image, np.random.default_rng(5)))
    # One generator per image: an image's result depends on its own generator only.
    batch = np.stack([image, image[::-1]])
    per_image = elastic_transform(batch, [np.random.default_rng(5), np.random.default_rng(6)])
    np.testing.assert_array_equal(per_image[0], out)


def test_elastic_rejects_integer_images():
    with pytest.raises(UsageError, match="float"):
        elastic_transform(np.zeros((8, 8), dtype=np.uint8), np.random.default_rng(0))


# --- the shift augmentations ----------------------------------------------------------------------

@needs_fashion
@pytest.mark.parametrize("augment", [spatial_transform, background_gradient, white_noise])
def test_augmentation_ranges_and_strength_zero(fashion_images, augment):
    images, _ = fashion_images
    out = augment(images, np.random.default_rng(0))
    assert out.shape == images.shape and out.dtype == np.float32
    assert out.min() >= 0 and out.max() <= 1
    assert np.abs(out - images).mean() > 0.01
    np.testing.assert_allclose(augment(images, np.random.default_rng(0), strength=0.0), images,
                               atol=1e-6)
    with pytest.raises(UsageError, match="strength"):
        augment(images, np.random.default_rng(0), strength=1.5)


def centroids(images):
    rows, cols = np.mgrid[0:images.shape[1], 0:images.shape[2]]
    mass = images.sum(axis=(1, 2))
    return np.stack([(images * rows).sum(axis=(1, 2)) / mass,
                     (images * cols).sum(axis=(1, 2)) / mass], axis=1)


@needs_fashion
def test_spatial_transform_moves_rotates_and_scales(fashion_images):
    images, _ = fashion_images
    out = spatial_transform(images, np.random.default_rng(1))
    moved = np.linalg.norm(centroids(out) - centroids(images), axis=1)
    assert moved.mean() > 1.0  # shifts of up to 3 px per axis
    assert moved.max() < 8.0
    # Scaling changes how much ink there is (area ~ scale^2); rotation keeps it.
    ratio = out.sum(axis=(1, 2)) / images.sum(axis=(1, 2))
    assert ratio.std() > 0.05
    assert 0.4 < ratio.min() and ratio.max() < 1.6


def test_spatial_transform_rotates_up_to_30_degrees():
    # A centred horizontal bar: its principal axis after the transform is the rotation angle
    # (scale and shift do not turn it). Uniform in +-30 deg has a std of 17.3 deg.
    bar = np.zeros((400, 28, 28), dtype=np.float32)
    bar[:, 13:15, 4:24] = 1.0
    out = spatial_transform(bar, np.random.default_rng(4))
    rows, cols = np.mgrid[0:28, 0:28]
    mass = out.sum(axis=(1, 2))
    r0 = (out * rows).sum(axis=(1, 2)) / mass
    c0 = (out * cols).sum(axis=(1, 2)) / mass
    dr, dc = rows - r0[:, None, None], cols - c0[:, None, None]
    mu_rr, mu_cc = (out * dr * dr).sum(axis=(1, 2)), (out * dc * dc).sum(axis=(1, 2))
    mu_rc = (out * dr * dc).sum(axis=(1, 2))
    angles = np.degrees(0.5 * np.arctan2(2 * mu_rc, mu_cc - mu_rr))
    assert np.abs(angles).max() < 32
    assert 14 < angles.std() < 20
    assert abs(angles.mean()) < 3


@needs_fashion
def test_background_gradient_lights_the_background(fashion_images):
    images, _ = fashion_images
    out = background_gradient(images, np.random.default_rng(2))
    background = images < 0.01
    assert out[background].mean() > 0.05  # was ~0
    # A linear ramp: along some direction the background brightness changes steadily; the
    # brightest pixel of each image never exceeds the original (contrast <= 1 plus ramp <= 1).
    assert np.all(out.max(axis=(1, 2)) <= 1.0)
    assert np.mean([corr(a, b) for a, b in zip(images, out)]) > 0.5


def test_white_noise_has_the_stated_std():
    grey = np.full((200, 16, 16), 0.5, dtype=np.float32)
    out = white_noise(grey, np.random.default_rng(3))
    assert abs((out - grey).std() - 0.2) < 0.01
    assert abs((out - grey).mean()) < 0.01


def test_class_clustering_orders_into_dominated_windows():
    labels = np.random.default_rng(0).integers(0, 10, 10_000)
    order = class_clustering(labels, np.random.default_rng(1), window=1000)
    np.testing.assert_array_equal(np.sort(order), np.arange(10_000))
    previous_top = set()
    for w in range(10):
        counts = np.bincount(labels[order[w * 1000:(w + 1) * 1000]], minlength=10)
        top = np.argsort(counts)[::-1]
        assert counts[top[:3]].sum() >= 700, counts  # 2-3 classes hold ~80 %
        assert set(top[:2]).isdisjoint(previous_top)  # a different set each window
        previous_top = set(top[:2])
    # Without clustering no window is dominated.
    plain = class_clustering(labels, np.random.default_rng(1), strength=0.0, window=1000)
    top3 = [np.sort(np.bincount(labels[plain[w * 1000:(w + 1) * 1000]]))[-3:].sum()
            for w in range(10)]
    assert max(top3) < 400


# --- the shift stream -----------------------------------------------------------------------------

def test_segments_describe_the_shift_stream(digits):
    segments = digits.segments(16 * SEGMENT + 50)
    assert [(s["start"], s["stop"]) for s in segments] == \
        [(k * SEGMENT, (k + 1) * SEGMENT) for k in range(16)] + [(3200, 3250)]
    combos = [tuple(s["augmentations"]) for s in segments[:15]]
    assert len(set(combos)) == 15 and all(combos)  # every non-empty combination once, from segment 0
    for combo in combos:
        assert list(combo) == [a for a in AUGMENTATIONS if a in combo]
    assert all(a != b for a, b in zip(combos, combos[1:] + [tuple(segments[15]["augmentations"])]))
    assert digits.segments(0) == []
    # Same seed, same plan; another seed, another order.
    assert OnlineData("digits", seed=0, segment=SEGMENT).segments(3000) == digits.segments(3000)
    assert OnlineData("digits", seed=1, segment=SEGMENT).segments(3000) != digits.segments(3000)


def test_shift_combinations_never_repeat_back_to_back():
    # Over many 15-segment cycles: each cycle uses all 15 combinations, and the first of a cycle
    # never repeats the last of the one before (a boundary collision is otherwise ~1 in 15).
    data = OnlineData("digits", seed=0, segment=1)
    combos = [tuple(s["augmentations"]) for s in data.segments(15 * 40)]
    for cycle in range(40):
        assert len(set(combos[15 * cycle:15 * (cycle + 1)])) == 15
    assert all(a != b for a, b in zip(combos, combos[1:]))
    assert data.segment_augmentations(15 * 40 - 1) == list(combos[-1])


def neighbour_correlation(x):
    return corr(x[..., :-1], x[..., 1:])


def test_shift_stream_does_what_segments_say(digits):
    n = 16 * SEGMENT
    x_shift, y_shift = digits.online("shift", n)
    x_plain, y_plain = digits.online("control", n)
    for segment in digits.segments(n):
        part = slice(segment["start"], segment["stop"])
        augmentations = segment["augmentations"]
        xs, ys, xp, yp = x_shift[part], y_shift[part], x_plain[part], y_plain[part]
        # CD only reorders the segment's samples.
        np.testing.assert_array_equal(np.sort(ys), np.sort(yp))
        assert ("CD" in augmentations) == (not np.array_equal(ys, yp)), augmentations
        if not augmentations:
            np.testing.assert_array_equal(xs, xp)
        elif augmentations == ["CD"]:
            # The same images, in another order.
            def by_pixels(a):
                return a[np.lexsort(a.reshape(len(a), -1).T)]
            np.testing.assert_array_equal(by_pixels(xs), by_pixels(xp))
        else:
            assert np.abs(np.sort(xs.ravel()) - np.sort(xp.ravel())).mean() > 0.01
        # Per-pixel noise decorrelates neighbouring pixels; ST and BG (interpolation, a smooth
        # ramp) only make them more alike.
        if "WN" in augmentations:
            assert neighbour_correlation(xs) < neighbour_correlation(xp) - 0.03, augmentations
        else:
            assert neighbour_correlation(xs) > neighbour_correlation(xp) - 0.01, augmentations


@needs_fashion
def test_shift_clustering_segment_is_dominated_by_few_classes(fashion):
    k = next(s for s in fashion.segments(200_000) if "CD" in s["augmentations"])
    _, y = fashion.online("shift", 3000, start=k["start"])
    for w in range(3):
        counts = np.bincount(y[w * 1000:(w + 1) * 1000], minlength=10)
        assert np.sort(counts)[-3:].sum() >= 700, counts


def test_weight_drift_environments_see_the_control_images(digits):
    x, y = digits.online("control", 250, start=100)
    for env in ("analog", "digital"):
        x_env, y_env = digits.online(env, 250, start=100)
        np.testing.assert_array_equal(x_env, x)
        np.testing.assert_array_equal(y_env, y)


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, match", [
    (lambda d: d.online("drift", 10), "env must be one of control, shift, analog, digital"),
    (lambda d: d.online("control", -1), "n must be"),
    (lambda d: d.online("shift", 10, start=-5), "start must be"),
    (lambda d: d.offline_train(2.5), "n must be"),
    (lambda d: d.validation(-3), "n must be"),
    (lambda d: d.segments(-1), "n must be"),
    (lambda d: d.segment_augmentations(-1), "k must be"),
])
def test_bad_arguments_are_usage_errors(digits, call, match):
    with pytest.raises(UsageError, match=match):
        call(digits)


@pytest.mark.parametrize("kwargs, match", [
    ({"dataset": "cifar"}, "unknown dataset 'cifar'.*digits"),
    ({"dataset": "digits", "segment": 0}, "segment must be an integer >= 1"),
    ({"dataset": "digits", "seed": -1}, "seed must be"),
    ({"dataset": "digits", "alpha": -1.0}, "alpha must be >= 0"),
])
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(UsageError, match=match):
        OnlineData(**kwargs)


def test_the_elastic_strength_is_the_datasets():
    # The paper's alpha 34 is for MNIST's strokes; FashionMNIST's textures get a milder one.
    assert OnlineData("fashion-mnist", seed=0).alpha == 8.0
    assert OnlineData("digits", seed=0).alpha == 34.0
    assert OnlineData("fashion-mnist", seed=0, alpha=34.0).alpha == 34.0
