"""A real bundle's real run.sh on the board-image twin (Python 3.10, jammy's packages, pynq 3.0.1
and pynqmetadata 0.1.2), against the twin boards, with nothing stubbed; its result is the host's.

What runs on the board is what runs here: `insitu deploy --board <board>-sim` makes the same
bundle as for the board, with the twin overlay in place of a Vivado one, and run.sh installs it
offline into the image's Python and trains.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from board_image import image_env, image_venv, require_image
from conftest import insitu_cli

pytestmark = pytest.mark.system

#: Two batch-64 steps of the TT paper network and a short test pass (seconds on the fast twin;
#: the test passes, the curve's probe and the final one, were most of it at 200 samples).
TRAIN_ARGS = ("--algo", "tt", "--samples", "128", "--test-samples", "50")
#: Exact counts of the accelerator and the run; the loss may differ in its last bit (NumPy 1.21's
#: and 1.26's log and exp kernels are not the same on every CPU).
SAME = ("samples", "accuracy", "test_samples", "pl_cycles", "dma_bytes", "ops", "cycles_by_op",
        "macs_16x4", "macs_16x16", "ranks", "parameters", "memory_bits", "energy_j")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """insitu's wheel, built once, as deploy builds it from the source tree."""
    from insitu.fpga.deploy import build_wheel, project_root

    root = project_root()
    assert root is not None, "the tests run from the source tree"
    return build_wheel(root, tmp_path_factory.mktemp("wheel"))


def _bundle(tmp: Path, board: str, wheel: Path, *train_args: str) -> Path:
    out = tmp / f"bundle-{board}"
    run = insitu_cli("deploy", "--board", board, "--out-dir", out, "--wheel", wheel, "--", *train_args,
                     cwd=tmp)
    assert run.returncode == 0, run.stderr
    return out


def test_the_image_is_the_boards():
    """The premise: the twin has the image's Python and versions, and none of the host's extras."""
    image = require_image()
    probe = subprocess.run([str(image / "python"), "-c", """
import importlib.metadata as md, json, sys
sys.path.insert(0, sys.argv[1])
names = ["numpy", "scipy", "matplotlib", "click", "pynq", "pynqmetadata", "pip",
         "numba", "scikit-learn", "amaranth", "rich", "tomli"]
have = {}
for name in names:
    try:
        have[name] = md.version(name)
    except md.PackageNotFoundError:
        have[name] = None
print(json.dumps({"python": list(sys.version_info[:2]), **have}))
""", str(image / "site")], capture_output=True, text=True, check=True)
    got = json.loads(probe.stdout)
    assert got == {"python": [3, 10], "numpy": "1.21.5", "scipy": "1.8.0", "matplotlib": "3.5.1",
                   "click": "8.0.3", "pynq": "3.0.1", "pynqmetadata": "0.1.2", "pip": "22.0.2",
                   "numba": None, "scikit-learn": None, "amaranth": None, "rich": None, "tomli": None}


