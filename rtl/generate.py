"""``insitu rtl generate``: the Verilog, register map and Vivado scripts of the accelerator.

:func:`generate` writes into one folder:

* per board (``ultra96v2``, ``zedboard``), generated with that board's accelerator parameters
  (:func:`insitu.boards.accelerator_params`: the defaults with its board file's
  ``[accelerator]`` overrides) and for its PL clock (``[fpga] pl_clock_hz``):
  ``insitu_accel_<board>.v``, the Vivado-facing top level with the PEs inside it, the one file
  the board's IP is packaged from; ``insitu_accel_<board>_ooc.xdc``, its clock at the board's
  period (and ``insitu_accel_<board>.xdc`` with any declared false/multicycle paths);
  ``registers_<board>.md`` / ``.json``, the register map with that design's reset values and
  clock; ``bd_<board>.tcl`` and ``build_<board>.tcl`` (see :mod:`insitu.rtl.vivado`); and, for a
  board whose parameters differ from the defaults, its PEs on their own, ``pe1_<board>.v`` ...;
* the reference design, with the default parameters (:data:`~insitu.accel.params.DEFAULT_PARAMS`,
  what the simulations and the cocotb tests run): ``pe1.v``, ``pe2.v``, ``pe3.v``, ``pe_lrt.v``
  (each PE on its own: simulation, synthesis estimates), ``insitu_accel.v`` (the top level),
  ``registers.md`` and ``registers.json``;
* ``package_ip.tcl``: packages a board's top level (one script for all boards);
* ``manifest.json``: every file with its SHA-256, the register map VERSION, the IP's VLNV, the
  reference parameters and, per board, its part, clock, parameters and files.

Everything is produced in memory first (Verilog conversion is the slow, fallible part); then each
file is written atomically and ``manifest.json`` last, so an interrupted run leaves the previous
files or the new ones, never a half-written file, and a manifest that matches what it lists only
once the run completed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from insitu.accel.params import (DEFAULT_PARAMS, IP_VLNV, STREAM_BITS, STREAM_WORDS, TOP_MODULE,
                                 WORD_BITS, AcceleratorParams)
from insitu.accel.regmap import ADDR_BITS, ID_VALUE, REGISTERS, VERSION, ErrorCode, Op, markdown, reset_value


@dataclass(frozen=True)
class RTLSource:
    """One Verilog file: the Amaranth component it is converted from."""

    filename: str
    verilog_name: str        # the Verilog module name
    module: str              # where the component class lives
    attr: str                # its class name; constructed with (params)
    #: Build the component without importing ``module`` (tests use stand-ins).
    factory: Callable | None = None

    def available(self) -> bool:
        if self.factory is not None:
            return True
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            return False

    def build(self, params: AcceleratorParams):
        if self.factory is not None:
            return self.factory(params)
        if not self.available():
            from insitu.errors import InsituError

            raise InsituError(f"RTL module {self.module} is missing: cannot generate {self.filename} "
                              f"({self.attr})")
        return getattr(importlib.import_module(self.module), self.attr)(params)


#: The Verilog files, the top level last (it is checked against the Vivado contract).
RTL_SOURCES: tuple[RTLSource, ...] = (
    RTLSource("pe1.v", "pe1", "insitu.rtl.pe1", "PE1"),
    RTLSource("pe2.v", "pe2", "insitu.rtl.pe2", "PE2"),
    RTLSource("pe3.v", "pe3", "insitu.rtl.pe3", "PE3"),
    RTLSource("pe_lrt.v", "pe_lrt", "insitu.rtl.pe_lrt", "PELRT"),
    RTLSource(f"{TOP_MODULE}.v", TOP_MODULE, "insitu.rtl.top", "AcceleratorTop"),
)


def rtl_sources() -> tuple[RTLSource, ...]:
    return RTL_SOURCES


def missing_sources() -> list[str]:
    """Modules of :data:`RTL_SOURCES` that are not there yet (``generate`` needs them all)."""
    return [s.module for s in rtl_sources() if not s.available()]


def to_verilog(component, name: str) -> str:
    """Verilog of an Amaranth design, without source locations (the text does not depend on where
    insitu is installed). A ``wiring.Component`` gives its ports by its signature; another
    elaboratable must have a ``ports()`` method."""
    from amaranth.back import verilog
    from amaranth.lib import wiring

    if isinstance(component, wiring.Component):
        return verilog.convert(component, name=name, emit_src=False)
    if not callable(getattr(component, "ports", None)):
        raise TypeError(f"{type(component).__name__} is neither a wiring.Component nor has ports()")
    return verilog.convert(component, name=name, ports=component.ports(), emit_src=False)


def board_entry(key: str, interrupt: bool = False) -> dict:
    """One board's design as the register map and the manifest describe it: its addresses, part,
    PL clock and accelerator parameters."""
    from .vivado import address_map, board_design

    design = board_design(key)
    return {**address_map(key, interrupt), "clock_hz": design.clock_hz,
            "params": asdict(design.params)}


def registers_json(params: AcceleratorParams = DEFAULT_PARAMS, interrupt: bool = False,
                   board: str | None = None) -> dict:
    """The register map as data: what a driver needs to talk to this bitstream.

    ``board``: the map of that board's design (its parameters' reset values, its clock and its
    addresses); None: the reference design's, with every board's addresses and clock."""
    from .vivado import BOARD_DESIGNS

    registers = []
    for r in REGISTERS:
        registers.append({
            "name": r.name, "offset": r.offset, "access": r.access, "width": r.width,
            "signed": r.signed, "reset": reset_value(r, params), "param": r.param, "doc": r.doc,
            "fields": [{"name": f.name, "lsb": f.lsb, "width": f.width, "doc": f.doc}
                       for f in r.fields],
        })
    return {
        "version": VERSION,
        "version_hex": f"{VERSION:#010x}",
        "id": ID_VALUE,
        "addr_bits": ADDR_BITS,
        "data_bits": 32,
        "span_bytes": 1 << ADDR_BITS,
        "unknown_address": "reads 0, writes ignored, response OKAY",
        "signed_read": "signed registers read back sign-extended to 32 bits",
        "registers": registers,
        "ops": {o.name: o.value for o in Op},
        "error_codes": {e.name: e.value for e in ErrorCode},
        "stream": {"bits": STREAM_BITS, "words": STREAM_WORDS, "word_bits": WORD_BITS},
        "params": asdict(params),
        "top_module": TOP_MODULE,
        "vlnv": IP_VLNV,
        "board": board,
        # A board's design runs at its PL clock; the reference design has no board of its own.
        "clock_hz": board_entry(board, interrupt)["clock_hz"] if board else None,
        "interrupt": interrupt,
        "boards": {key: board_entry(key, interrupt) for key in ([board] if board else BOARD_DESIGNS)},
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def board_suffixed(filename: str, key: str) -> str:
    """``pe3.v`` -> ``pe3_<board>.v``: a Verilog file of a board's own design."""
    stem, dot, ext = filename.rpartition(".")
    return f"{stem}_{key}{dot}{ext}"


