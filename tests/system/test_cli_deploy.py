"""`insitu deploy` through the installed CLI: the bundle, its run.sh, and the SSH command lines.

No test contacts a network host: the SSH tests check the command lines, or run with a PATH whose
ssh/scp/rsync are scripts in tmp_path.
"""

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from insitu.errors import UsageError
from insitu.fpga import deploy, hwh as hwh_mod
from insitu.accel import regmap
from insitu.accel.ip import ACCEL_CELL
from insitu.accel.params import IP_VLNV

pytestmark = pytest.mark.system


def xilinx_bit(data=bytes(range(256)) * 4, design="insitu_ultra96v2;UserID=0XFFFFFFFF;Version=2024.1",
               part="xczu3eg-sbva484-1-i") -> bytes:
    """A .bit as Vivado's write_bitstream lays it out: the header fields, then the data."""
    def field(key: bytes, text: str) -> bytes:
        raw = text.encode() + b"\0"
        return key + len(raw).to_bytes(2, "big") + raw

    return (deploy.BIT_MAGIC + field(b"a", design) + field(b"b", part) + field(b"c", "2026/01/02")
            + field(b"d", "12:34:56") + b"e" + len(data).to_bytes(4, "big") + data)


def _overlay(folder: Path, name="insitu_ultra96v2", bit=True, hwh=True, board="ultra96v2"):
    """A .bit with a Xilinx header and the .hwh of ``board``'s block design (the twin's)."""
    folder.mkdir(parents=True, exist_ok=True)
    if bit:
        (folder / f"{name}.bit").write_bytes(xilinx_bit())
    if hwh:
        hwh_mod.write_hwh(board, folder / f"{name}.hwh")
    return folder / f"{name}.bit", folder / f"{name}.hwh"


