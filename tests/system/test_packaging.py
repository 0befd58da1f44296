"""A plain (non-editable) wheel install gives working `insitu` and `insitu.rtl` with the data files."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build the wheel and install it, without its dependencies, into a fresh venv whose
    dependencies are borrowed from the test environment (a .pth file; the test environment's own
    editable insitu is not on that path, so only the wheel's copy can be imported)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a clean copy: an in-tree build would leave build/ behind, and setuptools packs a
    # stale build/lib into later wheels.
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp / "dist"), str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp / "dist").glob("insitu-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # pip --python installs on behalf of the fresh interpreter (its console-script shebang too).
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                              "-q", str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    # Only now borrow the dependencies: had pip seen the test environment's editable insitu on the
    # path, it would have uninstalled it to make room for the wheel.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_wheel_imports_and_carries_data(installed):
    py = installed / "bin" / "python"
    probe = subprocess.run([str(py), "-c", """
import json, insitu, insitu.rtl, insitu.numerics
from insitu.resources import package_dir
print(json.dumps({"insitu": insitu.__file__, "rtl": insitu.rtl.__file__,
                  "boards": sorted(p.name for p in package_dir("boards").glob("*.toml")),
                  "firmware": sorted(p.name for p in package_dir("firmware").iterdir()),
                  "twin_board": sorted(p.name for p in (package_dir("firmware") / "qemu-f746").iterdir()),
                  "boards_dir": str(package_dir("boards"))}))
"""], capture_output=True, text=True, cwd=installed)
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout)
    for key in ("insitu", "rtl", "boards_dir"):
        assert got[key].startswith(str(installed)), f"{key} came from {got[key]}, not the wheel"
    assert "ultra96v2.toml" in got["boards"] and "stm32f746-disco-sim.toml" in got["boards"]
    assert got["firmware"], "no firmware files in the wheel"
    # The Cortex-M7 twin's board definition: an installed insitu builds the twin from it.
    assert got["twin_board"] == ["board.c", "board.h", "mpconfigboard.mk"]


def test_installed_console_script_lists_boards(installed):
    env = {**os.environ, "PATH": f"{installed / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run([str(installed / "bin" / "insitu"), "boards", "--json"], capture_output=True,
                         text=True, cwd=installed, env=env)
    assert run.returncode == 0, run.stderr
    names = {b["name"] for b in json.loads(run.stdout)}
    assert {"ultra96v2", "zedboard", "stm32f746-disco", "ultra96v2-sim", "zedboard-sim",
            "stm32f746-disco-sim"} <= names