def board_files(key: str, params: AcceleratorParams, default: AcceleratorParams = DEFAULT_PARAMS,
                ) -> list[str]:
    """The files ``generate`` writes for one board (the Tcl, constraints, register map and
    Verilog of its design)."""
    from .timing import xdc_exceptions_text
    from .vivado import ooc_xdc_filename, paths_xdc_filename, top_filename

    names = [top_filename(key)]
    if params != default:
        names += [board_suffixed(s.filename, key) for s in rtl_sources()[:-1]]
    names += [f"registers_{key}.md", f"registers_{key}.json", ooc_xdc_filename(key)]
    if xdc_exceptions_text():
        names.append(paths_xdc_filename(key))
    return names + [f"bd_{key}.tcl", f"build_{key}.tcl"]


def _convert(params: AcceleratorParams, progress: Callable[[str], None] | None,
             label: str) -> dict[str, str]:
    """Every source's Verilog for one parameter set: source file name -> text (kept in the
    cache across processes, :mod:`.verilog_cache`)."""
    from .verilog_cache import converted

    out = {}
    for source in rtl_sources():
        if progress:
            progress(source.filename + label)
        if source.factory is None and source.available():
            out[source.filename] = converted(source.module, source.attr, params, source.verilog_name)
        else:
            out[source.filename] = to_verilog(source.build(params), source.verilog_name)
    return out


