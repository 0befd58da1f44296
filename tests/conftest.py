"""Shared test helpers: the installed `insitu` console script and its environment."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def insitu_cli(*args, check=False, timeout=300, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run the real `insitu` console script of this interpreter's environment."""
    exe = VENV_BIN / "insitu"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: install insitu into this environment (bash scripts/setup.sh)")
    full_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=check, env=full_env, cwd=kwargs.pop("cwd", ROOT), **kwargs)


@pytest.fixture
def run_cli():
    return insitu_cli


_SUITES = ("unit", "rtl", "firmware", "system")


def pytest_collection_modifyitems(config, items):
    """Every test carries the marker of its folder (tests/unit -> unit ...), so `-m unit` is the
    whole fast inner loop even where a module forgot its `pytestmark`."""
    for item in items:
        suite = Path(str(item.fspath)).parent.name
        if suite in _SUITES and not item.get_closest_marker(suite):
            item.add_marker(getattr(pytest.mark, suite))
