"""The board-image twin: Python environments shaped like a PYNQ v3.0.1 image's.

`scripts/setup.sh --board-image` installs the image's Python 3.10 packages (numpy 1.21.5, scipy
1.8.0, pynq 3.0.1, pynqmetadata 0.1.2, ...; scripts/board-image-requirements.txt) once into a
cached folder. On the image, pynq's venv sees jammy's packages through --system-site-packages;
here a fresh venv made ``--without-pip`` sees that folder through a ``.pth`` file, so what a test
installs into it (a bundle's wheels) stays in the venv and the cached image is never changed. pip
is the image's own (22.0.2) and, as on the image, never removes what lies outside the venv.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from insitu.resources import cache_dir


def image_dir() -> Path | None:
    """The built board image (``$INSITU_BOARD_IMAGE``, else the cache's current one), or None."""
    given = os.environ.get("INSITU_BOARD_IMAGE")
    image = Path(given) if given else cache_dir("board-image", "current")
    return image.resolve() if (image / "complete").is_file() else None


def require_image() -> Path:
    """The image, or a skip (a failure under CI, whose test.sh builds it) naming the setup."""
    image = image_dir()
    if image is None:
        why = "no board-image twin: build it with `bash scripts/setup.sh --board-image`"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return image


def image_venv(folder: Path) -> Path:
    """A fresh venv in ``folder`` that sees the image's packages; returns its bin folder."""
    image = require_image()
    subprocess.run([str(image / "python"), "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next((folder / "lib").glob("python3.*/site-packages"))
    (site / "_board_image.pth").write_text(f"{image / 'site'}\n")
    return folder / "bin"


def image_env(bin_dir: Path) -> dict:
    """The environment of a root shell on the board: the venv's python3 first on PATH, and
    nothing of the host's virtual environment or Python settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("PIP_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
    return env
