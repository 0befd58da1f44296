"""The IDX reader and writer: round trips, and every way a file can be broken."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from insitu.data import read_idx, write_idx
from insitu.errors import DatasetError

pytestmark = pytest.mark.unit

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]
SHAPES = [(7,), (3, 5), (4, 2, 3), (2, 3, 2, 2)]


def _sample(dtype, shape):
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def _idx_bytes(type_code: int, shape, payload: bytes) -> bytes:
    return bytes([0, 0, type_code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + payload


def _raises_naming(path, match=None):
    """Assert a DatasetError whose message names ``path`` (and matches ``match``)."""
    with pytest.raises(DatasetError) as info:
        read_idx(path)
    assert str(path) in str(info.value)
    if match:
        assert match in str(info.value)
    return info.value


# --- round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_round_trip(tmp_path, dtype, shape, compress):
    array = _sample(dtype, shape)
    path = write_idx(tmp_path / "a.idx", array, gzip=compress)
    back = read_idx(path)
    assert back.shape == array.shape
    assert back.dtype == np.dtype(dtype)  # native byte order, whatever the file holds
    assert back.dtype.isnative
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable and back.flags.c_contiguous


def test_file_layout_is_big_endian_idx(tmp_path):
    path = write_idx(tmp_path / "a.idx", np.array([[1, 258]], dtype=np.int16))
    assert path.read_bytes() == bytes([0, 0, 0x0B, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 1, 1, 2])


def test_gzip_is_detected_by_content_not_suffix(tmp_path):
    array = _sample(np.uint8, (4, 3))
    gz_without_suffix = write_idx(tmp_path / "images-idx2-ubyte", array, gzip=True)
    assert gz_without_suffix.read_bytes()[:2] == b"\x1f\x8b"
    np.testing.assert_array_equal(read_idx(gz_without_suffix), array)
    raw_with_suffix = write_idx(tmp_path / "images-idx2-ubyte.gz", array, gzip=False)
    np.testing.assert_array_equal(read_idx(raw_with_suffix), array)


def test_gzip_output_is_reproducible(tmp_path):
    array = _sample(np.int32, (10,))
    a = write_idx(tmp_path / "a.gz", array, gzip=True).read_bytes()
    b = write_idx(tmp_path / "b.gz", array, gzip=True).read_bytes()
    assert a == b


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "a.idx"
    write_idx(path, np.zeros(3, np.uint8))
    write_idx(path, np.ones(5, np.uint8))  # replaces the old file
    np.testing.assert_array_equal(read_idx(path), np.ones(5, np.uint8))
    assert [p.name for p in tmp_path.iterdir()] == ["a.idx"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = write_idx(tmp_path / "a.idx", np.arange(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="cannot hold dtype int64"):
        write_idx(path, np.arange(3, dtype=np.int64))
    np.testing.assert_array_equal(read_idx(path), np.arange(3, dtype=np.uint8))
    assert [p.name for p in tmp_path.iterdir()] == ["a.idx"]


@pytest.mark.parametrize("array", [np.zeros((1,) * 5, np.uint8), np.uint8(3), np.zeros(2, bool),
                                   np.zeros(2, np.float16)], ids=["5d", "0d", "bool", "float16"])
def test_write_rejects_what_idx_cannot_hold(tmp_path, array):
    with pytest.raises(ValueError):
        write_idx(tmp_path / "a.idx", array)


# --- broken files: every one is a DatasetError naming the file ----------------------------------

def test_missing_file(tmp_path):
    _raises_naming(tmp_path / "nope-idx1-ubyte.gz", "no such file")


def test_directory_instead_of_file(tmp_path):
    _raises_naming(tmp_path, "directory")


@pytest.mark.parametrize("content", [b"", b"\x00\x00"], ids=["empty", "2-bytes"])
def test_too_short_for_a_header(tmp_path, content):
    path = tmp_path / "short"
    path.write_bytes(content)
    _raises_naming(path, "not an IDX file")


def test_bad_magic(tmp_path):
    path = tmp_path / "bad-magic"
    path.write_bytes(b"\x01\x02" + _idx_bytes(0x08, (3,), b"abc")[2:])
    _raises_naming(path, "not an IDX file")


def test_text_file_is_not_idx(tmp_path):
    path = tmp_path / "readme.gz"
    path.write_text("this is not a dataset\n")
    _raises_naming(path, "not an IDX file")


def test_unknown_type_code(tmp_path):
    path = tmp_path / "type-0a"
    path.write_bytes(_idx_bytes(0x0A, (3,), b"abc"))
    _raises_naming(path, "unknown IDX type code 0x0A")


@pytest.mark.parametrize("ndim", [0, 5])
def test_unsupported_number_of_dimensions(tmp_path, ndim):
    path = tmp_path / f"ndim-{ndim}"
    path.write_bytes(_idx_bytes(0x08, (1,) * ndim, b"x"))
    _raises_naming(path, "dimensions")


def test_truncated_header(tmp_path):
    path = tmp_path / "header"
    path.write_bytes(bytes([0, 0, 0x08, 3]) + struct.pack(">I", 10))  # 1 of 3 dims
    _raises_naming(path, "truncated")


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gz"])
def test_truncated_payload(tmp_path, compress):
    data = _idx_bytes(0x08, (10, 28, 28), bytes(10 * 28 * 28 - 1))
    path = tmp_path / "images-idx3-ubyte"
    path.write_bytes(gzip.compress(data) if compress else data)
    _raises_naming(path, "truncated")


def test_truncated_multibyte_payload(tmp_path):
    path = tmp_path / "floats"
    path.write_bytes(_idx_bytes(0x0D, (4,), bytes(15)))  # 4 float32 need 16 bytes
    _raises_naming(path, "truncated")


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gz"])
def test_trailing_bytes(tmp_path, compress):
    data = _idx_bytes(0x08, (3,), b"abc") + b"\x00"
    path = tmp_path / "labels-idx1-ubyte"
    path.write_bytes(gzip.compress(data) if compress else data)
    _raises_naming(path, "unexpected bytes")


def test_corrupt_gzip_stream(tmp_path):
    good = gzip.compress(_idx_bytes(0x08, (1000,), bytes(range(256)) * 3 + bytes(232)))
    corrupt = bytearray(good)
    for i in range(20, 40):  # garble the deflate data, keep the gzip header
        corrupt[i] ^= 0xFF
    path = tmp_path / "corrupt.gz"
    path.write_bytes(bytes(corrupt))
    _raises_naming(path, "gzip")


def test_gzip_with_bad_crc(tmp_path):
    data = bytearray(gzip.compress(_idx_bytes(0x08, (3,), b"abc")))
    data[-8] ^= 0xFF  # the CRC32 of the trailer
    path = tmp_path / "crc.gz"
    path.write_bytes(bytes(data))
    _raises_naming(path, "gzip")


def test_truncated_gzip_stream(tmp_path):
    data = gzip.compress(_idx_bytes(0x08, (1000,), bytes(1000)))
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) // 2])
    _raises_naming(path, "truncated gzip")


def test_gzip_with_trailing_garbage(tmp_path):
    path = tmp_path / "garbage.gz"
    path.write_bytes(gzip.compress(_idx_bytes(0x08, (3,), b"abc")) + b"junk")
    _raises_naming(path, "gzip")
