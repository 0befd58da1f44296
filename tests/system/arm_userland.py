"""Run insitu's PS-side Python in the boards' ARM userlands under qemu-user (no board needed).

``scripts/arm-userland.sh ARCH`` builds a Debian bookworm root once into insitu's cache: armhf is
the ZedBoard's 32-bit Cortex-A9, where NumPy's default integer is int32; arm64 the Ultra96-V2's
Cortex-A53. Here:

* :func:`userland` finds the cached root, or builds it (root only), or says why it cannot;
* :func:`insitu_site` puts the working tree's insitu (its wheel, unzipped) in a folder for the
  guest's PYTHONPATH: the cached root holds only the third-party packages, so it never goes stale;
* :func:`run_python` runs ``python3`` of the root on its emulated CPU, with a timeout.

Usable from a shell too: ``python tests/system/arm_userland.py armhf -m insitu boards``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "arm-userland.sh"


@dataclass(frozen=True)
class Arch:
    name: str           # Debian's architecture
    qemu: str           # the qemu-user binary
    cpu: str            # the board's core, as qemu names it (NumPy dispatches its SIMD on it)
    machine: str        # what platform.machine() says in the guest
    board: str          # the twin whose PS this userland stands for


ARCHES = {
    "armhf": Arch("armhf", "qemu-arm-static", "cortex-a9", "armv7l", "zedboard-sim"),
    "arm64": Arch("arm64", "qemu-aarch64-static", "cortex-a53", "aarch64", "ultra96v2-sim"),
}


class Unavailable(RuntimeError):
    """The userland cannot be had here (the reason is the message)."""


def cache_root() -> Path:
    """Where the script caches its roots (insitu's cache, as the script computes it too)."""
    from insitu.resources import cache_dir

    return cache_dir("arm-userland")


def userland(arch: str, *, build: bool = True, timeout: float = 1800) -> Path:
    """The root of ``arch``'s userland: the script says whether its cached copy is current (a
    no-op then) and builds it otherwise, which needs root, apt and the network (1-2 minutes per
    architecture). Raises :class:`Unavailable` with the reason when there is none."""
    spec = ARCHES[arch]
    if not build:
        root = cache_root() / arch
        if not (root / ".insitu-userland").is_file():
            raise Unavailable(f"no {arch} userland is cached at {root} (scripts/arm-userland.sh {arch})")
        return root
    if shutil.which("bash") is None:
        raise Unavailable("no bash to run scripts/arm-userland.sh")
    cached = (cache_root() / arch / ".insitu-userland").is_file()
    if not cached and os.geteuid() != 0:
        raise Unavailable(f"no {arch} userland is cached at {cache_root() / arch} and building one "
                          "needs root (debootstrap)")
    if not cached and shutil.which("apt-get") is None and shutil.which("debootstrap") is None:
        raise Unavailable(f"no {arch} userland is cached and this is not a Debian machine")
    try:
        run = subprocess.run(["bash", str(SCRIPT), arch], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"scripts/arm-userland.sh {arch} ran past {timeout:.0f} s") from None
    if run.returncode != 0:
        raise Unavailable(f"scripts/arm-userland.sh {arch} failed:\n{run.stderr[-3000:]}")
    root = Path(run.stdout.strip().splitlines()[-1])
    if shutil.which(spec.qemu) is None:
        raise Unavailable(f"{spec.qemu} is missing (apt-get install qemu-user-static)")
    return root


def insitu_site(dest: Path) -> Path:
    """The working tree's insitu as a wheel unzipped into ``dest`` (a folder for PYTHONPATH).

    The wheel, not ``host/``: it maps ``rtl/``, ``boards/`` and ``firmware/`` into the package as
    an installed insitu has them. Built as ``insitu deploy`` builds it (offline, from a clean copy
    of the tree)."""
    from insitu.fpga.deploy import build_wheel

    dest = Path(dest)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(build_wheel(ROOT, Path(tmp))) as z:
            z.extractall(dest)
    return dest


def guest_command(arch: str, root: Path, args) -> list[str]:
    spec = ARCHES[arch]
    return [spec.qemu, "-L", str(root), "-cpu", spec.cpu, str(root / "usr/bin/python3"), *map(str, args)]


def run_python(arch: str, root: Path, args, *, pythonpath=(), env=None, timeout: float | None = 600,
               cwd=None, capture: bool = True) -> subprocess.CompletedProcess:
    """``python3 ARGS`` of the root on the emulated board CPU; ``pythonpath`` goes first on its
    path. The host's Python settings are not passed on (PYTHONPATH, PYTHONHOME, user site), and
    nothing writes bytecode (the cache stays as built: the root holds the bytecode of what its
    build's check imported, the board path's packages; the rest compiles in memory, a few s)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    clean.update(PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
    if pythonpath:
        clean["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    clean.update(env or {})
    return subprocess.run(guest_command(arch, root, args), capture_output=capture, text=True,
                          timeout=timeout, env=clean, cwd=cwd or ROOT)


def main(argv=None) -> int:
    """``arm_userland.py ARCH ARGS..``: python3 ARGS in the userland, with the tree's insitu."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ARCHES:
        print(f"usage: {Path(__file__).name} {{{'|'.join(ARCHES)}}} [python args...]", file=sys.stderr)
        return 2
    arch, args = argv[0], argv[1:]
    root = userland(arch)
    with tempfile.TemporaryDirectory() as tmp:
        site = insitu_site(Path(tmp) / "site")
        return run_python(arch, root, args, pythonpath=[site], timeout=None, cwd=os.getcwd(),
                          capture=False).returncode


if __name__ == "__main__":
    sys.exit(main())
