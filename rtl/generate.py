"""``insitu rtl generate``: the Verilog, register map and Vivado scripts of the accelerator.

:func:`generate` writes into one folder:

* ``pe1.v``, ``pe2.v``, ``pe3.v``, ``pe_lrt.v``: each PE on its own (simulation, synthesis
  estimates); ``insitu_accel.v``: the Vivado-facing top level with the PEs inside it, the one file
  the IP is packaged from;
* ``registers.md`` and ``registers.json``: the register map for people and for drivers;
* ``package_ip.tcl``, ``bd_<board>.tcl``, ``build_<board>.tcl``: see :mod:`insitu.rtl.vivado`;
* ``manifest.json``: every file with its SHA-256, the register map VERSION, the parameters and
  the IP's VLNV.

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

from insitu.accel.params import (CLOCK_HZ, DEFAULT_PARAMS, IP_VLNV, STREAM_BITS, STREAM_WORDS, TOP_MODULE,
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


def registers_json(params: AcceleratorParams = DEFAULT_PARAMS, interrupt: bool = False) -> dict:
    """The register map as data: what a driver needs to talk to this bitstream."""
    from .vivado import BOARD_DESIGNS, address_map

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
        "clock_hz": CLOCK_HZ,
        "interrupt": interrupt,
        "boards": {key: address_map(key, interrupt) for key in BOARD_DESIGNS},
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render(params: AcceleratorParams = DEFAULT_PARAMS, progress: Callable[[str], None] | None = None,
           ) -> dict[str, str]:
    """Every file's text, in memory: file name -> text (without ``manifest.json``)."""
    from insitu.errors import InsituError

    from .timing import xdc_clock_text, xdc_exceptions_text
    from .vivado import check_top_ports, has_interrupt, tcl_files

    missing = missing_sources()
    if missing:
        raise InsituError(f"cannot generate the RTL: module(s) {', '.join(missing)} missing from "
                          "this installation")
    files: dict[str, str] = {}
    for source in rtl_sources():
        if progress:
            progress(source.filename)
        component = source.build(params)
        files[source.filename] = to_verilog(component, source.verilog_name)
    top = files[f"{TOP_MODULE}.v"]
    problems = check_top_ports(top, TOP_MODULE)
    if problems:
        raise InsituError(f"the top level {TOP_MODULE} does not match the Vivado packaging "
                          f"(insitu.rtl.vivado.top_ports): {'; '.join(problems)}")
    interrupt = has_interrupt(top, TOP_MODULE)
    files["registers.md"] = markdown(params)
    files["registers.json"] = json.dumps(registers_json(params, interrupt), indent=2) + "\n"
    files.update(tcl_files(interrupt))
    # Constraints the estimate of insitu.rtl.timing holds the design to (package_ip.tcl adds them).
    files[f"{TOP_MODULE}_ooc.xdc"] = xdc_clock_text()
    exceptions = xdc_exceptions_text()
    if exceptions:
        files[f"{TOP_MODULE}.xdc"] = exceptions
    return files


def manifest(files: dict[str, str], params: AcceleratorParams = DEFAULT_PARAMS) -> dict:
    from insitu import __version__

    return {
        "generator": "insitu rtl generate",
        "insitu_version": __version__,
        "version": VERSION,
        "version_hex": f"{VERSION:#010x}",
        "vlnv": IP_VLNV,
        "top_module": TOP_MODULE,
        "clock_hz": CLOCK_HZ,
        "stream_bits": STREAM_BITS,
        "addr_bits": ADDR_BITS,
        "params": asdict(params),
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
    ``vlnv``, ``top_module``.
    """
    from insitu.errors import InsituError
    from insitu.io import atomic_write

    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    files = render(params, progress)
    meta = manifest(files, params)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            atomic_write(out_dir / name, text)
        atomic_write(out_dir / "manifest.json", json.dumps(meta, indent=2) + "\n")
    except OSError as exc:
        raise InsituError(f"cannot write into {out_dir}: {exc.strerror or exc}") from None
    return {"out_dir": str(out_dir), "files": [*files, "manifest.json"], "version": VERSION,
            "version_hex": f"{VERSION:#010x}", "vlnv": IP_VLNV, "top_module": TOP_MODULE}
