"""Writing files so that a crash never leaves a half-written one.

Every run file, checkpoint and report insitu writes goes through :func:`atomic_write`: the data is
written to a temporary file in the same folder, flushed to disk, then renamed over the target
(``os.replace`` is atomic on POSIX), so readers see the old file or the new one, never a mix.

``tomllib`` is imported from here: Python 3.10 has it as the ``tomli`` package.
"""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
from contextlib import contextmanager
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
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
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


def _temp_prefix(path: Path) -> str:
    """A temporary file's name prefix beside ``path``: short enough that the temporary name is
    valid wherever ``path``'s own name is (names are limited to 255 bytes)."""
    return f".{path.name[:100]}."


#: The formats every ``--plot`` takes, named by the file's suffix (matplotlib writes them all
#: without extra libraries).
PLOT_FORMATS = ("png", "pdf", "svg")


def plot_format(path: str | Path, what: str = "--plot") -> str:
    """The figure format of ``path``, from its suffix; a :class:`UsageError` (exit 2) when the
    suffix is missing or not one of :data:`PLOT_FORMATS`."""
    from insitu.errors import UsageError

    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        shown = f".{suffix}" if suffix else "no suffix"
        raise UsageError(f"{what} {path}: a figure is written as "
                         f"{', '.join('.' + f for f in PLOT_FORMATS)}, named by the file's suffix "
                         f"({shown} here); choose e.g. {Path(path).with_suffix('.png').name}")
    return suffix


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure atomically in the format of ``path``'s suffix (:func:`plot_format`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=plot_format(path), dpi=dpi)
    return atomic_write(path, buf.getvalue())


def os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system (255 bytes at most per name)"
    return exc.strerror or str(exc)


def check_writable(path: str | Path, what: str, plot: bool = False) -> Path:
    """Fail early, before hours of work, if ``path`` cannot be written: a :class:`UsageError`
    (exit 2) naming ``what`` (the option). Its name is checked against the file system's limit,
    and a file is created and removed beside it, since permissions alone do not tell (root may
    "write" into /proc); ``path`` itself is never created here: another process may be looking
    for it (a checkpoint it resumes from). ``plot``: the path is a figure's, whose suffix names
    its format (:func:`plot_format`)."""
    from insitu.errors import UsageError

    path = Path(path)
    if plot:
        plot_format(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder of {what} {path}: {os_reason(exc)}") from None
    try:
        if len(os.fsencode(path.name)) > _name_max(path.parent):
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        if path.is_dir():
            raise UsageError(f"cannot write {what} {path}: it is a folder; choose a file path")
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=_temp_prefix(path), suffix=".probe"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {os_reason(exc)}; choose a writable file "
                         "path") from None
    return path


def _name_max(folder: Path) -> int:
    """The longest file name ``folder``'s file system takes, in bytes (255 where it won't say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


@contextmanager
def exclusive(path: str | Path):
    """Hold an exclusive lock on ``path`` (a lock file, created if missing) while the block runs:
    processes that share a result (sweep points training one baseline row) take turns, and the
    later ones find the result the first one wrote. The lock ends with the process, whatever
    happens to it."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
