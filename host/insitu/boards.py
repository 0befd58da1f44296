"""Boards and their simulated twins, described by one TOML file each in ``boards/``.

A real board file states the board's kind and resources; a twin file (``<board>-sim``) names the
board it stands in for with ``twin_of`` and takes its resources from that board's file, so a
figure is never written twice. The schema below is the only description of what a board file may
hold: an unknown key is an error too (it is usually a typo).

An FPGA board also fixes the accelerator built for it: ``[fpga] pl_clock_hz`` is the PL clock the
design is generated, constrained and timed for (``dram_bus_bits`` and ``dram_mt_per_s`` describe
the DRAM its streams come from: :func:`dram_bytes_per_s`), and the optional ``[accelerator]`` table
overrides fields of :class:`insitu.accel.params.AcceleratorParams` (its generate-time bounds,
e.g. ``pe3_batch_lanes = 2``); :func:`accelerator_params` is that board's (or its twin's)
parameter set, :func:`pl_clock_hz` its clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from insitu.accel.params import AcceleratorParams
from insitu.errors import BoardFileError, UsageError
from insitu.io import tomllib
from insitu.resources import package_dir

KINDS = ("fpga-soc", "mcu")

# section -> key -> (type, required). `None` as the section is the file's top level.
_TOP = {"name": (str, True), "kind": (str, False), "description": (str, True), "twin_of": (str, False)}
_SECTIONS = {
    "fpga": {"part": (str, True), "family": (str, True), "lut": (int, True), "ff": (int, True),
             "dsp": (int, True), "bram18": (int, True), "pl_clock_hz": (int, True),
             "dram_bus_bits": (int, True), "dram_mt_per_s": (int, True)},
    "mcu": {"part": (str, True), "sram_bytes": (int, True), "flash_bytes": (int, True),
            "training_budget_bytes": (int, True), "cycles_per_instruction": (float, False)},
    "processor": {"cpu": (str, True), "cpu_hz": (int, True)},
}
# Which sections each kind of real board must have.
_KIND_SECTIONS = {"fpga-soc": ("fpga", "processor"), "mcu": ("mcu", "processor")}
# The optional table of an FPGA board that overrides the accelerator's generate-time parameters:
# any field of AcceleratorParams but the two the RTL fixes (its lane and row counts).
ACCELERATOR_SECTION = "accelerator"
_FIXED_PARAMS = ("pe_rows", "c_lanes")
ACCELERATOR_KEYS = tuple(f.name for f in fields(AcceleratorParams) if f.name not in _FIXED_PARAMS)


@dataclass(frozen=True)
class Board:
    """One board or simulated twin, with its resources resolved."""

    name: str
    kind: str
    description: str
    twin_of: str | None
    sections: dict = field(repr=False)
    path: Path = field(repr=False)

    @property
    def is_twin(self) -> bool:
        return self.twin_of is not None

    @property
    def fpga(self) -> dict | None:
        return self.sections.get("fpga")

    @property
    def mcu(self) -> dict | None:
        return self.sections.get("mcu")

    @property
    def cpu_hz(self) -> int:
        return self.sections["processor"]["cpu_hz"]

    @property
    def accelerator_overrides(self) -> dict:
        """The board's ``[accelerator]`` table (its twin's: the real board's); empty for defaults."""
        return dict(self.sections.get(ACCELERATOR_SECTION, {}))

    def describe(self) -> dict:
        """The flat JSON view listed by ``insitu boards --json``."""
        out = {"name": self.name, "kind": self.kind, "twin_of": self.twin_of,
               "description": self.description}
        if self.fpga:
            out.update({k: self.fpga[k] for k in ("part", "lut", "ff", "dsp", "bram18", "pl_clock_hz",
                                                   "dram_bus_bits", "dram_mt_per_s")})
            out["accelerator"] = self.accelerator_overrides
        if self.mcu:
            out.update({k: self.mcu[k] for k in ("part", "sram_bytes", "flash_bytes",
                                                  "training_budget_bytes")})
        out["cpu"] = self.sections["processor"]["cpu"]
        out["cpu_hz"] = self.cpu_hz
        return out


def _check_keys(path: Path, where: str, table: dict, schema: dict, require: bool) -> None:
    for key, value in table.items():
        if key not in schema:
            raise BoardFileError(f"{path}: unknown key '{where}{key}' (allowed: {', '.join(schema)})")
        expected, _ = schema[key]
        # bool is an int in Python; a board file never means True by 1.
        if not isinstance(value, expected) or isinstance(value, bool):
            raise BoardFileError(f"{path}: key '{where}{key}' must be {expected.__name__}, "
                                 f"got {type(value).__name__} {value!r}")
        if expected is int and value <= 0:
            raise BoardFileError(f"{path}: key '{where}{key}' must be positive, got {value}")
    if require:
        for key, (_, required) in schema.items():
            if required and key not in table:
                raise BoardFileError(f"{path}: missing key '{where}{key}'")


def _check_accelerator(path: Path, table: dict) -> None:
    """The ``[accelerator]`` table: known AcceleratorParams fields, integers, a valid set."""
    for key, value in table.items():
        if key in _FIXED_PARAMS:
            raise BoardFileError(f"{path}: key '{ACCELERATOR_SECTION}.{key}' is fixed by the RTL "
                                 f"and cannot be set per board (allowed: {', '.join(ACCELERATOR_KEYS)})")
        if key not in ACCELERATOR_KEYS:
            raise BoardFileError(f"{path}: unknown key '{ACCELERATOR_SECTION}.{key}': not a "
                                 "parameter of the accelerator (insitu.accel.params.AcceleratorParams; "
                                 f"allowed: {', '.join(ACCELERATOR_KEYS)})")
        if not isinstance(value, int) or isinstance(value, bool):
            raise BoardFileError(f"{path}: key '{ACCELERATOR_SECTION}.{key}' must be int, "
                                 f"got {type(value).__name__} {value!r}")
    try:
        AcceleratorParams(**table)
    except ValueError as exc:
        raise BoardFileError(f"{path}: [{ACCELERATOR_SECTION}]: {exc}") from None