def render(params: AcceleratorParams = DEFAULT_PARAMS, progress: Callable[[str], None] | None = None,
           boards: dict[str, AcceleratorParams] | None = None) -> dict[str, str]:
    """Every file's text, in memory: file name -> text (without ``manifest.json``).

    ``params``: the reference design's parameters (the unsuffixed files); ``boards``: each
    board's parameters (default: its board file's, :func:`insitu.boards.accelerator_params`).
    Each distinct parameter set is converted once."""
    from insitu.errors import InsituError

    from .timing import xdc_clock_text, xdc_exceptions_text
    from .vivado import (BOARD_DESIGNS, block_design_tcl, board_design, build_tcl, check_top_ports,
                         has_interrupt, ooc_xdc_filename, package_ip_tcl, paths_xdc_filename,
                         top_filename)

    missing = missing_sources()
    if missing:
        raise InsituError(f"cannot generate the RTL: module(s) {', '.join(missing)} missing from "
                          "this installation")
    if boards is None:
        boards = {key: board_design(key).params for key in BOARD_DESIGNS}
    converted: dict[AcceleratorParams, dict[str, str]] = {}

    def verilog_of(p: AcceleratorParams, label: str) -> dict[str, str]:
        if p not in converted:
            converted[p] = _convert(p, progress, label)
            top = converted[p][f"{TOP_MODULE}.v"]
            problems = check_top_ports(top, TOP_MODULE)
            if problems:
                raise InsituError(f"the top level {TOP_MODULE} does not match the Vivado packaging "
                                  f"(insitu.rtl.vivado.top_ports): {'; '.join(problems)}")
        return converted[p]

    files: dict[str, str] = dict(verilog_of(params, ""))
    interrupt = has_interrupt(files[f"{TOP_MODULE}.v"], TOP_MODULE)
    files["registers.md"] = markdown(params)
    files["registers.json"] = json.dumps(registers_json(params, interrupt), indent=2) + "\n"
    files["package_ip.tcl"] = package_ip_tcl(interrupt)
    exceptions = xdc_exceptions_text()
    for key, board_params in boards.items():
        design = board_design(key)
        verilog = verilog_of(board_params, f" ({key})")
        top = verilog[f"{TOP_MODULE}.v"]
        if has_interrupt(top, TOP_MODULE) != interrupt:
            raise InsituError(f"the top level of {key} and the reference top level differ in their "
                              f"{'interrupt'} port: one package_ip.tcl cannot package both")
        files[top_filename(key)] = top
        if board_params != params:
            for source in rtl_sources()[:-1]:
                files[board_suffixed(source.filename, key)] = verilog[source.filename]
        files[f"registers_{key}.md"] = markdown(board_params)
        files[f"registers_{key}.json"] = json.dumps(
            registers_json(board_params, interrupt, board=key), indent=2) + "\n"
        # Constraints the estimate of insitu.rtl.timing holds the design to (package_ip.tcl adds
        # them): the board's clock period.
        files[ooc_xdc_filename(key)] = xdc_clock_text(period_ns=1e9 / design.clock_hz)
        if exceptions:
            files[paths_xdc_filename(key)] = exceptions
        files[f"bd_{key}.tcl"] = block_design_tcl(key, interrupt)
        files[f"build_{key}.tcl"] = build_tcl(key)
    return files


def manifest(files: dict[str, str], params: AcceleratorParams = DEFAULT_PARAMS,
             boards: dict[str, AcceleratorParams] | None = None) -> dict:
    from insitu import __version__

    from .vivado import BOARD_DESIGNS, board_design

    if boards is None:
        boards = {key: board_design(key).params for key in BOARD_DESIGNS}
    return {
        "generator": "insitu rtl generate",
        "insitu_version": __version__,
        "version": VERSION,
        "version_hex": f"{VERSION:#010x}",
        "vlnv": IP_VLNV,
        "top_module": TOP_MODULE,
        "stream_bits": STREAM_BITS,
        "addr_bits": ADDR_BITS,
        "params": asdict(params),
        "boards": {key: {"part": board_design(key).part, "clock_hz": board_design(key).clock_hz,
                         "params": asdict(p), "files": board_files(key, p, params)}
                   for key, p in boards.items()},
        "files": {name: {"sha256": _sha256(text), "bytes": len(text.encode())}
                  for name, text in sorted(files.items())},
    }


def _check_out_dir(out_dir: Path) -> None:
    from insitu.errors import UsageError

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output folder {out_dir} is an existing file; choose a folder")
    for parent in out_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"output folder {out_dir}: {parent} is a file, not a folder")
            break


def generate(out_dir, params: AcceleratorParams = DEFAULT_PARAMS,
             progress: Callable[[str], None] | None = None) -> dict:
    """Write the accelerator's files into ``out_dir`` (created if needed); returns a summary.

    ``progress`` is called with each Verilog file name before its (slow) conversion.
    The summary: ``out_dir``, ``files`` (names written, ``manifest.json`` last), ``version``,
    ``vlnv``, ``top_module``, ``boards`` (per board: part, clock_hz, params, its files).
    """
    from insitu.errors import InsituError
    from insitu.io import atomic_write

    from .vivado import BOARD_DESIGNS, board_design

    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    boards = {key: board_design(key).params for key in BOARD_DESIGNS}
    files = render(params, progress, boards)
    meta = manifest(files, params, boards)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            atomic_write(out_dir / name, text)
        atomic_write(out_dir / "manifest.json", json.dumps(meta, indent=2) + "\n")
    except OSError as exc:
        raise InsituError(f"cannot write into {out_dir}: {exc.strerror or exc}") from None
    return {"out_dir": str(out_dir), "files": [*files, "manifest.json"], "version": VERSION,
            "version_hex": f"{VERSION:#010x}", "vlnv": IP_VLNV, "top_module": TOP_MODULE,
            "boards": meta["boards"]}