def _fake_bin(folder: Path, scripts: dict) -> dict:
    """A PATH whose first folder holds the given shell scripts (name -> body)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """One real bundle, its wheel built from the source tree by the CLI (the slow part, once)."""
    tmp = tmp_path_factory.mktemp("deploy")
    bit, hwh = _overlay(tmp / "vivado", name="design")
    out = tmp / "bundle"
    from conftest import insitu_cli

    run = insitu_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--bitstream", bit, "--hwh", hwh,
                     "--json", "--", "--samples", "600", cwd=tmp)
    assert run.returncode == 0, run.stderr[-3000:]
    return out, json.loads(run.stdout)


@pytest.fixture
def wheel(bundle):
    out, manifest = bundle
    return out / manifest["wheel"]


def test_bundle_holds_overlay_wheel_script_and_manifest(bundle):
    out, manifest = bundle
    assert manifest["path"] == str(out.resolve()) and manifest["board"] == "ultra96v2"
    assert manifest["versions"]["regmap"] == regmap.VERSION
    # No algorithm named: the bundle trains TT (sgd does not run on the PL).
    assert manifest["train_args"] == ["--algo", "tt", "--samples", "600"]
    assert manifest["overlay"]["bit"] == "insitu_ultra96v2.bit" and manifest["overlay_hint"] is None
    assert set(manifest["files"]) == {"run.sh", manifest["wheel"], "insitu_ultra96v2.bit",
                                      "insitu_ultra96v2.hwh", *manifest["board_wheels"]}
    assert sorted(Path(w).name.split("-")[0].lower() for w in manifest["board_wheels"]) == [
        "markdown_it_py", "mdurl", "pygments", "rich", "threadpoolctl", "tomli", "tomli_w"]
    for name, meta in manifest["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == meta["sha256"], name
    assert json.loads((out / "manifest.json").read_text())["files"] == manifest["files"]
    assert (out / "insitu_ultra96v2.hwh").read_text() == hwh_mod.hwh_xml("ultra96v2")
    assert (out / "insitu_ultra96v2.bit").read_bytes() == xilinx_bit()
    with zipfile.ZipFile(out / manifest["wheel"]) as whl:
        names = set(whl.namelist())
    assert {"insitu/fpga/deploy.py", "insitu/boards/ultra96v2.toml", "insitu/accel/regmap.py"} <= names
    script = (out / "run.sh").read_text()
    assert "for profile in /etc/profile.d/xrt_setup.sh /etc/profile.d/pynq_venv.sh" in script
    assert "--no-index --find-links wheels" in script
    assert ('insitu train --board ultra96v2 --bitstream "$here/insitu_ultra96v2.bit" '
            '--out "$here/result.json" --algo tt --samples 600') in script
    assert subprocess.run(["bash", "-n", str(out / "run.sh")]).returncode == 0
    # No temporary folders left beside the bundle.
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_run_sh_refuses_a_damaged_bundle_before_installing(bundle, tmp_path):
    """A file damaged on the way is refused before anything is installed. (The whole run.sh,
    unmodified, installs and trains on the board-image twin: tests/system/test_board_image.py.)"""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("run.sh stops earlier when not root")
    out, manifest = bundle
    copy = tmp_path / "on-board"
    shutil.copytree(out, copy)
    (copy / "insitu_ultra96v2.bit").write_bytes(b"truncated")
    run = subprocess.run(["bash", str(copy / "run.sh")], capture_output=True, text=True)
    assert run.returncode != 0 and "files changed since the bundle was made: insitu_ultra96v2.bit" in run.stderr
    assert "Successfully installed" not in run.stdout + run.stderr


def test_overlay_from_build_rtl_and_existing_bundle_replaced(run_cli, tmp_path, wheel):
    _overlay(tmp_path / "build" / "rtl", name="insitu_zedboard", board="zedboard")
    out = tmp_path / "b"
    first = run_cli("deploy", "--board", "zedboard", "--out-dir", out, "--wheel", wheel, "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["overlay"]["from"][0] == str(tmp_path / "build/rtl/insitu_zedboard.bit")
    again = run_cli("deploy", "--board", "zedboard", "--out-dir", out, "--wheel", wheel, "--json",
                    "--", "--samples", "100", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "manifest.json").read_text())["train_args"] == ["--algo", "tt", "--samples", "100"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "build"]


def test_without_overlay_the_bundle_says_how_to_get_one(run_cli, tmp_path, wheel):
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--wheel", wheel, "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["overlay"] is None
    assert "insitu rtl generate --out-dir build/rtl" in got["overlay_hint"]
    assert "build_ultra96v2.tcl" in got["overlay_hint"]
    assert set(got["files"]) == {"run.sh", got["wheel"], *got["board_wheels"]}
    # On the board the script stops with the same message, before installing anything.
    board = subprocess.run(["bash", str(out / "run.sh")], capture_output=True, text=True)
    assert board.returncode == 1 and "insitu rtl generate --out-dir build/rtl" in board.stderr


@pytest.mark.parametrize("given", ["bit", "hwh", "search"])
def test_half_an_overlay_is_a_usage_error(run_cli, tmp_path, wheel, given):
    if given == "search":
        _overlay(tmp_path / "build" / "rtl", bit=True, hwh=False)
        args = []
    else:
        bit, hwh = _overlay(tmp_path / "v", name="x", bit=given == "bit", hwh=given == "hwh")
        args = ["--bitstream", bit] if given == "bit" else ["--hwh", hwh]
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--wheel", wheel, *args, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "pynq.Overlay needs both" in run.stderr and "Traceback" not in run.stderr
    assert not out.exists()


def test_the_bitstream_header_is_read(tmp_path):
    path = tmp_path / "ok.bit"
    path.write_bytes(xilinx_bit())
    assert deploy.check_bitstream(path) == {
        "design": "insitu_ultra96v2;UserID=0XFFFFFFFF;Version=2024.1", "part": "xczu3eg-sbva484-1-i",
        "date": "2026/01/02", "time": "12:34:56"}


@pytest.mark.parametrize("content, message", [
    (b"not a bitstream\n", r"bogus.bit has no Xilinx bitstream header: it is 16 bytes that are not "
                           r"a Vivado \.bit; give the \.bit that Vivado's write_bitstream made"),
    (b'{"format": "insitu-twin-bitstream"}', r"no Xilinx bitstream header: it is a simulated "
                                             r"board's twin overlay, which runs only on a -sim board"),
    (deploy.BIT_MAGIC + b"a\x00\x02x\x00z", r"bogus.bit: its Xilinx bitstream header is damaged "
                                            r"\(it has the fields design, then no configuration data\)"),
    (xilinx_bit()[:-10], r"bogus.bit is not whole: its header announces 1024 bytes of configuration "
                         r"data, the file holds 1014"),
])
def test_deploy_refuses_a_bit_that_is_not_a_vivado_bitstream(run_cli, tmp_path, content, message):
    """Checked before any work: no wheel is built (none is given), no bundle is left."""
    bit, _ = _overlay(tmp_path / "v", name="bogus")
    bit.write_bytes(content)
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--bitstream", bit, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert re.search(message, " ".join(run.stderr.split())), run.stderr
    assert "Traceback" not in run.stderr and "building the insitu wheel" not in run.stdout
    assert not out.exists()


@pytest.mark.parametrize("break_it, message", [
    (lambda xml: "<junk", r"bogus.hwh is not a hardware handoff \(\.hwh\): its XML does not parse"),
    (lambda xml: "<MODULES/>\n", r"bogus.hwh is not a hardware handoff \(\.hwh\): its root element "
                                 r"is <MODULES>, not <EDKSYSTEM>"),
    (lambda xml: xml.replace(f'INSTANCE="{ACCEL_CELL}"', 'INSTANCE="other_0"'),
     rf"bogus.hwh has no {ACCEL_CELL} cell: it is not the block design of the insitu accelerator; "
     r"build the overlay from this insitu version \(`insitu rtl generate`, then its Vivado script\)"),
    (lambda xml: xml.replace(f'VLNV="{IP_VLNV}"', 'VLNV="insitu.dev:insitu:insitu_accel:0.9"'),
     rf"bogus.hwh: its {ACCEL_CELL} is the IP insitu.dev:insitu:insitu_accel:0.9, not {IP_VLNV}"),
    (lambda xml: xml.replace('<REGISTER NAME="PSG_TAU">', '<REGISTER NAME="PSG_TAU_OLD">'),
     rf"bogus.hwh: the registers of {ACCEL_CELL} are not this insitu's register map \(VERSION "
     rf"{regmap.VERSION:#010x}\): no register PSG_TAU; register PSG_TAU_OLD is not in this map"),
    (lambda xml: xml.replace('VALUE="0x1c"', 'VALUE="0x1d"'),
     rf"are not this insitu's register map \(VERSION {regmap.VERSION:#010x}\): register SHIFT "
     r"differs; build the overlay"),
    (lambda xml: hwh_mod.hwh_xml("zedboard"),
     r"bogus.hwh is a block design for a zynq device; ultra96v2 is Avnet Ultra96-V2 \(Zynq "
     r"UltraScale\+ ZU3EG\), a zynquplus device: give ultra96v2's overlay"),
])
def test_deploy_refuses_a_hwh_of_another_design(run_cli, tmp_path, break_it, message):
    bit, hwh = _overlay(tmp_path / "v", name="bogus")
    hwh.write_text(break_it(hwh.read_text()))
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--bitstream", bit, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert re.search(message, " ".join(run.stderr.split())), run.stderr
    assert "Traceback" not in run.stderr and not out.exists()


def test_the_twins_hwh_and_a_vivado_header_pass_for_both_boards(tmp_path):
    for board in ("ultra96v2", "zedboard"):
        bit, hwh = _overlay(tmp_path / board, board=board)
        deploy.check_overlay(board, bit, hwh)


@pytest.mark.parametrize("board", ["stm32f746-disco", "stm32f746-disco-sim", "nope"])
def test_only_fpga_boards_and_their_twins(run_cli, tmp_path, board):
    run = run_cli("deploy", "--board", board, "--out-dir", tmp_path / "b", cwd=tmp_path)
    assert run.returncode == 2
    assert "boards: ultra96v2, zedboard (or their twins, ultra96v2-sim, zedboard-sim)" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "b").exists()


def test_a_twin_bundle_carries_the_twin_overlay(run_cli, tmp_path, wheel):
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "zedboard-sim", "--out-dir", out, "--wheel", wheel, "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["overlay"] == {"bit": "insitu_zedboard.bit", "hwh": "insitu_zedboard.hwh",
                              "from": "the twin overlay"}
    assert json.loads((out / "insitu_zedboard.bit").read_text())["board"] == "zedboard"
    assert (out / "insitu_zedboard.hwh").read_text() == hwh_mod.hwh_xml("zedboard")
    assert "insitu train --board zedboard-sim --bitstream" in (out / "run.sh").read_text()
    bit, _ = _overlay(tmp_path / "v", board="zedboard")
    run = run_cli("deploy", "--board", "zedboard-sim", "--out-dir", tmp_path / "c", "--wheel", wheel,
                  "--bitstream", bit, cwd=tmp_path)
    assert run.returncode == 2 and "leave out --bitstream and --hwh" in run.stderr


@pytest.mark.parametrize("form", ["--dataset", "--dataset="])
def test_the_users_dataset_travels_in_the_bundle(run_cli, tmp_path, insitu_cache, wheel, form):
    from own_data import write_image_folder

    from conftest import cache_env

    from insitu.data import load_dataset

    images = write_image_folder(tmp_path / "imgs", n=40)
    spec = f"folder:{images},test=0.25"
    args = ["--dataset", spec] if form == "--dataset" else [f"--dataset={spec}"]
    out = tmp_path / "b"
    # The folder decoded in the test's own cache (here and in deploy); the board's wheels, shared.
    env = cache_env(insitu_cache, share=("board-wheels",))
    run = run_cli("deploy", "--board", "zedboard-sim", "--out-dir", out, "--wheel", wheel, "--json", "--",
                  *args, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    manifest = json.loads(run.stdout)
    # a folder travels as the arrays it loads as (the board images have no Pillow), split applied
    assert manifest["dataset"] == {"from": spec, "to": "data/imgs.npz"}
    assert "npz:data/imgs.npz" in " ".join(manifest["train_args"])
    bundled, given = load_dataset(f"npz:{out / 'data' / 'imgs.npz'}"), load_dataset(spec)
    assert bundled.splits == given.splits == {"train": 30, "test": 10}
    assert np.array_equal(bundled.x_test, given.x_test) and bundled.class_names == given.class_names
    run = run_cli("deploy", "--board", "zedboard-sim", "--out-dir", tmp_path / "c", "--wheel", wheel, "--",
                  "--dataset", f"npz:{tmp_path / 'missing.npz'}", cwd=tmp_path, env=env)
    assert run.returncode == 2 and "missing.npz" in run.stderr and not (tmp_path / "c").exists()


@pytest.mark.parametrize("args, message", [
    ((), None),                                        # --algo tt by default
    (("--algo", "sgd"), "algorithm 'sgd' runs on simulated twins only"),
    (("--algo", "tt", "--mode", "rtl"), "--mode"),
    (("--algo", "tt", "--rank", "0"), "--rank"),
    (("--config", "run.toml"), "--config cannot be a bundle's train argument: the file is not in the bundle"),
])
def test_train_arguments_are_checked_as_the_board_would(run_cli, tmp_path, wheel, args, message):
    """Refused here, before anything is built, with insitu train's own checks on the board."""
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--wheel", wheel, "--json",
                  "--", *args, cwd=tmp_path)
    if message is None:
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["train_args"] == ["--algo", "tt"]
        return
    assert run.returncode == 2, run.stderr
    assert message in " ".join(run.stderr.split()) and "Traceback" not in run.stderr
    assert not out.exists()