def _read(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise BoardFileError(f"{path}: not valid TOML: {exc}") from None
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    _check_keys(path, "", top, _TOP, require=True)
    for section, table in raw.items():
        if isinstance(table, dict):
            if section == ACCELERATOR_SECTION:
                _check_accelerator(path, table)
                continue
            if section not in _SECTIONS:
                raise BoardFileError(f"{path}: unknown section '[{section}]' "
                                     f"(allowed: {', '.join([*_SECTIONS, ACCELERATOR_SECTION])})")
            _check_keys(path, f"{section}.", table, _SECTIONS[section], require=True)
    if raw["name"] != path.stem:
        raise BoardFileError(f"{path}: key 'name' is {raw['name']!r} but the file is named "
                             f"{path.name}; they must match")
    return raw


def _resolve(raws: dict[str, tuple[Path, dict]]) -> dict[str, Board]:
    boards = {}
    for name, (path, raw) in raws.items():
        sections = {k: v for k, v in raw.items() if isinstance(v, dict)}
        twin_of = raw.get("twin_of")
        if twin_of is None:
            kind = raw.get("kind")
            if kind not in KINDS:
                raise BoardFileError(f"{path}: key 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
            for needed in _KIND_SECTIONS[kind]:
                if needed not in sections:
                    raise BoardFileError(f"{path}: a {kind} board needs a [{needed}] section")
            if ACCELERATOR_SECTION in sections and kind != "fpga-soc":
                raise BoardFileError(f"{path}: [{ACCELERATOR_SECTION}] is the FPGA accelerator's "
                                     f"parameters; a {kind} board has none")
        else:
            if twin_of not in raws or raws[twin_of][1].get("twin_of") is not None:
                raise BoardFileError(f"{path}: key 'twin_of' names {twin_of!r}, which is not a real "
                                     "board file in the same folder")
            if sections or "kind" in raw:
                raise BoardFileError(f"{path}: a twin takes 'kind' and resources from "
                                     f"{twin_of}.toml; remove them from this file")
            real_raw = raws[twin_of][1]
            kind = real_raw["kind"]
            sections = {k: v for k, v in real_raw.items() if isinstance(v, dict)}
        boards[name] = Board(name=name, kind=kind, description=raw["description"], twin_of=twin_of,
                             sections=sections, path=path)
    return boards


def load_boards(directory: Path | str | None = None) -> dict[str, Board]:
    """All boards described in ``directory`` (default: the shipped ``boards/``), by name."""
    return dict(_load_cached(str(Path(directory) if directory else package_dir("boards"))))


@lru_cache(maxsize=4)
def _load_cached(directory: str) -> tuple:
    raws = {}
    for path in sorted(Path(directory).glob("*.toml")):
        raws[path.stem] = (path, _read(path))
    return tuple(_resolve(raws).items())


def get_board(name: str, directory: Path | str | None = None) -> Board:
    """The board called ``name``; an unknown name is a usage error that lists the known ones."""
    boards = load_boards(directory)
    if name not in boards:
        raise UsageError(f"unknown board {name!r}; known boards: {', '.join(boards)}")
    return boards[name]


def twin_name(board: Board) -> str:
    """The name of the simulated twin that stands in for ``board`` (itself if it is a twin)."""
    return board.name if board.is_twin else f"{board.name}-sim"


def _board(board: Board | str) -> Board:
    return get_board(board) if isinstance(board, str) else board


def accelerator_params(board: Board | str) -> AcceleratorParams:
    """The accelerator parameters of an FPGA board or its twin (by name or :class:`Board`): the
    defaults of :class:`~insitu.accel.params.AcceleratorParams` with the board file's
    ``[accelerator]`` overrides. A board without an FPGA is a usage error."""
    board = _board(board)
    if board.fpga is None:
        raise UsageError(f"{board.name} has no FPGA: the accelerator runs on "
                         f"{', '.join(n for n, b in load_boards().items() if b.fpga)}")
    return AcceleratorParams(**board.accelerator_overrides)


def pl_clock_hz(board: Board | str) -> int:
    """The PL clock of an FPGA board or its twin (``[fpga] pl_clock_hz``), in Hz."""
    board = _board(board)
    if board.fpga is None:
        raise UsageError(f"{board.name} has no FPGA, so no PL clock")
    return board.fpga["pl_clock_hz"]


def dram_bytes_per_s(board: Board | str) -> float:
    """The peak rate of an FPGA board's DRAM (its twin's: the board's), both directions together:
    ``[fpga] dram_bus_bits / 8 * dram_mt_per_s`` million bytes a second. What the accelerator's
    streams move cannot go faster, whatever their width and clock."""
    board = _board(board)
    if board.fpga is None:
        raise UsageError(f"{board.name} has no FPGA, so no DRAM behind an accelerator")
    return board.fpga["dram_bus_bits"] / 8 * board.fpga["dram_mt_per_s"] * 1e6


def fpga_boards(directory: Path | str | None = None) -> dict[str, Board]:
    """The real FPGA boards (not their twins), by name: the boards an accelerator is built for."""
    return {name: b for name, b in load_boards(directory).items() if b.fpga and not b.is_twin}
