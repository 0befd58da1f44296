"""The accelerator's Verilog in Icarus, driven by cocotb through AXI-Lite and AXI-Stream bus models
(cocotbext-axi) against the golden model; the test bodies are in cocotb_accel.py."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.rtl

pytest.importorskip("cocotb_tools.runner", reason="the rtl extra (cocotb) is not installed")

from insitu.rtl import sim  # noqa: E402

CASES = ["registers", "bad_configurations", "pe1_random", "pe2_random", "pe3_random", "pe3_psg_random",
         "start_while_busy_is_ignored", "abort_and_short_stream",
         "stream_errors_reset_only_the_running_pe", "reset_in_the_middle_of_an_op",
         "lrt_random_sequence", "lrt_bad_configurations"]


@pytest.mark.parametrize("case", CASES)
def test_accelerator(case, tmp_path):
    sim.run("cocotb_accel", case, module_dir=Path(__file__).parent, test_dir=tmp_path)


def test_waveforms_on_request(tmp_path):
    """waves=True (or INSITU_WAVES=1) leaves an FST trace of the run in the test directory."""
    sim.run("cocotb_accel", "registers", module_dir=Path(__file__).parent, test_dir=tmp_path,
            waves=True)
    trace = tmp_path / "cocotb_accel.registers.fst"
    assert trace.exists() and trace.stat().st_size > 1000