def test_refuses_a_folder_that_is_not_a_bundle_and_reserved_train_args(run_cli, tmp_path, wheel):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", other, "--wheel", wheel, cwd=tmp_path)
    assert run.returncode == 2 and "neither empty nor an insitu bundle" in run.stderr
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", tmp_path / "b", "--wheel", wheel,
                  "--", "--board=zedboard", cwd=tmp_path)
    assert run.returncode == 2 and "--board cannot be a bundle's train argument" in run.stderr
    # Training arguments are parsed by `insitu train`'s own options before anything is built.
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", tmp_path / "b", "--wheel", wheel,
                  "--", "--smaples", "10", cwd=tmp_path)
    assert run.returncode == 2 and "No such option '--smaples'" in run.stderr
    assert not (tmp_path / "b").exists()


def test_source_less_install_needs_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(deploy, "project_root", lambda: None)
    with pytest.raises(UsageError, match="--wheel FILE"):
        deploy.build_bundle(tmp_path / "b", "ultra96v2", search_dir=tmp_path)
    assert not (tmp_path / "b").exists()


def test_ssh_command_lines(tmp_path):
    (tmp_path / "run.sh").write_text("")
    (tmp_path / "wheels").mkdir()
    for rsync in (True, False):
        cmds = deploy.ssh_commands("pynq", "root", "~/runs/u96", tmp_path, rsync=rsync)
        assert len(cmds) == 3
        flat = [" ".join(c) for c in cmds]
        for cmd in flat:
            assert "StrictHostKeyChecking" not in cmd and "sshpass" not in cmd and "Password" not in cmd
        for cmd in cmds:
            assert "BatchMode=yes" in " ".join(cmd) and "ConnectTimeout=10" in " ".join(cmd)
        assert cmds[0][0] == "ssh" and cmds[0][-2:] == ["root@pynq", "mkdir -p -- runs/u96"]
        assert cmds[-1][0] == "ssh" and cmds[-1][-2:] == ["root@pynq", "bash runs/u96/run.sh"]
        if rsync:
            assert cmds[1] == ["rsync", "-a", "-e", "ssh -o BatchMode=yes -o ConnectTimeout=10",
                               f"{tmp_path}/", "root@pynq:runs/u96/"]
        else:
            assert cmds[1] == ["scp", "-r", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                               str(tmp_path / "run.sh"), str(tmp_path / "wheels"), "root@pynq:runs/u96/"]
    assert deploy.ssh_commands("board.local", None, "insitu-bundle", tmp_path, rsync=True)[0][-2] == "board.local"
    for host, user, remote in (("-oProxyCommand=x", None, "d"), ("a b", None, "d"),
                               ("pynq", "-l", "d"), ("pynq", None, "d; rm -rf /"), ("pynq", None, "~x")):
        with pytest.raises(UsageError):
            deploy.ssh_commands(host, user, remote, tmp_path, rsync=True)


