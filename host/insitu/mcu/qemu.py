"""The Cortex-M7 twin's firmware: MicroPython v1.28.0 built for QEMU's mps2-an500 as insitu's
STM32F746-like board (``firmware/qemu-f746/``: single-precision FPU, the board's heap, a FAT
filesystem at /flash kept in a file on the host).

The build is slow once (about 30 s) and cached: ``$INSITU_CACHE/mcu-twin/<key>/firmware.elf``,
where the key hashes every input (the MicroPython source archive, the board files, the compiler's
version), so a changed input rebuilds and nothing else does. The source is the archive named by
``$INSITU_MICROPYTHON_SRC`` (a release archive or an unpacked tree), else the project's vendored
copy (``shared/vendor/micropython-1.28.0-src.tar.gz`` beside the checkout), else the release
archive that ``scripts/setup.sh --mcu`` downloads into the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from insitu.errors import InsituError, UsageError
from insitu.resources import cache_dir, package_dir

MICROPYTHON_VERSION = "1.28.0"
BOARD = "INSITU_F746"
QEMU_MACHINE = "mps2-an500"
#: The filesystem image (/flash) of a new twin; the host file is sparse.
FLASH_IMAGE = "insitu-flash.img"
FLASH_IMAGE_BYTES = 2 << 20
DEBIAN_PACKAGES = ("gcc-arm-none-eabi", "libnewlib-arm-none-eabi", "qemu-system-arm")
_ARCHIVE = f"micropython-{MICROPYTHON_VERSION}-src.tar.gz"
#: The official release archive's name (scripts/setup.sh --mcu fetches it where there is no
#: vendored copy and no INSITU_MICROPYTHON_SRC).
RELEASE_ARCHIVE = f"micropython-{MICROPYTHON_VERSION}.tar.xz"


def _missing_tools() -> list[str]:
    tools = {"arm-none-eabi-gcc": "gcc-arm-none-eabi", "qemu-system-arm": "qemu-system-arm"}
    missing = [pkg for tool, pkg in tools.items() if shutil.which(tool) is None]
    if shutil.which("arm-none-eabi-gcc") and not _newlib_present():
        missing.append("libnewlib-arm-none-eabi")
    return missing


def _newlib_present() -> bool:
    out = subprocess.run(["arm-none-eabi-gcc", "-print-file-name=libc.a"], capture_output=True,
                         text=True).stdout.strip()
    return os.path.isabs(out)


def check_toolchain() -> None:
    """Raise a clear error when the Debian packages the twin needs are missing."""
    missing = _missing_tools()
    if missing:
        raise InsituError(
            "the Cortex-M7 twin needs " + ", ".join(missing) + ": apt-get install "
            + " ".join(DEBIAN_PACKAGES) + " (bash scripts/setup.sh --mcu does it), or use the "
            "MicroPython unix port with --twin unix")


def source_archive() -> Path:
    """The MicroPython v1.28.0 source: ``$INSITU_MICROPYTHON_SRC``, else the vendored archive."""
    given = os.environ.get("INSITU_MICROPYTHON_SRC")
    if given:
        path = Path(given).expanduser()
        if not path.exists():
            raise InsituError(f"INSITU_MICROPYTHON_SRC={given}: no such file or folder")
        return path
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "vendor" / _ARCHIVE
        if candidate.exists():
            return candidate
    if (_cache_root() / RELEASE_ARCHIVE).exists():           # downloaded by scripts/setup.sh
        return _cache_root() / RELEASE_ARCHIVE
    raise InsituError(
        f"the MicroPython v{MICROPYTHON_VERSION} source is missing: download the release archive "
        f"{RELEASE_ARCHIVE} from the MicroPython project and set INSITU_MICROPYTHON_SRC to its "
        f"path, or put it at {_cache_root() / RELEASE_ARCHIVE} (bash scripts/setup.sh --mcu does it)")


def _board_files() -> list[Path]:
    return sorted(p for p in (package_dir("firmware") / "qemu-f746").iterdir() if p.is_file())


def max_heap_bytes() -> int:
    """The largest heap the twin can have: the firmware's MICROPY_HEAP_SIZE, set in the board's
    makefile (board.c cuts the heap to the one asked for at power-on)."""
    text = (package_dir("firmware") / "qemu-f746" / "mpconfigboard.mk").read_text()
    match = re.search(r"^MICROPY_HEAP_SIZE\s*=\s*(\d+)\s*$", text, re.MULTILINE)
    if not match:
        raise InsituError("firmware/qemu-f746/mpconfigboard.mk sets no MICROPY_HEAP_SIZE; reinstall insitu")
    return int(match[1])


def check_heap(heap_bytes: int) -> None:
    """Refuse a heap the Cortex-M7 twin cannot have (a cheap check, before any slow work)."""
    limit = max_heap_bytes()
    if heap_bytes > limit:
        raise UsageError(f"the Cortex-M7 twin's heap is at most {limit:,} B (asked "
                         f"{heap_bytes:,} B); use --twin unix for a larger one")


def _cache_root() -> Path:
    return cache_dir("mcu-twin")


def build_key(source: Path) -> str:
    """Hash of everything the firmware is built from."""
    digest = hashlib.sha256()
    gcc = subprocess.run(["arm-none-eabi-gcc", "--version"], capture_output=True, text=True).stdout
    digest.update(gcc.splitlines()[0].encode() if gcc else b"no gcc")
    if source.is_dir():
        digest.update(str(source.resolve()).encode())
    else:
        digest.update(hashlib.sha256(source.read_bytes()).digest())
    for path in _board_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def unpack_source(source: Path, into: Path) -> Path:
    """The source tree's root (the folder holding py/mpconfig.h) under ``into``."""
    if source.is_dir():
        shutil.copytree(source, into / "src", symlinks=True)
    else:
        with tarfile.open(source) as archive:
            # The "data" filter (no links out of the tree, no devices) where this Python has it.
            if hasattr(tarfile, "data_filter"):
                archive.extractall(into / "src", filter="data")
            else:
                archive.extractall(into / "src")
    roots = [p.parent.parent for p in (into / "src").glob("**/py/mpconfig.h")]
    if not roots:
        raise InsituError(f"{source} holds no MicroPython source tree (no py/mpconfig.h)")
    return min(roots, key=lambda p: len(p.parts))


