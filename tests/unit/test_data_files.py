"""The user's own datasets (insitu.data.files) and the one rule that fits images to a model."""

from __future__ import annotations

import numpy as np
import pytest
from own_data import write_csv, write_image_folder, write_npz

from insitu.data import load_dataset
from insitu.data.files import parse_spec
from insitu.data.images import LUMA, fit_images, resize_images, to_channels
from insitu.errors import DataFileError, UsageError

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("insitu_cache")]     # each test its own cache


# ------------------------------------------------------------------------------ the fitting rule

def test_grey_to_rgb_repeats_and_rgb_to_grey_is_bt601_luma():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (5, 6, 7), dtype=np.uint8)
    rgb = to_channels(grey, 3)
    assert rgb.shape == (5, 6, 7, 3) and all(np.array_equal(rgb[..., c], grey) for c in range(3))
    assert np.array_equal(to_channels(rgb, 1), grey)           # luma weights sum to 1
    colour = rng.integers(0, 256, (4, 3, 3, 3), dtype=np.uint8)
    expected = np.rint(colour.astype(np.float64) @ np.asarray(LUMA))
    # float32 arithmetic in the rule: at most one code from the float64 value, at exact halves
    assert np.max(np.abs(to_channels(colour, 1).astype(int) - expected)) <= 1


def test_resize_keeps_constant_images_and_means_and_handles_one_pixel_axes():
    flat = np.full((2, 5, 9, 3), 77, np.uint8)
    assert np.all(resize_images(flat, (13, 4)) == 77)
    line = np.arange(0, 250, 50, dtype=np.uint8).reshape(1, 1, 5)
    assert resize_images(line, (3, 5)).shape == (1, 3, 5)     # one row enlarged: repeated
    assert np.array_equal(resize_images(line, (3, 5))[0, 2], line[0, 0])
    halves = np.zeros((1, 4, 4), np.uint8)
    halves[:, :, 2:] = 200
    assert np.array_equal(resize_images(halves, (2, 2))[0], [[0, 200], [0, 200]])   # area average


def test_fit_changes_channels_then_size_and_passes_through_what_fits():
    rgb = np.random.default_rng(1).integers(0, 256, (3, 12, 12, 3), dtype=np.uint8)
    grey = fit_images(rgb, (8, 8), 1)
    assert grey.shape == (3, 8, 8)
    assert np.array_equal(grey, resize_images(to_channels(rgb, 1), (8, 8)))
    assert fit_images(grey) is grey


# ------------------------------------------------------------------------------ the three kinds

def test_image_folder_with_mixed_modes_and_sizes(tmp_path):
    root = write_image_folder(tmp_path / "imgs", n=120)
    ds = load_dataset(f"folder:{root}")
    # a third are RGB at 12x12, the rest grey 8x8: the folder is RGB at its most common size
    assert ds.kind == "images" and ds.channels == 3 and ds.image_size == (8, 8)
    assert ds.details["resized"] == 40 and ds.details["files"] == 120
    assert ds.num_classes == 10 and ds.class_names[0] == "digit-0"
    assert len(ds.y_train) + len(ds.y_test) == 120
    # the grey PNGs come back exactly, as three equal channels (file 1.png is the second digit)
    digits = load_dataset("digits")
    grey = [i for i in range(len(ds.y_train)) if np.array_equal(ds.x_train[i, ..., 0], digits.x_train[1])]
    assert grey and all(np.array_equal(ds.x_train[grey[0], ..., c], digits.x_train[1]) for c in range(3))
    again = load_dataset(f"folder:{root}")                            # from the disk cache
    assert np.array_equal(again.x_train, ds.x_train) and np.array_equal(again.y_test, ds.y_test)


def test_image_folder_given_split_and_disk_cache(tmp_path, capsys, insitu_cache):
    root = write_image_folder(tmp_path / "imgs", n=80, rgb_every=0, split=True)
    ds = load_dataset(f"folder:{root}")
    assert ds.channels == 1 and ds.splits == {"train": 80, "test": 20}
    assert "cached in" in capsys.readouterr().err
    cached = list((insitu_cache / "datasets").glob("folder-*.npz"))
    assert len(cached) == 1


def test_npz_split_or_not_and_float_images(tmp_path):
    ds = load_dataset(f"npz:{write_npz(tmp_path / 'd.npz', n=200)}")
    assert ds.sample_shape == (8, 8) and ds.splits == {"train": 200, "test": 50}
    whole = load_dataset(str(write_npz(tmp_path / "w.npz", n=200, split=False)))
    assert whole.splits["train"] + whole.splits["test"] == 250
    assert abs(whole.splits["test"] - 50) <= 10                     # stratified 20 %
    floats = np.random.default_rng(0).random((40, 3, 5, 5))           # channel-first floats in [0, 1]
    np.savez(tmp_path / "f.npz", x=floats, y=np.arange(40) % 4)
    ds = load_dataset(f"npz:{tmp_path / 'f.npz'},test=0.25,seed=3")
    assert ds.sample_shape == (5, 5, 3) and ds.x_train.dtype == np.uint8 and ds.splits["test"] == 8   # round(2.5) = 2 of each class


