"""The IDX file format of MNIST and FashionMNIST: a strict reader and an atomic writer.

Layout (all big-endian)::

    bytes 0-1   zero
    byte  2     type code: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64
    byte  3     number of dimensions (this reader accepts 1..4)
    4 * ndim    the size of each dimension, uint32
    ...         the values, row-major

Files may be gzip-compressed; compression is detected from the content (magic bytes 1f 8b), not
from the suffix, because downloads are often renamed or unpacked by browsers. The reader loads a
file completely or raises :class:`~insitu.errors.DatasetError`: a short, long or garbled file is
never returned as a partial array.
"""

from __future__ import annotations

import gzip as _gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from insitu.errors import DatasetError
from insitu.io import atomic_write

__all__ = ["read_idx", "write_idx", "IDX_TYPES"]

#: IDX type code -> big-endian NumPy dtype as stored in the file.
IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_MAX_NDIM = 4
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) into a writable, native-endian array.

    Raises :class:`DatasetError`, naming the file, when it is missing, unreadable, not IDX, or
    when its declared dimensions do not match the amount of data it holds.
    """
    path = Path(path)
    data = _read_bytes(path)
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(path, data)

    if len(data) < 4:
        raise DatasetError(f"{path}: not an IDX file (only {len(data)} bytes); "
                           "the file is truncated, download it again")
    zero0, zero1, type_code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise DatasetError(f"{path}: not an IDX file (magic bytes {data[:4].hex(' ')}, "
                           "expected 00 00 <type> <ndim>)")
    if type_code not in IDX_TYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_TYPES)
        raise DatasetError(f"{path}: unknown IDX type code 0x{type_code:02X} (known: {known})")
    if not 1 <= ndim <= _MAX_NDIM:
        raise DatasetError(f"{path}: IDX file declares {ndim} dimensions; "
                           f"supported are 1..{_MAX_NDIM}")

    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DatasetError(f"{path}: truncated IDX header ({len(data)} bytes, expected "
                           f"{header_len}); download the file again")
    shape = struct.unpack(f">{ndim}I", data[4:header_len])
    dtype = IDX_TYPES[type_code]
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize  # object: no int64 overflow
    actual = len(data) - header_len
    if actual < expected:
        raise DatasetError(f"{path}: truncated: shape {shape} needs {expected} bytes of data, "
                           f"the file holds {actual}; download it again")
    if actual > expected:
        raise DatasetError(f"{path}: {actual - expected} unexpected bytes after the data of "
                           f"shape {shape}; the file is corrupt or not what its header says")

    array = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header_len)
    # frombuffer over bytes is read-only and (for >1-byte types) big-endian: hand back a normal
    # array the caller owns.
    return array.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def write_idx(path: str | os.PathLike, array, gzip: bool = False) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed if ``gzip``); returns the path.

    The dtype must be one IDX can hold (uint8, int8, int16, int32, float32, float64) and the array
    must have 1..4 dimensions. The file is written to a temporary file next to it and moved into
    place, so readers never see a half-written file.
    """
    path = Path(path)
    array = np.asarray(array)
    type_code = _type_code_for(array.dtype)
    if not 1 <= array.ndim <= _MAX_NDIM:
        raise ValueError(f"IDX holds arrays of 1..{_MAX_NDIM} dimensions, got {array.ndim}")
    if any(n >= 2**32 for n in array.shape):
        raise ValueError(f"IDX dimensions must be < 2**32, got shape {array.shape}")

    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=IDX_TYPES[type_code]).tobytes()
    if gzip:
        payload = _gzip.compress(payload, mtime=0)  # mtime=0: same array, same bytes

    return atomic_write(path, payload)


def _type_code_for(dtype: np.dtype) -> int:
    for code, idx_dtype in IDX_TYPES.items():
        # Compare kind and size only: the byte order is converted on write.
        if dtype.kind == idx_dtype.kind and dtype.itemsize == idx_dtype.itemsize:
            return code
    names = "uint8, int8, int16, int32, float32, float64"
    raise ValueError(f"IDX cannot hold dtype {dtype}; convert first (supported: {names}), "
                     "e.g. labels.astype(np.uint8)")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a directory, expected an IDX file") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _gunzip(path: Path, data: bytes) -> bytes:
    try:
        return _gzip.decompress(data)
    except EOFError:
        raise DatasetError(f"{path}: truncated gzip stream; download the file again") from None
    except (OSError, zlib.error) as exc:  # BadGzipFile is an OSError; CRC errors included
        raise DatasetError(f"{path}: corrupt gzip stream ({exc}); download the file again") from None