def test_dry_run_prints_the_commands_and_runs_nothing(run_cli, tmp_path, wheel):
    called = tmp_path / "called"
    env = _fake_bin(tmp_path / "bin", {tool: f'echo {tool} >> "{called}"; exit 0'
                                       for tool in ("ssh", "scp", "rsync")})
    out = tmp_path / "b"
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--wheel", wheel, "--host", "pynq",
                  "--user", "xilinx", "--dry-run", "--json", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["ran"] is False and got["host"] == "pynq" and len(got["commands"]) == 3
    assert got["commands"][-1][-2:] == ["xilinx@pynq", "bash insitu-bundle/run.sh"]
    assert not called.exists() and (out / "run.sh").is_file()
    plain = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--wheel", wheel, "--host", "pynq",
                    "--dry-run", env=env, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0] == str(out) and lines[1].startswith("ssh -o BatchMode=yes") and len(lines) == 4
    assert not called.exists()


def test_unreachable_host_is_a_clear_usage_error(run_cli, tmp_path, wheel):
    msg = "ssh: connect to host board.invalid port 22: Connection timed out"
    env = _fake_bin(tmp_path / "bin", {tool: f'echo "{msg}" >&2; exit 255' for tool in ("ssh", "scp", "rsync")})
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", tmp_path / "b", "--wheel", wheel,
                  "--host", "board.invalid", env=env, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "cannot reach board.invalid" in run.stderr and "Connection timed out" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_failing_run_on_the_board_is_an_error(run_cli, tmp_path, wheel):
    # ssh and the copy succeed; run.sh "fails" on the board.
    env = _fake_bin(tmp_path / "bin", {
        "ssh": 'case "$*" in *run.sh*) echo "training failed" ; exit 3;; esac; exit 0',
        "scp": "exit 0", "rsync": "exit 0"})
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", tmp_path / "b", "--wheel", wheel,
                  "--host", "pynq", "--json", env=env, cwd=tmp_path)
    assert run.returncode == 1
    assert "the run on pynq failed (exit 3)" in run.stderr and "training failed" in run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("new, old", [("--out-dir", "--out"), ("--bitstream", "--bit")])
