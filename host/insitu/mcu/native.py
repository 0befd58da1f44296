"""The training kernels in C (``firmware/native/``) built for where they run:

- :func:`native_mpy`: ``tte_native.mpy``, a MicroPython *native module* (Thumb-2 machine code for
  ``armv7emsp``: the STM32F746 and its Cortex-M7 twin), built with MicroPython's own
  ``py/dynruntime.mk`` and ``tools/mpy_ld.py`` from the source the twin is built from. A board
  running stock MicroPython v1.28 imports it from its filesystem like any module: no firmware
  build. ``insitu flash`` deploys it where the device's .mpy arch is ``armv7emsp``.
- :func:`host_library`: the same kernels as a shared library for this machine, which the tests
  run against the golden model through ctypes (quick to check, slow to trust alone: the board's
  build is checked on the Cortex-M7 twin too).

Both are built once per input (the C sources, the compiler, the MicroPython source) and cached in
``$INSITU_CACHE/mcu-native/<key>/``, under a lock.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from insitu.errors import InsituError
from insitu.mcu import qemu
from insitu.resources import package_dir

MODULE = "tte_native"
#: The .mpy architecture the C kernels are built for (the STM32F746's Cortex-M7, single float).
ARCH = "armv7emsp"
#: Host compiler flags of the test library: what makes C's int arithmetic the device's.
HOST_CFLAGS = ("-O2", "-fwrapv", "-std=c99", "-Wall", "-Werror", "-shared", "-fPIC")


def sources() -> list[Path]:
    """The C kernels' files (and their Makefile)."""
    return sorted(p for p in (package_dir("firmware") / "native").iterdir()
                  if p.suffix in (".c", ".h") or p.name == "Makefile")


def _key(*extra: bytes) -> str:
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for item in extra:
        digest.update(item)
    return digest.hexdigest()[:16]


def _tool_version(tool: str) -> bytes:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].encode() if out else b"none"


def native_mpy(log=lambda text: None) -> Path:
    """``tte_native.mpy`` for the Cortex-M7 (armv7emsp), built now if not cached."""
    qemu.check_toolchain()
    source = qemu.source_archive()
    key = _key(_tool_version("arm-none-eabi-gcc"), str(source.resolve()).encode(),
               source.read_bytes() if source.is_file() else b"")
    return qemu.cached_build("mcu-native", key, f"{MODULE}.mpy", lambda work: _build_mpy(source, work, log))


def _build_mpy(source: Path, work: Path, log) -> Path:
    try:
        import ar  # noqa: F401  (mpy_ld reads libgcc/libc archives with it)
        import elftools  # noqa: F401
    except ImportError:
        raise InsituError("building the C kernels needs pyelftools and ar: pip install 'insitu[mcu]' "
                          "(bash scripts/setup.sh)") from None
    log(f"building the C kernels ({MODULE}.mpy for {ARCH}) once, about 10 s")
    root = qemu.unpack_source(source, work)
    build = work / "native"
    shutil.copytree(package_dir("firmware") / "native", build)
    run = subprocess.run(["make", "-C", str(build), f"MPY_DIR={root}", f"ARCH={ARCH}", f"PYTHON={sys.executable}"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
        raise InsituError(f"building the C kernels failed:\n{tail}")
    return build / f"{MODULE}.mpy"


def host_library() -> Path:
    """The C kernels as a shared library for this machine (the tests' ctypes route)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise InsituError("no C compiler: apt-get install gcc")
    return qemu.cached_build("mcu-native", _key(_tool_version(cc), " ".join(HOST_CFLAGS).encode()),
                             "libtte_native.so", lambda work: _build_host(cc, work))


def _build_host(cc: str, work: Path) -> Path:
    folder = package_dir("firmware") / "native"
    out = work / "libtte_native.so"
    run = subprocess.run([cc, *HOST_CFLAGS, "-I", str(folder), "-o", str(out),
                          *(str(p) for p in sorted(folder.glob("ops_*.c")))], capture_output=True, text=True)
    if run.returncode != 0:
        raise InsituError(f"compiling the C kernels for the host failed:\n{run.stderr.strip()[-3000:]}")
    return out
