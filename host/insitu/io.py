"""Writing files so that a crash never leaves a half-written one.

Every run file, checkpoint and report insitu writes goes through :func:`atomic_write`: the data is
written to a temporary file in the same folder, flushed to disk, then renamed over the target
(``os.replace`` is atomic on POSIX), so readers see the old file or the new one, never a mix.

``tomllib`` is imported from here: Python 3.10 has it as the ``tomli`` package.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

try:
    import tomllib  # novermin (3.11+; tomli is the same parser for 3.10)
except ModuleNotFoundError:        # Python 3.10, the PYNQ 3.x board images
    import tomli as tomllib  # pyright: ignore[reportMissingImports]


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_writable(path: str | Path, what: str) -> Path:
    """Fail early, before hours of work, if ``path`` cannot be written: a :class:`UsageError`
    (exit 2) naming ``what`` (the option). A file is created and removed beside it to make sure,
    since permissions alone do not tell (root may "write" into /proc)."""
    from insitu.errors import UsageError

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder of {what} {path}: {exc.strerror}") from None
    if path.is_dir():
        raise UsageError(f"cannot write {what} {path}: it is a folder; choose a file path")
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror}; choose a writable file path") from None
    return path


def atomic_write_json(path: str | Path, payload) -> Path:
    """Write a JSON document atomically (NumPy scalars and arrays are converted)."""
    return atomic_write(path, json.dumps(payload, indent=2, default=to_jsonable) + "\n")


def to_jsonable(value):
    """``json.dumps`` default hook for NumPy values."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