def test_older_spellings_still_work_and_help_shows_the_new_one(run_cli, tmp_path, new, old):
    help_text = run_cli("deploy", "--help").stdout
    assert new in help_text and f"{old} " not in help_text
    bit, _ = _overlay(tmp_path / "v", name="bogus")
    bit.write_bytes(b"not a bitstream\n")
    out = tmp_path / "b"
    options = {"--out-dir": out, "--bitstream": bit}
    options[old] = options.pop(new)
    run = run_cli("deploy", "--board", "ultra96v2", *[x for kv in options.items() for x in kv], cwd=tmp_path)
    assert run.returncode == 2 and "no Xilinx bitstream header" in run.stderr, run.stderr
    assert not out.exists()


@pytest.mark.parametrize("where, message", [
    ("file", "Invalid value for '--out-dir'"),
    ("proc", "cannot write --out-dir /proc/bundle"),
])
def test_an_unwritable_out_dir_fails_before_building(run_cli, tmp_path, wheel, where, message):
    out = tmp_path / "a-file" if where == "file" else "/proc/bundle"
    if where == "file":
        out.write_text("x")
    run = run_cli("deploy", "--board", "ultra96v2", "--out-dir", out, "--wheel", wheel, cwd=tmp_path)
    assert run.returncode == 2 and message.format(out=out) in " ".join(run.stderr.split()), run.stderr
    assert "Traceback" not in run.stderr


def test_the_board_wheels_are_the_versions_the_host_is_tested_with():
    """deploy's pins and scripts/constraints.txt name the same versions, so the board runs what
    the suite ran (the board-image test installs them)."""
    pins = dict(line.split("==") for line in
                (Path(__file__).resolve().parents[2] / "scripts/constraints.txt").read_text().split()
                if "==" in line)
    for pin in deploy.BOARD_WHEELS:
        name, version = pin.split("==")
        assert pins.get(name) == version, f"{pin}: scripts/constraints.txt pins {pins.get(name)}"