def cached_build(area: str, key: str, name: str, build: Callable[[Path], Path]) -> Path:
    """``$INSITU_CACHE/<area>/<key>/<name>``, made by ``build(work)`` (which returns the built file
    in the scratch folder ``work``) if it is not there yet: under a lock, so that a second process
    waits for the first build, and renamed into place whole."""
    folder = cache_dir(area) / key
    target = folder / name
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(prefix="build-", dir=folder) as work:
            built = build(Path(work))
            shutil.copy(built, folder / (name + ".tmp"))
            os.replace(folder / (name + ".tmp"), target)
    return target


def firmware(log=lambda text: None) -> Path:
    """The twin's ``firmware.elf``, built now if its cached copy is missing or stale."""
    check_toolchain()
    source = source_archive()
    return cached_build("mcu-twin", build_key(source), "firmware.elf", lambda work: _build_firmware(source, work, log))


def _build_firmware(source: Path, work: Path, log) -> Path:
    log(f"building the Cortex-M7 twin's MicroPython v{MICROPYTHON_VERSION} once (about 30 s), "
        f"cached in {_cache_root() / build_key(source)}")
    root = unpack_source(source, work)
    board = root / "ports" / "qemu" / "boards" / BOARD
    board.mkdir()
    for path in _board_files():
        shutil.copy(path, board / path.name)
    run = subprocess.run(
        ["make", f"-j{os.cpu_count() or 1}", "-C", str(root / "ports" / "qemu"),
         f"BOARD={BOARD}", "FROZEN_MANIFEST="],
        capture_output=True, text=True)
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
        raise InsituError(f"building the twin's MicroPython failed:\n{tail}")
    return root / "ports" / "qemu" / f"build-{BOARD}" / "firmware.elf"


def new_flash_image(path: Path) -> None:
    """An empty (sparse) filesystem image; the board formats it as FAT at its first boot."""
    with open(path, "wb") as f:
        f.truncate(FLASH_IMAGE_BYTES)


#: Where :func:`command`'s ``preload`` files go by default: the mps2-an500's 16 MiB PSRAM, which
#: the firmware does not use (its code, data, heap and stack are in the 4 MiB RAM at 0).
PSRAM_BASE = 0x6000_0000
PSRAM_BYTES = 16 << 20


#: QEMU's instruction counting: one guest instruction is one nanosecond of the virtual clock
#: (``shift=0``), which the firmware's ``time.ticks_us()`` reads through the SysTick, so the twin
#: measures a step in thousands of Cortex-M7 instructions, deterministically; ``sleep=off``: an
#: idle guest does not wait for the host's clock.
ICOUNT = "shift=0,sleep=off"
#: Instructions per microsecond of the twin's virtual clock under :data:`ICOUNT`.
INSTRUCTIONS_PER_US = 1000


def command(elf: Path, serial: str, heap_bytes: int,
            preload: tuple[tuple[Path, int], ...] = ()) -> list[str]:
    """The QEMU command line of the twin: its UART on ``serial`` (a tty path), semihosting for
    the heap size and the flash image (in QEMU's working directory), instruction counting
    (:data:`ICOUNT`). ``preload`` puts files at guest addresses at power-on (``-device loader``):
    bulk test data without the UART's ~8 KB/s."""
    check_heap(heap_bytes)
    return [shutil.which("qemu-system-arm") or "qemu-system-arm", "-machine", QEMU_MACHINE,
            "-nographic", "-monitor", "null", "-icount", ICOUNT,
            "-semihosting-config", f"enable=on,target=native,arg=insitu-f746,arg=heap={heap_bytes}",
            "-serial", serial, "-kernel", str(elf),
            *(arg for path, addr in preload
              for arg in ("-device", f"loader,file={Path(path).resolve()},addr={addr:#x},force-raw=on"))]
