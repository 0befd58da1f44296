"""The *online dataset* of the LRT paper: offline/validation/test sets and the online streams.

Follows appendix G of Gural, Nadeau, Tikekar and Murmann, "Low-rank training of deep neural
networks for emerging memory technology" (arXiv 2009.03887; appendix F, "ONLINE DATASET", of the
longer "Streaming Kronecker sum training"; both in ``shared/papers``):

* the 60k training images are split 9k / 1k / 50k into offline-train, validation and online
  partitions (here proportionally for other dataset sizes: 15 % / 1/60 / the rest);
* elastic transforms (Simard et al., 2003) augment each partition into longer streams (the paper:
  50k offline-train, 10k validation, 100k online samples) and the test images into the test set;
* the *distribution-shift* stream gives every contiguous 10k online samples its own combination of
  four augmentations: class-distribution clustering (CD), spatial transforms (ST), background
  gradients (BG) and white noise (WN);
* the analog and digital environments drift the *weights* (done by the trainer); their images are
  the plain online stream, like the control environment.

Any ``--dataset`` (:func:`insitu.data.load_dataset`: the built-ins, or the user's ``folder:``,
``npz:``, ``csv:``) gives these streams, with the number of classes it has:

* **images** are grey here: the augmentations are defined on one channel, so RGB images are
  brought to grey by the data layer's one rule (``Dataset.fit_images(channels=1)``), and every
  image keeps the dataset's size (the elastic and spatial parameters scale with it);
* **feature vectors** (a table, 2-D arrays) have no pixels to warp: the streams cycle through the
  plain vectors in fresh orders (no elastic transform), and the shift stream uses only the two
  augmentations defined on vectors, class clustering (CD) and white noise (WN, per feature), in
  their three combinations, so that every segment is shifted too; spatial transforms (ST) and
  background gradients (BG) are image-only and never applied to them. Samples are ``(n, F)``.

Every sample is a pure function of ``(seed, stream, index)``: sample ``i`` draws its randomness
from its own generator, so any window of a stream can be produced on its own and equals the same
window of a longer request (``offline_train(100, start=50)`` is the tail of ``offline_train(150)``).

    >>> data = OnlineData("digits", seed=0)
    >>> x, y = data.online("shift", 256)
    >>> x.shape, x.dtype, y.dtype
    ((256, 1, 8, 8), dtype('float32'), dtype('int64'))
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import numpy as np
from scipy import ndimage

from insitu.data import load_dataset
from insitu.errors import UsageError
from insitu.lrt import ENVS

__all__ = ["OnlineData", "ENVS", "AUGMENTATIONS", "VECTOR_AUGMENTATIONS", "elastic_transform",
           "spatial_transform", "background_gradient", "white_noise", "class_clustering"]

#: The distribution-shift augmentations, in the order they are applied to an image (CD only
#: reorders samples; the geometric ST comes before the photometric BG, noise last).
AUGMENTATIONS = ("CD", "ST", "BG", "WN")

#: The side length the elastic/spatial parameters are given for (MNIST, FashionMNIST).
REFERENCE_SIZE = 28

# Stream codes in the seeds of the per-sample generators; changing them changes every dataset.
_SPLIT, _OFFLINE, _VALIDATION, _TEST, _ONLINE, _SHIFT = range(6)
# What a generator of a stream is for (the third seed word): one sample, the order of one cycle
# through the base images, the class-clustering order of one segment, the combinations of
# segments.
_SAMPLE, _CYCLE, _CLUSTER, _COMBOS = range(4)
# Samples are generated in chunks of this many to bound the size of the temporary arrays.
_CHUNK = 1024

Rng = np.random.Generator | Sequence[np.random.Generator]


# --- per-image randomness -----------------------------------------------------------------------

def _draws(rng: Rng, n: int, shape: tuple[int, ...], normal: bool = False) -> np.ndarray:
    """``(n, *shape)`` float64 draws: uniform [0, 1) or standard normal.

    ``rng`` is one generator for the whole batch, or one generator per image; with the latter an
    image's draws depend only on its own generator, which is what makes streams indexable.
    """
    out = np.empty((n, *shape))
    if isinstance(rng, np.random.Generator):
        if normal:
            rng.standard_normal(out=out)
        else:
            rng.random(out=out)
        return out
    if len(rng) != n:
        raise UsageError(f"rng: got {len(rng)} generators for {n} images; pass one generator, "
                         "or one per image")
    for i, g in enumerate(rng):
        # out= fills in place: much faster than stacking 10k small arrays.
        if normal:
            g.standard_normal(out=out[i])
        else:
            g.random(out=out[i])
    return out


def _as_images(images, name: str = "images") -> tuple[np.ndarray, bool]:
    """``(N, H, W)`` float32 images and whether a single ``(H, W)`` image was given."""
    array = np.asarray(images)
    if not np.issubdtype(array.dtype, np.floating):
        raise UsageError(f"{name}: expected float images in [0, 1], got {array.dtype}; convert "
                         "them first (Dataset.float_images, or x / 255)")
    if array.ndim not in (2, 3):
        raise UsageError(f"{name}: expected one (H, W) image or a batch (N, H, W), got shape "
                         f"{array.shape}")
    single = array.ndim == 2
    return np.array(array[None] if single else array, dtype=np.float32), single


def _check_strength(strength: float) -> float:
    strength = float(strength)
    if not 0.0 <= strength <= 1.0:
        raise UsageError(f"strength must be in [0, 1] (0: no change, 1: the paper's ranges), "
                         f"got {strength}")
    return strength


# --- elastic transform (Simard et al. 2003) -----------------------------------------------------

@functools.lru_cache(maxsize=16)
def _smoothing_matrix(size: int, sigma: float) -> np.ndarray:
    # A Gaussian filter along one axis is a linear map; as a (size, size) matrix (the filter's
    # response to each unit impulse) it smooths a whole batch of fields with one matmul, which is
    # several times faster than gaussian_filter on 10k small fields and gives the same result.
    matrix = ndimage.gaussian_filter1d(np.eye(size), sigma, axis=0, mode="reflect")
    matrix.flags.writeable = False
    return matrix


def elastic_transform(images, rng: Rng, alpha: float = 34.0, sigma: float = 4.0) -> np.ndarray:
    """Elastic distortion of Simard et al. (2003): warp by a smoothed random displacement field.

    Each pixel's displacement (dy, dx) starts uniform in [-1, 1], is smoothed by a Gaussian of
    width ``sigma`` and scaled by ``alpha``; the image is resampled at the displaced positions
    (bilinear, zero outside). ``images``: one float ``(H, W)`` image or a batch ``(N, H, W)`` in
    [0, 1]; returns float32 of the same shape in [0, 1]. ``alpha = 0`` is the identity.

    ``alpha`` and ``sigma`` are given for 28x28 images (the defaults suit MNIST); for another
    size ``s = min(H, W) / 28`` the field is smoothed with ``sigma * s`` and scaled by
    ``alpha * s**2``: smoothing by ``sigma`` shrinks the field's amplitude by ``1 / sigma``, so
    these keep both the smoothness and the displacement in proportion to the image.
    """
    batch, single = _as_images(images)
    n, height, width = batch.shape
    scale = min(height, width) / REFERENCE_SIZE
    alpha_px, sigma_px = float(alpha) * scale ** 2, float(sigma) * scale
    if sigma_px <= 0:
        raise UsageError(f"sigma must be > 0, got {sigma}")
    fields = 2.0 * _draws(rng, n, (2, height, width)) - 1.0
    fields = _smoothing_matrix(height, sigma_px) @ fields @ _smoothing_matrix(width, sigma_px).T
    fields *= alpha_px
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
    out = np.empty_like(batch)
    for i in range(n):
        # One 2-D resample per image: 3-D map_coordinates over the stack interpolates along the
        # batch axis too (8 taps instead of 4) and is ~4x slower.
        ndimage.map_coordinates(batch[i], (rows + fields[i, 0], cols + fields[i, 1]),
                                output=out[i], order=1, mode="constant", cval=0.0)
    np.clip(out, 0.0, 1.0, out=out)
    return out[0] if single else out


# --- distribution-shift augmentations -----------------------------------------------------------

def spatial_transform(images, rng: Rng, strength: float = 1.0) -> np.ndarray:
    """Random rotation (up to +-30 deg), scale (0.8..1.2) and shift (+-3 px at 28x28) per image.

    The image is transformed about its centre (bilinear, zero outside). ``strength`` in [0, 1]
    scales the three ranges (0: identity). The shift range is in proportion to the image size.
    """
    batch, single = _as_images(images)
    strength = _check_strength(strength)
    n, height, width = batch.shape
    u = _draws(rng, n, (4,))
    angles = np.deg2rad(30.0) * strength * (2 * u[:, 0] - 1)
    scales = 1.0 + 0.2 * strength * (2 * u[:, 1] - 1)
    max_shift = 3.0 * strength * min(height, width) / REFERENCE_SIZE
    shifts = max_shift * (2 * u[:, 2:] - 1)
    centre = np.array([(height - 1) / 2, (width - 1) / 2])
    out = np.empty_like(batch)
    for i in range(n):
        # affine_transform maps *output* coordinates to input ones, so it takes the inverse of
        # "scale and rotate about the centre, then shift": in = R(-a) / s @ (o - c - t) + c.
        cos, sin = np.cos(angles[i]), np.sin(angles[i])
        inverse = np.array([[cos, sin], [-sin, cos]]) / scales[i]
        offset = centre - inverse @ (centre + shifts[i])
        ndimage.affine_transform(batch[i], inverse, offset=offset, output=out[i], order=1,
                                 mode="constant", cval=0.0)
    np.clip(out, 0.0, 1.0, out=out)
    return out[0] if single else out


def background_gradient(images, rng: Rng, strength: float = 1.0) -> np.ndarray:
    """Lower the contrast and blend in a black-to-white linear gradient at a random angle.

    ``out = c * image + (1 - c) * g`` with contrast ``c`` uniform in [1 - 0.5 * strength, 1] and
    ``g`` a ramp from 0 to 1 across the image; the blend keeps values in [0, 1] and the object
    still brighter than the background under it.
    """
    batch, single = _as_images(images)
    strength = _check_strength(strength)
    n, height, width = batch.shape
    u = _draws(rng, n, (2,))
    contrast = (1.0 - 0.5 * strength * u[:, 0]).astype(np.float32)[:, None, None]
    angle = 2 * np.pi * u[:, 1]
    rows, cols = np.mgrid[0:height, 0:width]
    ramp = np.cos(angle)[:, None, None] * cols + np.sin(angle)[:, None, None] * rows
    low = ramp.min(axis=(1, 2), keepdims=True)
    high = ramp.max(axis=(1, 2), keepdims=True)
    ramp = ((ramp - low) / (high - low)).astype(np.float32)
    out = contrast * batch + (1 - contrast) * ramp
    np.clip(out, 0.0, 1.0, out=out)
    return out[0] if single else out


def white_noise(images, rng: Rng, strength: float = 1.0, sigma: float = 0.2) -> np.ndarray:
    """Add independent Gaussian noise (std ``sigma * strength``) to every pixel; clip to [0, 1]."""
    batch, single = _as_images(images)
    strength = _check_strength(strength)
    n, height, width = batch.shape
    noise = _draws(rng, n, (height, width), normal=True)
    out = (batch + (sigma * strength) * noise).astype(np.float32)
    np.clip(out, 0.0, 1.0, out=out)
    return out[0] if single else out


def class_clustering(labels, rng: np.random.Generator, strength: float = 1.0,
                     window: int = 1000, share: float = 0.8) -> np.ndarray:
    """An order of ``labels``' indices in which each window of ``window`` samples is dominated by
    2 or 3 classes (about ``share`` of it at ``strength`` 1), a different set in each next window.

    Returns a permutation of ``range(len(labels))``: the samples are only reordered, so the
    class counts of the whole are kept. Each window draws its dominant classes (none of the
    previous window's; classes dominant least often so far first); the sample counts per
    (window, class) are then balanced so that every window is full and every sample used
    (Sinkhorn scaling of the target shares). ``strength`` 0 gives a plain random order. Window
    boundaries of the result may be off by a few samples (rounding).
    """
    labels = np.asarray(labels)
    strength = _check_strength(strength)
    window = _count(window, "window", minimum=1)
    if not 0.0 < share <= 1.0:
        raise UsageError(f"share must be in (0, 1], got {share}")
    n = len(labels)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    num_classes, num_windows = len(classes), -(-n // window)
    if strength == 0 or num_classes < 2 or num_windows < 2:
        # One window cannot be clustered by reordering: its class mix is the whole's.
        return rng.permutation(n).astype(np.int64)

    sizes = np.full(num_windows, float(window))
    sizes[-1] = n - window * (num_windows - 1)
    frequency = counts / n
    target = np.empty((num_windows, num_classes))
    times_dominant = np.zeros(num_classes)
    previous = np.zeros(num_classes, dtype=bool)
    for w in range(num_windows):
        k = min(int(rng.integers(2, 4)), max(1, num_classes // 2))
        # Least-used classes first, relative to how common they are; noise breaks ties.
        score = times_dominant / frequency + rng.random(num_classes)
        score[previous] = np.inf
        dominant = np.zeros(num_classes, dtype=bool)
        dominant[np.argsort(score, kind="stable")[:k]] = True
        times_dominant[dominant] += 1
        previous = dominant
        # Interpolate between the window's natural share of these classes and `share`.
        natural = frequency[dominant].sum()
        wanted = natural + strength * max(share - natural, 0.0)
        target[w] = np.where(dominant, wanted / k, (1 - wanted) / (num_classes - k)) * sizes[w]

    # Sinkhorn: rescale columns to the class counts and rows to the window sizes until both hold.
    for _ in range(200):
        target *= counts / target.sum(axis=0)
        target *= (sizes / target.sum(axis=1))[:, None]
        if np.abs(target.sum(axis=0) - counts).max() < 1e-3:
            break
    # Round the cumulative counts so that each class's total is exact.
    cumulative = np.rint(np.cumsum(target, axis=0)).astype(np.int64)
    cumulative[-1] = counts
    cumulative = np.maximum.accumulate(np.clip(cumulative, 0, counts), axis=0)

    members = [rng.permutation(np.flatnonzero(inverse == c)) for c in range(num_classes)]
    bounds = np.vstack([np.zeros(num_classes, dtype=np.int64), cumulative])
    order = []
    for w in range(num_windows):
        chunk = np.concatenate([members[c][bounds[w, c]:bounds[w + 1, c]]
                                for c in range(num_classes)])
        order.append(rng.permutation(chunk))
    return np.concatenate(order).astype(np.int64)


_IMAGE_AUGMENTATIONS = {"ST": spatial_transform, "BG": background_gradient, "WN": white_noise}
#: The augmentations defined on feature vectors (the shift stream of a features dataset).
VECTOR_AUGMENTATIONS = ("CD", "WN")


def _combinations(augmentations: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The non-empty combinations of ``augmentations`` (15 of the four), each in their order."""
    return tuple(tuple(a for bit, a in enumerate(augmentations) if mask >> bit & 1)
                 for mask in range(1, 2 ** len(augmentations)))


# --- argument checks ----------------------------------------------------------------------------

def _count(value, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def _generator(*words: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(w) for w in words]))


