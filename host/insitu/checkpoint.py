"""Checkpoints: named arrays plus JSON metadata in one ``.npz``, written atomically.

A training loop saves every so often; after a crash, a reset or a dropped link it loads the last
checkpoint and goes on from the sample count stored in it, so no sample is counted twice.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from insitu.errors import InsituError
from insitu.io import atomic_write, to_jsonable

_META_KEY = "__meta__"


def save_checkpoint(path: str | Path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """Write ``arrays`` and ``meta`` to ``path`` (old checkpoint or new one, never a torn file)."""
    if _META_KEY in arrays:
        raise ValueError(f"array name {_META_KEY!r} is reserved")
    buffer = io.BytesIO()
    meta_blob = np.frombuffer(json.dumps(meta, default=to_jsonable).encode(), dtype=np.uint8)
    np.savez(buffer, **arrays, **{_META_KEY: meta_blob})
    try:
        return atomic_write(path, buffer.getvalue())
    except OSError as exc:
        raise InsituError(f"cannot write checkpoint {path}: {exc.strerror}; the previous checkpoint, "
                          "if any, is intact") from None


def load_checkpoint(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`: ``(arrays, meta)``."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise InsituError(f"checkpoint {path} does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InsituError(f"checkpoint {path} is corrupt ({exc}); delete it to start over") from None
    if _META_KEY not in arrays:
        raise InsituError(f"{path} is not an insitu checkpoint (no metadata); delete it to start over")
    try:
        meta = json.loads(arrays.pop(_META_KEY).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InsituError(f"checkpoint {path} has corrupt metadata ({exc}); delete it to start over") from None
    return arrays, meta
