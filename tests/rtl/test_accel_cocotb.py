"""The accelerator's Verilog in Verilator where it runs, else Icarus (``INSITU_SIM=verilator|icarus``
forces one), driven by cocotb through AXI-Lite and AXI-Stream bus models (cocotbext-axi) against
the golden model; the test bodies are in cocotb_accel.py. The cases run in one simulation
(Verilator simulates them in seconds; starting the simulator is the cost); a subset runs on Icarus
as well, one simulation each from power-up (4-state), and so does the waveform test."""

from pathlib import Path
from xml.etree import ElementTree

import pytest

pytestmark = pytest.mark.rtl

pytest.importorskip("cocotb_tools.runner", reason="the rtl extra (cocotb) is not installed")

from insitu.rtl import sim  # noqa: E402

HERE = Path(__file__).parent
CASES = ["registers", "bad_configurations", "pe1_random", "pe2_random", "pe3_random", "pe3_psg_random",
         "start_while_busy_is_ignored", "abort_and_short_stream",
         "stream_errors_reset_only_the_running_pe", "reset_in_the_middle_of_an_op",
         "lrt_random_sequence", "lrt_bad_configurations"]
#: On Icarus too, one simulation each: the register map, a PE op under back-pressure, `aresetn` in
#: the middle of an op and the LRT PE (its datapath registers have no reset).
ICARUS_CASES = ["registers", "pe2_random", "reset_in_the_middle_of_an_op", "lrt_bad_configurations"]


def _default_simulator() -> str:
    """$INSITU_SIM if set; else Verilator where it runs (the same choice on every run, whatever
    the cache holds): its build (about 30 s, cached) is the one `insitu rtl report` and `rtl bench`
    use too, and it runs the twelve cases in seconds, where Icarus takes about 100 s."""
    try:
        return sim.choose_simulator()
    except sim.SimulationError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def suite(request, tmp_path_factory):
    """Runs the selected cases of test_accelerator in one simulation (each case resets the
    accelerator through `aresetn`): the simulator's start (~2 s) is paid once, not per case.
    Returns ({case: failure text or None}, the error when the run itself failed)."""
    simulator = _default_simulator()
    cases = [item.callspec.params["case"] for item in request.session.items
             if item.module is request.module and item.originalname == "test_accelerator"]
    test_dir = tmp_path_factory.mktemp("cocotb_accel")
    error = None
    try:
        sim.run("cocotb_accel", cases, module_dir=HERE, test_dir=test_dir, quiet=True,
                simulator=simulator)
    except sim.SimulationError as exc:
        error = str(exc)
    outcome = {}
    xml = test_dir / "cocotb_accel.all.xml"
    if xml.exists():
        for case in ElementTree.parse(xml).iter("testcase"):
            failure = case.find("failure")
            outcome[case.get("name")] = None if failure is None else \
                (failure.get("message") or "") + (failure.text or "")
    log = test_dir / "sim.log"
    return outcome, error, log


@pytest.mark.parametrize("case", CASES)
def test_accelerator(case, suite):
    outcome, error, log = suite
    if case not in outcome:
        pytest.fail(f"{case} did not run: {error}")
    if outcome[case] is not None:
        pytest.fail(f"{case} failed: {outcome[case]}\n(the whole run's log: {log})")


@pytest.mark.parametrize("case", ICARUS_CASES)
def test_accelerator_on_icarus(case, tmp_path):
    """Each case in its own simulation, from power-up: 4-state Icarus shows an X that a register
    without reset leaks into the control path (Verilator's 2 states cannot, and in one shared
    simulation the cases before hide it)."""
    if sim.unavailable("icarus"):
        pytest.skip(sim.unavailable("icarus"))
    sim.run("cocotb_accel", case, module_dir=HERE, test_dir=tmp_path, simulator="icarus")


def test_waveforms_on_request(tmp_path):
    """waves=True (or INSITU_WAVES=1) leaves a trace of the run in the test directory: FST from
    Icarus (the default for waves), VCD from Verilator when INSITU_SIM=verilator forces it."""
    _default_simulator()
    sim.run("cocotb_accel", "registers", module_dir=HERE, test_dir=tmp_path, waves=True)
    traces = list(tmp_path.glob("cocotb_accel.registers.*"))
    traces = [t for t in traces if t.suffix in (".fst", ".vcd")]
    assert len(traces) == 1 and traces[0].stat().st_size > 1000, traces
