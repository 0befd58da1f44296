"""cocotb + Icarus simulation of the generated Verilog (tests and ``insitu rtl report``).

:func:`build` converts the Vivado-facing top level to Verilog and compiles it with Icarus once per
design (the build directory is keyed by a hash of the Verilog); :func:`run` runs cocotb test
functions from a Python module against it. Waveforms: ``waves=True`` or the environment variable
``INSITU_WAVES=1`` write ``<module>.<case>.fst`` into the test directory (pytest: the test's
``tmp_path``; open it with GTKWave or Surfer).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from .params import DEFAULT_PARAMS, TOP_MODULE, AcceleratorParams

#: Where builds are cached unless a directory is given.
DEFAULT_BUILD_ROOT = Path(os.environ.get("INSITU_SIM_BUILD", Path.home() / ".cache" / "insitu" / "sim"))
TIMESCALE = ("1ns", "1ps")


class SimulationError(RuntimeError):
    """The simulator is missing, the build failed, or cocotb tests failed."""


def waves_requested(waves: bool | None = None) -> bool:
    if waves is not None:
        return waves
    return os.environ.get("INSITU_WAVES", "") not in ("", "0")


def top_verilog(params: AcceleratorParams = DEFAULT_PARAMS) -> str:
    from amaranth.back import verilog

    from .top import AcceleratorTop

    top = AcceleratorTop(params)
    return verilog.convert(top, name=TOP_MODULE, ports=top.ports(), emit_src=False)


def build(params: AcceleratorParams = DEFAULT_PARAMS, build_root: Path | None = None,
          waves: bool | None = None):
    """Generate and compile the top level; returns ``(runner, build_dir)``. The Verilog and the
    Icarus build are reused while the design is unchanged."""
    if shutil.which("iverilog") is None:
        raise SimulationError("Icarus Verilog (iverilog) is not installed: run scripts/setup.sh "
                              "or `apt-get install iverilog`")
    from cocotb_tools.runner import get_runner

    waves = waves_requested(waves)
    source = top_verilog(params)
    key = hashlib.sha256((source + f"waves={waves}").encode()).hexdigest()[:16]
    build_dir = Path(build_root or DEFAULT_BUILD_ROOT) / key
    verilog_file = build_dir / f"{TOP_MODULE}.v"
    build_dir.mkdir(parents=True, exist_ok=True)
    if not verilog_file.exists() or verilog_file.read_text() != source:
        tmp = verilog_file.with_suffix(".v.tmp")
        tmp.write_text(source)
        os.replace(tmp, verilog_file)
    runner = get_runner("icarus")
    # Icarus recompiles only when the Verilog is newer than its build.
    runner.build(sources=[verilog_file], hdl_toplevel=TOP_MODULE, build_dir=build_dir,
                 timescale=TIMESCALE, waves=waves)
    return runner, build_dir


def run(test_module: str, testcase: str | list[str] | None = None, *, module_dir: Path | None = None,
        params: AcceleratorParams = DEFAULT_PARAMS, extra_env: dict | None = None,
        waves: bool | None = None, seed: int | None = None, test_dir: Path | None = None,
        quiet: bool = False) -> Path:
    """Run cocotb tests of ``test_module`` (importable from ``module_dir``); returns the results
    XML. Raises :class:`SimulationError` when a test fails (outside pytest too). ``quiet`` sends
    the simulator's log to ``sim.log`` in the test directory (its tail is in the error)."""
    from cocotb_tools.check_results import get_results

    waves = waves_requested(waves)
    runner, build_dir = build(params, waves=waves)
    env = dict(extra_env or {})
    if module_dir is not None:
        # The simulator's embedded Python imports the test module from there: cocotb's runner
        # passes this process's sys.path on as its PYTHONPATH.
        if str(Path(module_dir).resolve()) not in sys.path:
            sys.path.insert(0, str(Path(module_dir).resolve()))
    test_dir = Path(test_dir or build_dir / "runs")
    test_dir.mkdir(parents=True, exist_ok=True)
    log_file = test_dir.resolve() / "sim.log" if quiet else None
    if quiet:
        env.setdefault("COCOTB_LOG_LEVEL", "WARNING")
        env.setdefault("PYTHONWARNINGS", "ignore")

    def log_tail() -> str:
        return ("\n" + log_file.read_text()[-3000:]) if log_file and log_file.exists() else ""

    name = testcase if isinstance(testcase, str) else "all"
    # Waveforms go next to the results, one file per run: <test dir>/<module>.<case>.fst.
    plusargs = [f"+dumpfile_path={test_dir.resolve() / f'{test_module}.{name}.fst'}"] if waves else []
    try:
        results = runner.test(test_module=test_module, hdl_toplevel=TOP_MODULE, testcase=testcase,
                              build_dir=build_dir, test_dir=test_dir, extra_env=env, waves=waves,
                              seed=seed, timescale=TIMESCALE, log_file=log_file, plusargs=plusargs,
                              results_xml=str(test_dir.resolve() / f"{test_module}.{name}.xml"))
    except SystemExit as exc:
        raise SimulationError(f"cocotb tests of {test_module} failed (exit {exc.code}); see the "
                              f"simulator's log{log_tail()}") from None
    try:
        total, failed = get_results(results)
    except RuntimeError as exc:
        raise SimulationError(f"{exc}{log_tail()}") from None
    if failed or not total:
        raise SimulationError(f"{failed} of {total} cocotb tests of {test_module} failed{log_tail()}")
    return results
