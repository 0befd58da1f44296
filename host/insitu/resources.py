"""Where insitu's files live: the data that ships with it (board files, MicroPython firmware
sources) and its cache (pre-trained models, built twins, overlays).

In an installed wheel they are package data under ``insitu/boards`` and ``insitu/firmware``; in a
source checkout (editable install, or tests) they are the top-level ``boards/`` and ``firmware/``
folders of the checkout (``host/insitu`` is the package).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def package_dir(name: str) -> Path:
    """The folder of shipped data called ``name`` (``"boards"`` or ``"firmware"``)."""
    installed = Path(str(resources.files("insitu"))) / name
    if installed.is_dir():
        return installed
    source_tree = Path(__file__).resolve().parents[2] / name    # host/insitu/ -> the checkout
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError(f"insitu's {name}/ folder is missing (looked in {installed} and "
                            f"{source_tree}); reinstall insitu")


def cache_dir(*parts: str) -> Path:
    """A folder of insitu's cache: ``$INSITU_CACHE``, else ``$XDG_CACHE_HOME/insitu``, else
    ``~/.cache/insitu``, then ``parts`` (not created here)."""
    if os.environ.get("INSITU_CACHE"):
        root = Path(os.environ["INSITU_CACHE"])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "insitu"
    return root.joinpath(*parts)