@pytest.mark.parametrize("board", ["ultra96v2-sim", "zedboard-sim"])
def test_a_bundle_trains_on_the_board_image_as_on_the_host(tmp_path, wheel, board):
    bundle = _bundle(tmp_path, board, wheel, *TRAIN_ARGS)
    venv_bin = image_venv(tmp_path / "image-venv")
    if os.geteuid() != 0:
        pytest.skip("run.sh runs as root, as on the board; this test needs root")
    run = subprocess.run(["bash", str(bundle / "run.sh")], capture_output=True, text=True,
                         env=image_env(venv_bin), cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    on_image = json.loads((bundle / "result.json").read_text())
    # It ran on the image's Python and pynq, with insitu from the bundle.
    where = subprocess.run([str(venv_bin / "python3"), "-c",
                            "import sys, pynq, insitu; print(sys.version_info[:2], pynq.__version__, insitu.__file__)"],
                           capture_output=True, text=True, env=image_env(venv_bin), check=True).stdout
    assert where.startswith("(3, 10) 3.0.1 ") and str(tmp_path / "image-venv") in where
    # The LRT path imports there too, and runs its kernels uncompiled (the image has no numba).
    lrt = subprocess.run([str(venv_bin / "python3"), "-c",
                          "import insitu.fpga.lrt_board, insitu.lrt.sks as s; print(s.USES_NUMBA)"],
                         capture_output=True, text=True, env=image_env(venv_bin))
    assert lrt.stdout.strip() == "False", lrt.stderr

    host = insitu_cli("train", "--board", board, *TRAIN_ARGS, "--json", cwd=tmp_path)
    assert host.returncode == 0, host.stderr
    on_host = json.loads(host.stdout)
    assert {k: on_image[k] for k in SAME} == {k: on_host[k] for k in SAME}
    assert on_image["final_loss"] == pytest.approx(on_host["final_loss"], rel=1e-12)
    assert [p.get("test_accuracy") for p in on_image["curve"]] == [p.get("test_accuracy") for p in on_host["curve"]]
    assert [p["loss"] for p in on_image["curve"]] == pytest.approx([p["loss"] for p in on_host["curve"]], rel=1e-12)


def test_a_bundle_carries_the_users_dataset_and_trains_on_it(tmp_path, wheel):
    """`--dataset folder:DIR` travels in the bundle's data/ as the arrays it loads as (the image
    has no Pillow) and is read there by the image's NumPy 1.21 and Python 3.10, with the host's
    result."""
    from own_data import write_image_folder

    images = write_image_folder(tmp_path / "digits", n=300)
    args = ("--algo", "tt", "--dataset", f"folder:{images}", "--batch-size", "32", "--samples", "96")
    bundle = _bundle(tmp_path, "zedboard-sim", wheel, *args)
    assert "--dataset npz:data/digits.npz" in (bundle / "run.sh").read_text()
    venv_bin = image_venv(tmp_path / "image-venv")
    if os.geteuid() != 0:
        pytest.skip("run.sh runs as root, as on the board; this test needs root")
    elsewhere = tmp_path / "elsewhere"            # run.sh reads data/ beside itself from any folder
    elsewhere.mkdir()
    run = subprocess.run(["bash", str(bundle / "run.sh")], capture_output=True, text=True,
                         env=image_env(venv_bin), cwd=elsewhere, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    on_image = json.loads((bundle / "result.json").read_text())
    host = insitu_cli("train", "--board", "zedboard-sim", *args, "--json", cwd=tmp_path)
    assert host.returncode == 0, host.stderr
    on_host = json.loads(host.stdout)
    assert {k: on_image[k] for k in SAME} == {k: on_host[k] for k in SAME}


def test_an_image_whose_package_is_too_old_is_refused_before_training(tmp_path, wheel):
    """run.sh checks versions, not names: a click 7 on the image (insitu needs 8.0) stops it."""
    bundle = _bundle(tmp_path, "zedboard-sim", wheel, *TRAIN_ARGS)
    venv_bin = image_venv(tmp_path / "image-venv")
    if os.geteuid() != 0:
        pytest.skip("run.sh runs as root, as on the board; this test needs root")
    site = next((tmp_path / "image-venv" / "lib").glob("python3.*/site-packages"))
    old = site / "click-7.1.2.dist-info"
    old.mkdir()
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: click\nVersion: 7.1.2\n")
    (old / "RECORD").write_text("")
    run = subprocess.run(["bash", str(bundle / "run.sh")], capture_output=True, text=True,
                         env=image_env(venv_bin), cwd=tmp_path, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "click>=8.0" in run.stderr and "cannot satisfy insitu's requirements" in run.stderr
    assert not (bundle / "result.json").exists()


def test_run_sh_stops_when_not_root(tmp_path, wheel):
    bundle = _bundle(tmp_path, "zedboard-sim", wheel, *TRAIN_ARGS)
    script = (bundle / "run.sh").read_text()
    if os.geteuid() == 0:
        # As the unprivileged `nobody`, from a folder it may read.
        public = Path(tempfile.mkdtemp(prefix="insitu-runsh-"))
        try:
            public.chmod(0o755)
            (public / "run.sh").write_text(script)
            (public / "run.sh").chmod(0o644)
            run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                  "bash", str(public / "run.sh")], capture_output=True, text=True,
                                 cwd=public)
        finally:
            shutil.rmtree(public)
    else:
        run = subprocess.run(["bash", str(bundle / "run.sh")], capture_output=True, text=True)
    assert run.returncode == 1
    assert "run.sh must run as root" in run.stderr and "sudo bash" in run.stderr