# --- the dataset --------------------------------------------------------------------------------

#: The elastic transform's strength per dataset. The paper's (Simard et al.'s and Ernestus's
#: alpha = 34, sigma = 4) are for MNIST's strokes; on FashionMNIST they wipe out the textures that
#: tell the classes apart: a linear classifier on 9k offline samples scores 84.6 % on undistorted
#: validation images, 81.6 % at alpha 8, 77.7 % at 16 and 65.4 % at 34, and no float CNN trained
#: here went past 82 % at 34. Alpha 8 keeps the augmentation's variety at the cost it has on MNIST.
ELASTIC_ALPHA = {"mnist": 34.0, "fashion-mnist": 8.0, "digits": 34.0}
#: The user's images: the milder strength, which keeps textures (strokes survive it too).
DEFAULT_ELASTIC_ALPHA = 8.0


class OnlineData:
    """The paper's offline, validation, test and online data built from one dataset.

    ``dataset``/``data_dir`` are those of :func:`insitu.data.load_dataset`; ``seed`` fixes the
    split, the sample order and every augmentation; ``segment`` is the length of the shift
    stream's segments (10k in the paper), each with its own augmentations; class clustering
    groups the classes in windows of ``segment // 10`` samples (1k in the paper). ``alpha`` and
    ``sigma`` are the elastic transform's (for 28x28; see :func:`elastic_transform`); ``alpha=0``
    gives the undistorted base images; ``alpha=None`` is :data:`ELASTIC_ALPHA`'s for the dataset
    (:data:`DEFAULT_ELASTIC_ALPHA` for the user's images; feature vectors are never warped).

    All getters return ``(x, y)``: ``x`` float32 ``(n, 1, H, W)`` in [0, 1] (images) or ``(n, F)``
    (features), ``y`` int64 ``(n,)``. Streams are endless: they cycle through their base samples,
    in a fresh random order (and with fresh elastic distortions) each cycle; test cycles in the
    dataset's order. ``dataset`` is the grey (or features) dataset they are drawn from.
    """

    def __init__(self, dataset: str = "fashion-mnist", data_dir=None, seed: int = 0,
                 segment: int = 10_000, *, alpha: float | None = None, sigma: float = 4.0):
        self.seed = _count(seed, "seed")
        self.segment = _count(segment, "segment", minimum=1)
        self.window = max(1, self.segment // 10)
        alpha = ELASTIC_ALPHA.get(dataset, DEFAULT_ELASTIC_ALPHA) if alpha is None else alpha
        self.alpha, self.sigma = float(alpha), float(sigma)
        if self.alpha < 0 or self.sigma <= 0:
            raise UsageError(f"alpha must be >= 0 and sigma > 0 (the elastic transform's), got "
                             f"alpha={alpha}, sigma={sigma}")
        ds = load_dataset(dataset, data_dir)
        self.images = ds.kind == "images"
        self.dataset = ds.fit_images(channels=1) if self.images else ds
        self.augmentations = AUGMENTATIONS if self.images else VECTOR_AUGMENTATIONS
        self._combos = _combinations(self.augmentations)

        # The paper's 9k / 1k / 50k of 60k: 15 %, 1/60 and the rest.
        n = len(self.dataset.y_train)
        n_offline, n_validation = round(0.15 * n), max(1, round(n / 60))
        order = _generator(self.seed, _SPLIT).permutation(n)
        parts = np.split(order, [n_offline, n_offline + n_validation])
        self.indices = {}
        for name, part in zip(("offline", "validation", "online"), parts):
            part = np.sort(part)
            part.flags.writeable = False
            self.indices[name] = part
        if min(len(p) for p in parts) == 0:
            raise UsageError(f"dataset {dataset!r} has only {n} training images; the online "
                             "dataset needs at least 3")
        self._cycle_cache: dict[tuple[int, int], np.ndarray] = {}
        self._cluster_cache: dict[int, np.ndarray] = {}
        self._combo_orders: list[np.ndarray] = []

    # --- description ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.dataset.name

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample of ``x``: ``(1, H, W)``, or ``(F,)`` for features."""
        return (1, *self.dataset.sample_shape) if self.images else self.dataset.sample_shape

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def sizes(self) -> dict[str, int]:
        """The paper's stream lengths scaled to this dataset (60k train images: offline 50k,
        validation 10k, online 100k, test 10k)."""
        return {"offline_train": round(len(self.indices["offline"]) * 50 / 9),
                "validation": 10 * len(self.indices["validation"]),
                "online": 2 * len(self.indices["online"]),
                "test": len(self.dataset.y_test)}

    # --- the streams ----------------------------------------------------------------------------

    def offline_train(self, n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Samples ``start .. start + n - 1`` of the elastic-augmented offline-train stream."""
        return self._stream(_OFFLINE, self._positions(n, start))

    def validation(self, n: int | None = None, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The validation stream; ``n`` defaults to ``sizes["validation"]`` (10x its images)."""
        n = self.sizes["validation"] if n is None else n
        return self._stream(_VALIDATION, self._positions(n, start))

    def test(self, n: int | None = None, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Elastic-augmented test images in the dataset's order; ``n`` defaults to all of them."""
        n = self.sizes["test"] if n is None else n
        return self._stream(_TEST, self._positions(n, start))

    def online(self, env: str, n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Samples ``start .. start + n - 1`` of the online stream of environment ``env``.

        "control", "analog" and "digital" all give the plain stream (analog/digital drift the
        weights, not the data); "shift" adds the augmentations that :meth:`segments` describes.
        """
        if env not in ENVS:
            raise UsageError(f"env must be one of {', '.join(ENVS)}; got {env!r}")
        positions = self._positions(n, start)
        if env != "shift":
            return self._stream(_ONLINE, positions)
        return self._shift(positions)

    def segment_augmentations(self, k: int) -> list[str]:
        """The augmentations of shift segment ``k``: each of the 15 non-empty combinations once
        per 15 segments (features: the 3 of CD and WN per 3), in a seeded order. Segment 0 is
        shifted too: the paper applies "unique additional augmentations to every contiguous 10k
        samples" (appendix G)."""
        k = _count(k, "k")
        cycle, index = divmod(k, len(self._combos))
        return list(self._combos[self._combination_order(cycle)[index]])

    def segments(self, n: int) -> list[dict]:
        """The segments of the first ``n`` shift samples: ``{"start", "stop", "augmentations"}``."""
        n = _count(n, "n")
        return [{"start": start, "stop": min(start + self.segment, n),
                 "augmentations": self.segment_augmentations(k)}
                for k, start in enumerate(range(0, n, self.segment))]

    # --- internals ------------------------------------------------------------------------------

    @staticmethod
    def _positions(n, start) -> np.ndarray:
        n, start = _count(n, "n"), _count(start, "start")
        return np.arange(start, start + n, dtype=np.int64)

    def _pool(self, stream: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(images, labels, base indices)`` a stream draws from; None: all, in order (test)."""
        ds = self.dataset
        if stream == _TEST:
            return ds.x_test, ds.y_test, None
        key = {_OFFLINE: "offline", _VALIDATION: "validation", _ONLINE: "online"}[stream]
        return ds.x_train, ds.y_train, self.indices[key]

    def _cycle_order(self, stream: int, cycle: int, size: int) -> np.ndarray:
        key = (stream, cycle)
        if key not in self._cycle_cache:
            if len(self._cycle_cache) > 64:
                self._cycle_cache.clear()
            self._cycle_cache[key] = _generator(self.seed, stream, _CYCLE, cycle).permutation(size)
        return self._cycle_cache[key]

    def _base(self, stream: int, positions: np.ndarray) -> np.ndarray:
        """The index into the dataset split of the image under each stream position."""
        _, labels, members = self._pool(stream)
        size = len(labels) if members is None else len(members)
        cycles, offsets = np.divmod(positions, size)
        if members is None:
            return offsets
        slots = np.empty_like(positions)
        for cycle in np.unique(cycles):
            mask = cycles == cycle
            slots[mask] = self._cycle_order(stream, int(cycle), size)[offsets[mask]]
        return members[slots]

    def _stream(self, stream: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        images, labels, _ = self._pool(stream)
        base = self._base(stream, positions)
        if not self.images:                 # vectors: nothing to warp
            return images[base].astype(np.float32), labels[base].astype(np.int64)
        x = np.empty((len(positions), *self.sample_shape), dtype=np.float32)
        for lo in range(0, len(positions), _CHUNK):
            part = slice(lo, lo + _CHUNK)
            raw = images[base[part]].astype(np.float32) / 255
            rngs = [_generator(self.seed, stream, _SAMPLE, p) for p in positions[part]]
            x[part, 0] = elastic_transform(raw, rngs, self.alpha, self.sigma)
        return x, labels[base].astype(np.int64)

    def _combination_order(self, cycle: int) -> np.ndarray:
        # Built cycle by cycle (cached): each cycle's first combination depends on the last one.
        while len(self._combo_orders) <= cycle:
            index = len(self._combo_orders)
            order = _generator(self.seed, _SHIFT, _COMBOS, index).permutation(len(self._combos))
            # No combination twice in a row across a cycle boundary.
            if index > 0 and order[0] == self._combo_orders[-1][-1]:
                order[[0, 1]] = order[[1, 0]]
            self._combo_orders.append(order)
        return self._combo_orders[cycle]

    def _cluster_order(self, k: int) -> np.ndarray:
        """Segment ``k``'s class-clustered order: offsets into the segment's plain samples."""
        if k not in self._cluster_cache:
            if len(self._cluster_cache) > 8:
                self._cluster_cache.clear()
            plain = k * self.segment + np.arange(self.segment, dtype=np.int64)
            labels = self.dataset.y_train[self._base(_ONLINE, plain)]
            self._cluster_cache[k] = class_clustering(
                labels, _generator(self.seed, _SHIFT, _CLUSTER, k), window=self.window)
        return self._cluster_cache[k]

    def _shift(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        segments, offsets = np.divmod(positions, self.segment)
        combos = {int(k): self.segment_augmentations(int(k)) for k in np.unique(segments)}
        # CD picks which plain online sample sits at each position; the others then alter it.
        plain = positions.copy()
        for k, augmentations in combos.items():
            if "CD" in augmentations:
                mask = segments == k
                plain[mask] = k * self.segment + self._cluster_order(k)[offsets[mask]]
        x, y = self._stream(_ONLINE, plain)
        # The augmentations take (N, H, W) planes: an image's, or a vector as a 1 x F plane.
        planes = x[:, 0] if self.images else x[:, None]
        for k, augmentations in combos.items():
            steps = [a for a in augmentations if a in _IMAGE_AUGMENTATIONS]
            if not steps:
                continue
            where = np.flatnonzero(segments == k)
            for lo in range(0, len(where), _CHUNK):
                part = where[lo:lo + _CHUNK]
                rngs = [_generator(self.seed, _SHIFT, _SAMPLE, p) for p in positions[part]]
                batch = planes[part]
                for step in steps:
                    batch = _IMAGE_AUGMENTATIONS[step](batch, rngs)
                planes[part] = batch
        return x, y
