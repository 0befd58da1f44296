"""The CoreMark CPI calibration's logic that needs neither CoreMark nor the toolchain: argument
errors, parsing CoreMark's report, and the arithmetic (host/insitu/mcu/calibrate.py)."""

import pytest

from insitu.errors import InsituError, UsageError
from insitu.mcu import calibrate

pytestmark = pytest.mark.unit

# The shape of a real report (-O2, 2000 iterations): the 2K performance run's known CRCs.
REPORT = """insitu-probe: 2000000 instructions in 50000 ticks
2K performance run parameters for coremark.
CoreMark Size    : 666
Total ticks      : 14565386
Total time (secs): 0
ERROR! Must execute for at least 10 secs for a valid result!
Iterations       : 2000
Compiler version : GCC12.2.1 20221205
Compiler flags   : -O2 -mthumb -mcpu=cortex-m7 -mfpu=fpv5-sp-d16 -mfloat-abi=hard
Memory location  : STATIC
seedcrc          : 0xe9f5
[0]crclist       : 0xe714
[0]crcmatrix     : 0x1fd7
[0]crcstate      : 0x8e3a
[0]crcfinal      : 0x4983
Errors detected
"""


def _tree(folder, files=calibrate.CORE_FILES + ("coremark.h",)):
    for name in files:
        (folder / name).write_text("")
    return folder


def test_a_missing_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such folder.*git clone"):
        calibrate.coremark_cpi(tmp_path / "nowhere")


def test_a_folder_without_core_main_is_not_a_coremark_tree(tmp_path):
    _tree(tmp_path, ("core_util.c",))
    with pytest.raises(UsageError, match="not a CoreMark tree.*core_main.c"):
        calibrate.check_coremark_dir(tmp_path)


@pytest.mark.parametrize("kwargs, message", [({"iterations": 0}, "at least 1"),
                                             ({"opt": "-funroll-loops"}, "optimization flag")])
def test_bad_arguments_are_refused_before_anything_builds(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        calibrate.coremark_cpi(_tree(tmp_path), **kwargs)


def test_a_missing_toolchain_names_the_packages(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate.shutil, "which", lambda tool: None)
    with pytest.raises(InsituError, match="apt-get install gcc-arm-none-eabi "
                                          "libnewlib-arm-none-eabi qemu-system-arm"):
        calibrate.coremark_cpi(_tree(tmp_path))


def test_main_reports_errors_without_a_traceback(tmp_path, capsys):
    assert calibrate.main(["--coremark", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_report_gives_ticks_probe_and_crcs():
    parsed = calibrate.parse_report(REPORT)
    assert parsed["ticks"] == 14565386 and parsed["iterations"] == 2000
    assert parsed["probe_ticks"] == 50000
    assert parsed["crc"] == {"seedcrc": "0xe9f5", "crclist": "0xe714", "crcmatrix": "0x1fd7",
                             "crcstate": "0x8e3a", "crcfinal": "0x4983"}


@pytest.mark.parametrize("broken", [
    REPORT.replace("[0]crcfinal", "[0]ERROR! list crc 0x1234 - should be 0xe714\n[0]crcfinal"),
    REPORT.replace("2K performance run parameters for coremark.\n", ""),
    REPORT + "insitu-fault\n",
])
def test_a_run_that_coremark_did_not_validate_is_an_error(broken):
    with pytest.raises(InsituError, match="did not validate"):
        calibrate.parse_report(broken)


def test_the_probe_gives_whole_instructions_per_tick():
    assert calibrate.instructions_per_tick(50000) == 40        # 25 MHz timer, 1 ns per instruction
    assert calibrate.instructions_per_tick(100000) == 20       # shift=1: 2 ns per instruction
    with pytest.raises(InsituError, match="-icount"):
        calibrate.instructions_per_tick(48000)


def test_the_arithmetic():
    # 2N less N iterations: the fixed costs cancel
    assert calibrate.per_iteration(1000 + 7000, 1000 + 14000, 1, 40) == 280000
    with pytest.raises(InsituError):
        calibrate.per_iteration(10, 10, 5, 40)
    # Arm's 5.01 CoreMark/MHz: 199,600 cycles per iteration
    assert calibrate.cpi(1e6 / 5.01) == pytest.approx(1.0)
    assert calibrate.cpi(1e6 / 5.01 * 2) == pytest.approx(0.5)