def test_csv_features_are_scaled_by_the_train_split_and_names_numbered(tmp_path):
    ds = load_dataset(f"csv:{write_csv(tmp_path / 't.csv', n=200, names=True)}")
    assert ds.kind == "features" and ds.sample_shape == (16,) and ds.channels is None
    assert ds.class_names == tuple(f"digit-{k}" for k in range(10))
    assert ds.x_train.dtype == np.float32
    assert ds.x_train.min() >= 0 and ds.x_train.max() <= 1 and ds.x_test.min() >= 0
    assert np.array_equal(ds.float_images("train"), ds.x_train)
    with pytest.raises(UsageError, match="takes images"):
        ds.fit_images((8, 8))


def test_csv_split_column_and_label_option(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("kind,a,b,split\n" + "".join(f"{i % 2},{i},{i * i},{'test' if i % 5 == 0 else 'train'}\n"
                                                 for i in range(20)))
    ds = load_dataset(f"csv:{path},label=kind")
    assert ds.splits == {"train": 16, "test": 4} and ds.sample_shape == (2,)


def test_spec_parsing():
    assert parse_spec("folder:/a/b,test=0.3,seed=2").test == 0.3
    with pytest.raises(UsageError, match="unknown option"):
        parse_spec("npz:/a.npz,label=x")
    with pytest.raises(UsageError, match="between 0 and 1"):
        parse_spec("folder:/a,test=1.5")
    with pytest.raises(UsageError, match="folder:, npz: or csv:"):
        parse_spec("/no/such/file.txt")


# ------------------------------------------------------------------------------ bad files

def _bad_folder_unreadable(tmp_path):
    root = write_image_folder(tmp_path / "imgs", n=30, rgb_every=0)
    bad = root / "digit-3" / "broken.png"
    bad.write_bytes(b"\x89PNG not really")
    return f"folder:{root}", str(bad)


def _bad_folder_empty_class(tmp_path):
    root = write_image_folder(tmp_path / "imgs", n=30, rgb_every=0)
    (root / "digit-z").mkdir()
    return f"folder:{root}", str(root / "digit-z")


def _bad_npz_labels(tmp_path):
    np.savez(tmp_path / "l.npz", x=np.zeros((10, 4, 4), np.uint8), y=np.linspace(0, 1, 10))
    return f"npz:{tmp_path / 'l.npz'}", "labels must be integers"


def _bad_npz_missing_class(tmp_path):
    np.savez(tmp_path / "m.npz", x_train=np.zeros((6, 4, 4), np.uint8), y_train=[0, 0, 2, 2, 2, 0],
             x_test=np.zeros((2, 4, 4), np.uint8), y_test=[0, 2])
    return f"npz:{tmp_path / 'm.npz'}", "class(es) 1"


def _bad_npz_nan(tmp_path):
    x = np.random.default_rng(0).random((10, 3))
    x[4, 1] = np.nan
    np.savez(tmp_path / "n.npz", x=x, y=np.arange(10) % 2)
    return f"npz:{tmp_path / 'n.npz'}", "NaN"


def _bad_npz_shapes(tmp_path):
    np.savez(tmp_path / "s.npz", x_train=np.zeros((6, 4, 4), np.uint8), y_train=np.arange(6) % 2,
             x_test=np.zeros((2, 5, 5), np.uint8), y_test=[0, 1])
    return f"npz:{tmp_path / 's.npz'}", "must be the same"


def _bad_npz_not_npz(tmp_path):
    (tmp_path / "x.npz").write_text("hello")
    return f"npz:{tmp_path / 'x.npz'}", "not a readable .npz"


def _bad_csv_nan(tmp_path):
    path = write_csv(tmp_path / "t.csv", n=40)
    lines = path.read_text().splitlines()
    lines[5] = "nan" + lines[5][lines[5].index(","):]
    path.write_text("\n".join(lines))
    return f"csv:{path}", "line 6, column 'p0'"


def _bad_csv_no_header(tmp_path):
    (tmp_path / "h.csv").write_text("1,2,0\n3,4,1\n")
    return f"csv:{tmp_path / 'h.csv'}", "header row"


def _bad_csv_labels(tmp_path):
    (tmp_path / "l.csv").write_text("a,label\n1,0\n2,3\n3,0\n")
    return f"csv:{tmp_path / 'l.csv'}", "class(es) 1, 2"


BAD = [_bad_folder_unreadable, _bad_folder_empty_class, _bad_npz_labels, _bad_npz_missing_class,
       _bad_npz_nan, _bad_npz_shapes, _bad_npz_not_npz, _bad_csv_nan, _bad_csv_no_header, _bad_csv_labels]


@pytest.mark.parametrize("make", BAD, ids=[f.__name__[5:] for f in BAD])
def test_bad_files_are_refused_with_the_file_named(tmp_path, make):
    spec, expected = make(tmp_path)
    with pytest.raises(DataFileError) as error:
        load_dataset(spec)
    assert error.value.exit_code == 2
    assert expected in str(error.value)
    assert str(tmp_path) in str(error.value)


# ------------------------------------------------------------------------------ layouts users have

def test_keras_layout_train_and_validation_is_a_split_and_hidden_files_are_skipped(tmp_path):
    root = write_image_folder(tmp_path / "imgs", n=60, rgb_every=0, split=True)
    (root / "test").rename(root / "validation")
    (root / "train" / "digit-1" / "._0.png").write_bytes(b"AppleDouble junk")
    (root / "train" / ".DS_Store").write_bytes(b"junk")
    ds = load_dataset(f"folder:{root}")
    assert ds.splits == {"train": 60, "test": 20} and ds.num_classes == 10
    assert "train/ and validation/" in ds.source


@pytest.mark.parametrize("make, message", [
    (lambda root: (root / "test").rename(root / "elsewhere"), "no test folders"),
    (lambda root: (root / "train").rename(root / "other"), "without train/"),
    (lambda root: (root / "train" / "digit-2" / "deeper").mkdir(), "a folder inside the class folder"),
])
def test_ambiguous_layouts_are_refused(tmp_path, make, message):
    root = write_image_folder(tmp_path / "imgs", n=40, rgb_every=0, split=True)
    make(root)
    with pytest.raises(DataFileError, match=message):
        load_dataset(f"folder:{root}")


def test_grey_images_stored_as_rgb_are_grey_and_size_option_resamples(tmp_path):
    from PIL import Image

    root = tmp_path / "photos"
    for k, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        for i in range(10):
            grey = np.full((20 + i, 30), 40 * k + i, np.uint8)             # every image another size
            Image.fromarray(np.repeat(grey[..., None], 3, axis=2)).save(root / name / f"{i}.JPG")
    ds = load_dataset(f"folder:{root},size=16x24")
    assert ds.channels == 1 and ds.image_size == (16, 24)
    with pytest.raises(UsageError, match="size= takes HxW"):
        load_dataset(f"folder:{root},size=big")


def test_a_single_class_folder_is_refused_before_decoding(tmp_path):
    (tmp_path / "one" / "cat").mkdir(parents=True)
    (tmp_path / "one" / "cat" / "x.png").write_bytes(b"not decoded")
    with pytest.raises(DataFileError, match="one class folder"):
        load_dataset(f"folder:{tmp_path / 'one'}")


def test_built_in_names_win_over_folders_of_the_same_name(tmp_path, monkeypatch):
    from insitu.data.files import is_file_spec
    from insitu.sparse.tasks import TASKS

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist").mkdir()
    (tmp_path / "fashion-shift").mkdir()
    assert not is_file_spec("mnist") and not is_file_spec("fashion-shift", TASKS)
    assert is_file_spec("fashion-shift") and is_file_spec("./mnist")


def test_tables_labels_and_npz_names_as_users_write_them(tmp_path):
    path = tmp_path / "acc.csv"
    rows = "".join(f'{i % 7},"{i * 2}",{i % 3},{["walk", "run"][i % 2]}\n' for i in range(30))
    path.write_text("\ufeffx,y,z,activity\n" + rows, encoding="utf-8")        # a BOM, quoted numbers
    ds = load_dataset(f"csv:{path}")
    assert ds.class_names == ("run", "walk") and ds.sample_shape == (3,)
    floats = tmp_path / "f.csv"
    floats.write_text("a,label\n" + "".join(f"{i},{float(i % 2)}\n" for i in range(20)))
    assert load_dataset(f"csv:{floats}").num_classes == 2                  # 1.0 is the integer 1
    np.savez(tmp_path / "n.npz", x=np.zeros((20, 4, 4), np.uint8), y=np.arange(20) % 2,
             class_names=np.asarray([b"cat", b"dog"]))
    assert load_dataset(f"npz:{tmp_path / 'n.npz'}").class_names == ("cat", "dog")
    np.savez(tmp_path / "s.npz", x=np.zeros((20, 4, 4), np.uint8), y=np.arange(20) % 2,
             class_names=np.asarray("one"))
    assert load_dataset(f"npz:{tmp_path / 's.npz'}").class_names == ("0", "1")   # 1 name for 2 classes


def test_an_empty_test_split_is_refused(tmp_path):
    np.savez(tmp_path / "e.npz", x_train=np.zeros((6, 4, 4), np.uint8), y_train=np.arange(6) % 2,
             x_test=np.zeros((0, 4, 4), np.uint8), y_test=np.zeros(0, np.int64))
    with pytest.raises(DataFileError, match="test split is empty"):
        load_dataset(f"npz:{tmp_path / 'e.npz'}")


def test_the_mcu_caches_key_a_users_task_by_its_contents(tmp_path):
    from insitu.sparse.tasks import task_key

    assert task_key("digits") == "digits"
    path = write_npz(tmp_path / "d.npz", n=100)
    first = task_key(f"npz:{path}")
    write_npz(path, n=120)
    assert task_key(f"npz:{path}") != first
