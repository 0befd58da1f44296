"""`insitu rtl generate` through the installed CLI, with the real PEs and top level."""

import json
import re

import pytest

from insitu.accel import regmap
from insitu.rtl import vivado
from insitu.rtl.generate import RTL_SOURCES
from insitu.accel.params import STREAM_BITS, TOP_MODULE

pytestmark = pytest.mark.system



def test_rtl_help_lists_generate(run_cli):
    run = run_cli("rtl", "--help")
    assert run.returncode == 0, run.stderr
    assert "generate" in run.stdout.split("Commands:")[1]


def test_generate_into_a_file_is_a_usage_error(run_cli, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    run = run_cli("rtl", "generate", "--out-dir", target)
    assert run.returncode == 2
    assert "is an existing file" in run.stderr and "Traceback" not in run.stderr
    assert target.read_text() == "x"


def test_generate_needs_out(run_cli):
    run = run_cli("rtl", "generate")
    assert run.returncode == 2 and "--out-dir" in run.stderr


def test_generate_into_an_unwritable_folder_fails_before_converting(run_cli):
    run = run_cli("rtl", "generate", "--out-dir", "/proc/rtl")
    assert run.returncode == 2 and "--out-dir /proc/rtl" in run.stderr, run.stderr
    assert "converting" not in run.stderr and "Traceback" not in run.stderr


def test_generate_writes_the_real_design(run_cli, tmp_path):
    out = tmp_path / "rtl"
    run = run_cli("rtl", "generate", "--out-dir", out, "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["version"] == regmap.VERSION and result["files"][-1] == "manifest.json"
    for path in result["paths"]:
        assert (out / path.rsplit("/", 1)[1]).is_file()
    top = (out / f"{TOP_MODULE}.v").read_text()
    assert vivado.check_top_ports(top) == []
    # Each board's top level, generated with its parameters: the Ultra96-V2's PE3 differs.
    for board in vivado.BOARD_DESIGNS:
        assert vivado.check_top_ports((out / vivado.top_filename(board)).read_text()) == []
    assert (out / vivado.top_filename("zedboard")).read_text() == top       # the defaults
    assert (out / "pe3_ultra96v2.v").read_text() != (out / "pe3.v").read_text()
    ports = vivado.verilog_ports(top, TOP_MODULE)
    assert ports["s_axis_tdata"] == ("input", STREAM_BITS)
    # Every port of the top is mapped by the packaging Tcl, and only those.
    tcl = (out / "package_ip.tcl").read_text()
    mapped = set()
    for body in re.findall(r"insitu_add_bus \$core \S+ \S+ \S+ \{([^}]*)\}", tcl):
        mapped |= set(body.split()[1::2])
    assert mapped == set(ports)
    # The PE files hold their modules.
    for source in RTL_SOURCES:
        assert re.search(rf"\bmodule {source.verilog_name}\(", (out / source.filename).read_text())
    # Plain output: one path per line.
    run = run_cli("rtl", "generate", "--out-dir", out)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(out / name) for name in result["files"]]


def test_report_measures_the_network_in_simulation(run_cli, tmp_path):
    """Batch 1 without synthesis: every op of the network simulated on each board's top level
    (its accelerator parameters), the batch time at each board's clock."""
    from insitu.boards import accelerator_params, pl_clock_hz

    out = tmp_path / "report.json"
    run = run_cli("rtl", "report", "--batch-size", "1", "--no-synth", "--json", "--out", out)
    assert run.returncode == 0, run.stderr[-3000:]
    rep = json.loads(run.stdout)
    assert json.loads(out.read_text()) == rep
    assert rep["batch"] == 1 and set(rep["boards"]) == {"ultra96v2", "zedboard"}
    for name, board in rep["boards"].items():
        assert "resources" not in board and "timing" not in board
        assert board["clock_hz"] == pl_clock_hz(name)
        assert board["params"]["pe3_batch_lanes"] == accelerator_params(name).pe3_batch_lanes
        kinds = {r["kind"] for r in board["ops"]}
        assert kinds == {"PE1", "PE2", "PE3"}
        for r in board["ops"]:
            # Measured cycles can never beat the MAC bound or the stream bound.
            assert r["cycles"] >= max(r["ideal_cycles"], r["stream_cycles"]) > 0
            assert 0 < r["utilization"] <= 1
        total = sum(r["cycles"] for r in board["ops"])
        assert board["cycles"] == total and board["batch_seconds"] == total / board["clock_hz"]
        assert board["ratio_to_mac_bound"] >= 1
    # PE3 multiplies two batch entries a cycle on the Ultra96-V2's design (at batch 1 there is one
    # entry a row: no fewer cycles); PE1 and PE2 are the same in both designs.
    u96, zed = rep["boards"]["ultra96v2"], rep["boards"]["zedboard"]
    assert (u96["mac_units"]["PE3"], zed["mac_units"]["PE3"]) == (32, 16)
    for kind in ("PE1", "PE2"):
        assert u96["per_pe"][kind]["cycles"] == zed["per_pe"][kind]["cycles"]
    # The text: each board's batch time at its clock.
    text = run_cli("rtl", "report", "--batch-size", "1", "--no-synth", "--board", "zedboard")
    assert text.returncode == 0, text.stderr[-3000:]
    seconds = rep["boards"]["zedboard"]["batch_seconds"]
    assert f"zedboard: batch of 1: {rep['boards']['zedboard']['cycles']} cycles = {seconds:.4f} s at 125 MHz" \
        in text.stdout
    assert "ultra96v2" not in text.stdout


def test_report_rejects_a_bad_batch(run_cli):
    run = run_cli("rtl", "report", "--batch-size", "0")
    assert run.returncode == 2 and "--batch-size" in run.stderr


def test_report_rejects_a_board_without_an_accelerator(run_cli):
    run = run_cli("rtl", "report", "--board", "stm32f746-disco", "--no-synth")
    assert run.returncode == 2 and "not an FPGA board" in run.stderr and "ultra96v2" in run.stderr


@pytest.mark.parametrize("command, new, old, args, message", [
    ("generate", "--out-dir", "--out", ("--out", "/proc/rtl"), "--out-dir /proc/rtl"),
    ("report", "--batch-size", "--batch", ("--batch", "0"), "Invalid value for '--batch-size'"),
])
def test_older_spellings_still_work_and_help_shows_the_new_one(run_cli, command, new, old, args, message):
    help_text = run_cli("rtl", command, "--help").stdout
    assert new in help_text and f"{old} " not in help_text
    run = run_cli("rtl", command, *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
