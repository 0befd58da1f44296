"""`insitu rtl timing`: a register-to-register timing estimate over the Yosys netlist.

Yosys' ``sta`` has no timing arcs for Xilinx cells after ``synth_xilinx``, and ``ltp -noff`` walks
through flip-flops, so this module walks the flattened netlist (``write_json``) itself:

* start points: clocked outputs (FF Q, block RAM data out, DSP outputs behind an enabled register,
  distributed RAM / SRL outputs after a write) and top-level inputs;
* end points: clocked inputs (FF D, CE, R/S and asynchronous CLR/PRE: a reset fan-out is a path
  like any other; block RAM address/data/enable; DSP inputs whose input register is on; LUT-RAM
  write ports) and top-level outputs;
* combinational arcs: LUTs, MUXF7/F8, CARRY4/CARRY8 bit by bit, DSPs by their register attributes,
  distributed RAM asynchronous reads;
* one topological longest-path pass (arrival time per net bit), so the cost is linear in the
  netlist; the worst path to each end point is traced back through its predecessors.

The delay model (:data:`MODELS`) is a first-order estimate, about ±30 %: a LUT level with its net,
a fan-out term for nets with many loads, and the primitive delays of the -1 speed grade. It is
documented in docs/rtl.md ("Timing estimate"). Exceptions (false or multicycle paths that are so by
construction) are declared once, in :data:`EXCEPTIONS`: the estimate honours them and
:func:`xdc_text` writes them as constraints.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter, defaultdict, deque
from dataclasses import asdict, dataclass, field, replace

from insitu.accel.params import CLOCK_HZ, DEFAULT_PARAMS, TOP_MODULE, AcceleratorParams

#: Parts, their Yosys family, and the board whose PL clock (boards/<board>.toml, pl_clock_hz) each
#: part's estimate is judged on.
PARTS = {"xc7z020": "xc7", "xczu3eg": "xcup"}
PART_BOARDS = {"xc7z020": "zedboard", "xczu3eg": "ultra96v2"}


def clock_period_ns(part: str) -> float:
    """The clock period (ns) of the board built on ``part``: its ``pl_clock_hz``."""
    from insitu.boards import get_board
    fpga = get_board(PART_BOARDS[part]).fpga
    assert fpga is not None
    return 1e9 / fpga["pl_clock_hz"]


BUDGET_NS = {part: clock_period_ns(part) for part in PARTS}
CLOCK_PERIOD_NS = 1e9 / CLOCK_HZ
#: The clock port of the top level (rtl/top.py AcceleratorTop, rtl/vivado.py CLOCK_PORT).
CLOCK_PORT = "aclk"


# ----------------------------------------------------------------------------- the delay model

@dataclass(frozen=True)
class DelayModel:
    """Delays in ns of one family at speed grade -1 (see docs/rtl.md, "Timing estimate")."""

    ff_clk_to_q: float = 0.46       # TCKO
    ff_setup_d: float = 0.10        # TDICK (the LUT in front is counted as a level)
    ff_setup_ce: float = 0.40       # TCECK
    ff_setup_sr: float = 0.45       # TSRCK; also the recovery time of asynchronous CLR/PRE
    lut: float = 0.12               # TILO
    net: float = 0.45               # a routed net of low fan-out: LUT + net = 0.57 per level
    fanout_free: int = 4            # loads a net drives before its delay grows
    fanout_per_doubling: float = 0.25   # extra net delay per doubling of the loads beyond that
    muxf: float = 0.30              # MUXF7 / MUXF8 (dedicated routes in and out of the slice)
    carry_entry: float = 0.40       # S/DI into a carry cell, through to its CO/O
    carry_stage: float = 0.115      # CI -> CO through one CARRY4 (4 bits)
    carry_sum: float = 0.25         # CI -> O (the XOR of a bit)
    dsp_mult: float = 4.20          # A/B -> P, multiplier and ALU, no register on the way
    dsp_to_mreg: float = 2.90       # A/B (or A/B register) -> M register: setup
    dsp_mreg_to_p: float = 1.90     # M register clock -> P (PREG = 0)
    dsp_areg_to_p: float = 4.00     # A/B register clock -> P (MREG = PREG = 0)
    dsp_to_preg_mult: float = 3.90  # A/B through the multiplier -> P register: setup (MREG = 0)
    dsp_alu: float = 1.90           # C / PCIN / control -> P, PREG = 0
    dsp_to_preg_alu: float = 1.50   # C / PCIN / control / M -> P register: setup
    dsp_preg_to_p: float = 0.65     # P register clock -> P
    dsp_in_setup: float = 0.35      # into an enabled input register (A, B, C, D, control)
    dsp_ctrl_setup: float = 0.50    # CE / RST pins
    bram_clk_to_out: float = 2.45   # TRCKO_DO, no output register
    bram_clk_to_out_reg: float = 0.90   # with DO_REG = 1
    bram_setup: float = 0.60        # address / data / write and port enables
    lutram_clk_to_out: float = 1.10     # WCLK -> O after a write (TSHCKO)
    lutram_setup: float = 0.70      # write address / data / enable
    io_buffer: float = 0.0          # IBUF/OBUF: the ports are inside the FPGA (block design)

    def scaled(self, factor: float) -> "DelayModel":
        return replace(self, **{k: v * factor for k, v in asdict(self).items() if isinstance(v, float)})


#: xc7 (Zynq-7000 -1) is the issue's model; UltraScale+ -1 is about 0.6x of it.
XCUP_SCALE = 0.6
MODELS = {"xc7": DelayModel(), "xcup": DelayModel().scaled(XCUP_SCALE)}


# ----------------------------------------------------------------------------- exceptions

@dataclass(frozen=True)
class PathException:
    """A false path (``cycles=None``) or a multicycle path of ``cycles`` clock periods, from start
    registers whose name matches ``start`` to end registers matching ``end`` (glob patterns on
    the Amaranth hierarchical names as the netlist keeps them, e.g. ``accel.pe3.cfg_*``)."""

    start: str
    end: str = "*"
    cycles: int | None = None
    reason: str = ""

    def matches_start(self, name: str) -> bool:
        return _glob(name, self.start)

    def matches_end(self, name: str) -> bool:
        return _glob(name, self.end)


#: THE list of timing exceptions of the accelerator: the estimate honours it and xdc_text() writes
#: it. Only paths that are false or multicycle by construction belong here, never a blanket one.
EXCEPTIONS: list[PathException] = []


def _glob(name: str, pattern: str) -> bool:
    base = name.split("[", 1)[0]
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(base, pattern)


def _vivado_pattern(pattern: str) -> str:
    # Amaranth's hierarchy `accel.pe3.x` is Vivado's `accel/pe3/x_reg[...]` inside the IP.
    return "*" + pattern.replace(".", "/") + ("" if pattern.endswith("*") else "_reg*")


def xdc_clock_text(clock_port: str = CLOCK_PORT, period_ns: float = CLOCK_PERIOD_NS) -> str:
    """The IP's out-of-context clock: the period its own synthesis and the estimate are held to.
    In a block design the clock comes from the processing system, whose IP constrains it."""
    return ("# Generated by insitu.rtl.timing: the accelerator's clock for out-of-context runs\n"
            f"create_clock -period {period_ns:.3f} -name {clock_port} [get_ports {clock_port}]\n")


def xdc_exceptions_text(exceptions: list[PathException] | None = None) -> str:
    """The declared false and multicycle paths as XDC (empty when there are none)."""
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    if not exceptions:
        return ""
    lines = ["# Generated by insitu.rtl.timing (exceptions: insitu.rtl.timing.EXCEPTIONS)"]
    for e in exceptions:
        src = f"[get_cells -hierarchical -filter {{NAME =~ {_vivado_pattern(e.start)}}}]"
        dst = f"[get_cells -hierarchical -filter {{NAME =~ {_vivado_pattern(e.end)}}}]"
        to = "" if e.end == "*" else f" -to {dst}"
        if e.reason:
            lines.append(f"# {e.reason}")
        if e.cycles is None:
            lines.append(f"set_false_path -from {src}{to}")
        else:
            lines.append(f"set_multicycle_path {e.cycles} -setup -from {src}{to}")
            lines.append(f"set_multicycle_path {e.cycles - 1} -hold -from {src}{to}")
    return "\n".join(lines) + "\n"


def xdc_text(exceptions: list[PathException] | None = None, clock_port: str = CLOCK_PORT,
             period_ns: float = CLOCK_PERIOD_NS) -> str:
    """The XDC of the accelerator alone: its clock and the declared exceptions."""
    return xdc_clock_text(clock_port, period_ns) + xdc_exceptions_text(exceptions)


# ----------------------------------------------------------------------------- the netlist

_CLOCK_PINS = {"C", "CLK", "WCLK", "CLKARDCLK", "CLKBWRCLK", "CLKA", "CLKB"}
_FF = {"FDRE": "R", "FDSE": "S", "FDCE": "CLR", "FDPE": "PRE"}
_LUTS = {"LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "LUT6_2", "INV"}
_BUFFERS = {"IBUF", "OBUF", "BUFG", "IBUFG", "OBUFT", "BUF"}
_LUTRAM_WRITE_ADDR = {"RAM32M": "ADDRD", "RAM64M": "ADDRD", "RAM32M16": "ADDRH", "RAM64M8": "ADDRH"}
_IGNORED = {"$scopeinfo", "VCC", "GND"}


def _param(cell: dict, name: str, default: int | str = 0) -> int | str:
    value = cell.get("parameters", {}).get(name)
    if value is None:
        return default
    if isinstance(value, int):
        return value
    if re.fullmatch(r"[01]+", value):
        return int(value, 2)
    return value.strip()


def _strip(name: str) -> str:
    return name.replace("\\", "")


@dataclass
class _Cell:
    name: str
    type: str
    cell: dict
    inputs: dict[str, list] = field(default_factory=dict)   # pin -> bits (ints or "0"/"1")
    outputs: dict[str, list] = field(default_factory=dict)


class Netlist:
    """The top module of a Yosys JSON netlist: cells, drivers and loads of every net bit, and the
    best Amaranth name of each bit."""

    def __init__(self, data: dict, top: str | None = None, verilog: str | None = None):
        modules = data.get("modules", data)
        if top is None:
            top = next((n for n, m in modules.items() if int(m.get("attributes", {}).get("top", "0") or 0)),
                       next(iter(modules)))
        mod = modules[top]
        self.top = top
        self.cells: list[_Cell] = []
        for name, cell in mod.get("cells", {}).items():
            if cell["type"] in _IGNORED:
                continue
            c = _Cell(name, cell["type"], cell)
            dirs = cell.get("port_directions", {})
            for pin, bits in cell.get("connections", {}).items():
                (c.outputs if dirs.get(pin) == "output" else c.inputs)[pin] = bits
            self.cells.append(c)
        self.inputs: dict[str, list] = {}
        self.outputs: dict[str, list] = {}
        for name, port in mod.get("ports", {}).items():
            (self.inputs if port["direction"] == "input" else self.outputs)[name] = port["bits"]
        self.driver: dict[int, tuple[int, str, int]] = {}      # bit -> (cell index, pin, bit index)
        self.loads: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for ci, c in enumerate(self.cells):
            for pin, bits in c.outputs.items():
                for k, b in enumerate(bits):
                    if isinstance(b, int):
                        self.driver[b] = (ci, pin, k)
            for pin, bits in c.inputs.items():
                if pin in _CLOCK_PINS:
                    continue
                for b in bits:
                    if isinstance(b, int):
                        self.loads[b].append((ci, pin))
        for bits in self.outputs.values():
            for b in bits:
                if isinstance(b, int):
                    self.loads[b].append((-1, "port"))
        self.names = self._bit_names(mod.get("netnames", {}), verilog.splitlines() if verilog else [])
        self._prefix = self._common_prefix()

    @staticmethod
    def _bit_names(netnames: dict, verilog: list[str]) -> dict[int, str]:
        """The most telling public name of each bit: Amaranth's hierarchical names survive
        flattening as ``accel.pe3.in_beats``; prefer a name that is not an input port of its
        module (the signal lives in a parent: the Verilog line of its declaration tells), then
        the deepest (the register's own module); avoid the generic ``rst``/``clk`` ports of a
        submodule and Yosys' ``$N`` renamings. A name known only as an input port is marked."""
        best: dict[int, tuple[tuple, str]] = {}
        for name, net in netnames.items():
            if net.get("hide_name") or name.startswith("$"):
                continue
            name = _strip(name)
            last = name.rsplit(".", 1)[-1]
            m = re.match(r"design\.v:(\d+)\.", net.get("attributes", {}).get("src", ""))
            line = int(m.group(1)) - 1 if m else -1
            is_input = "." in name and 0 <= line < len(verilog) and verilog[line].lstrip().startswith("input")
            if is_input:
                name += "(input)"
            score = (not is_input, last not in ("rst", "clk"), "$" not in name, name.count("."), -len(name))
            bits = net["bits"]
            for k, b in enumerate(bits):
                if not isinstance(b, int):
                    continue
                label = name if len(bits) == 1 else f"{name}[{k}]"
                if b not in best or score > best[b][0]:
                    best[b] = (score, label)
        return {b: label for b, (_, label) in best.items()}

    def _common_prefix(self) -> list[str]:
        # The wrapper every hierarchical name shares (AcceleratorTop's `accel`): not a module.
        paths = [n.split("[", 1)[0].split(".")[:-1] for n in self.names.values() if "." in n]
        if not paths:
            return []
        prefix = paths[0]
        for p in paths[1:]:
            k = 0
            while k < min(len(prefix), len(p)) and prefix[k] == p[k]:
                k += 1
            prefix = prefix[:k]
            if not prefix:
                break
        return prefix

    def name(self, bit) -> str | None:
        return self.names.get(bit) if isinstance(bit, int) else None

    def module_of_name(self, name: str) -> str:
        """The submodule of the top a hierarchical name belongs to (`pe3`), else `top`."""
        parts = name.split("[", 1)[0].split(".")[:-1]
        n = len(self._prefix)
        if parts[:n] == self._prefix and len(parts) > n:
            return parts[n]
        return "top"

    def fanout(self, bit) -> int:
        return len(self.loads.get(bit, ()))

    def cell_label(self, ci: int) -> str:
        """A readable name of a cell: its first named output, else its cleaned Yosys name."""
        c = self.cells[ci]
        if c.type.startswith("IBUF"):           # a top-level input: the port's name
            return next((n for bits in c.inputs.values() for b in bits if (n := self.name(b))), c.name)
        for pin in ("Q", "P", "O", *c.outputs):
            for b in c.outputs.get(pin, ()):
                n = self.name(b)
                if n:
                    return n
        m = re.match(r"\$flatten\\(.*?)\.\$", c.name)
        return _strip(m.group(1)) + f".<{c.type}>" if m else _strip(c.name)

    def cell_modules(self) -> list[str]:
        """The submodule of every cell. abc's LUTs and the mapped flip-flops lose their hierarchy
        in their names, so a cell takes the module of its named outputs, else (nearest first) that
        of the cells it drives, else that of its drivers."""
        labels: list[str | None] = [None] * len(self.cells)
        for ci, c in enumerate(self.cells):
            m = re.match(r"\$flatten\\(.*?)\.\$", c.name)
            if m:
                labels[ci] = self.module_of_name(_strip(m.group(1)) + ".x")
                continue
            names = [self.name(b) for bits in c.outputs.values() for b in bits]
            mods = Counter(self.module_of_name(n) for n in names if n)
            if mods:
                labels[ci] = mods.most_common(1)[0][0]
        for direction in ("loads", "drivers"):
            for _ in range(64):
                changed = False
                for ci, c in enumerate(self.cells):
                    if labels[ci] is not None:
                        continue
                    votes: Counter = Counter()
                    if direction == "loads":
                        for bits in c.outputs.values():
                            for b in bits:
                                for li, _pin in self.loads.get(b, ()):
                                    if li >= 0 and labels[li] is not None:
                                        votes[labels[li]] += 1
                    else:
                        for pin, bits in c.inputs.items():
                            for b in bits:
                                d = self.driver.get(b) if isinstance(b, int) else None
                                if d and labels[d[0]] is not None:
                                    votes[labels[d[0]]] += 1
                    if votes:
                        labels[ci] = votes.most_common(1)[0][0]
                        changed = True
                if not changed:
                    break
        return [label or "top" for label in labels]


# ----------------------------------------------------------------------------- timing of cells

@dataclass
class _CellTiming:
    arcs: list = field(default_factory=list)    # (in pin, in index|None, out pin, out index|None, ns)
    starts: list = field(default_factory=list)  # (out pin, ns clock-to-out)
    ends: list = field(default_factory=list)    # (in pin, ns setup)
    level: bool = True                          # counts as a logic level on a path


def _carry_timing(c: _Cell, m: DelayModel, width: int) -> _CellTiming:
    t = _CellTiming()
    stage = m.carry_stage * (width / 4)         # a CARRY8 is two CARRY4 stages long
    per_bit = stage / width
    for cin in ("CI", "CYINIT", "CI_TOP"):
        if cin in c.inputs:
            for j in range(width):
                t.arcs.append((cin, None, "CO", j, per_bit * (j + 1)))
                t.arcs.append((cin, None, "O", j, per_bit * j + m.carry_sum))
    for pin in ("S", "DI"):
        for i in range(len(c.inputs.get(pin, ()))):
            t.arcs.append((pin, i, "O", i, m.carry_sum))
            for j in range(i, width):
                t.arcs.append((pin, i, "CO", j, m.carry_entry + per_bit * (j - i)))
                if j > i:
                    t.arcs.append((pin, i, "O", j, m.carry_entry + per_bit * (j - i)))
    return t


_DSP_MULT_INPUTS = {"A": "AREG", "B": "BREG", "D": "DREG", "ACIN": "AREG", "BCIN": "BREG"}
_DSP_ALU_INPUTS = {"C": "CREG", "PCIN": None, "OPMODE": "OPMODEREG", "ALUMODE": "ALUMODEREG",
                   "CARRYIN": "CARRYINREG", "CARRYINSEL": "CARRYINSELREG", "INMODE": "INMODEREG",
                   "CARRYCASCIN": None, "MULTSIGNIN": None}


def _dsp_timing(c: _Cell, m: DelayModel) -> _CellTiming:
    """A DSP48E1/E2 by its register attributes: an input pin either ends a path (its register is
    on) or runs to the next register inside (M, then P) or, with none, through to the outputs."""
    t = _CellTiming()
    mult = _param(c.cell, "USE_MULT", "MULTIPLY") != "NONE"
    mreg, preg = bool(_param(c.cell, "MREG", 1)) and mult, bool(_param(c.cell, "PREG", 1))
    outs = [p for p in c.outputs]
    in_regs = False
    for pin in c.inputs:
        reg = _DSP_MULT_INPUTS.get(pin) or _DSP_ALU_INPUTS.get(pin)
        through_mult = pin in _DSP_MULT_INPUTS and mult
        if pin.startswith(("CE", "RST")):
            t.ends.append((pin, m.dsp_ctrl_setup))
        elif reg and _param(c.cell, reg, 1):
            t.ends.append((pin, m.dsp_in_setup))
            in_regs |= through_mult
        elif through_mult and mreg:
            t.ends.append((pin, m.dsp_to_mreg))
        elif preg:
            t.ends.append((pin, m.dsp_to_preg_mult if through_mult else m.dsp_to_preg_alu))
        else:
            for out in outs:
                t.arcs.append((pin, None, out, None, m.dsp_mult if through_mult else m.dsp_alu))
    # Clock-to-out of the last register before the outputs.
    if preg:
        tco = m.dsp_preg_to_p
    elif mreg:
        tco = m.dsp_mreg_to_p
    elif in_regs:
        tco = m.dsp_areg_to_p
    else:
        tco = None
    if tco is not None:
        t.starts += [(out, tco) for out in outs]
    return t


def _lutram_timing(c: _Cell, m: DelayModel) -> _CellTiming:
    """Distributed RAM and SRLs: asynchronous reads through the LUT (plus F7/F8 muxes for the deep
    ones), synchronous writes (end points), outputs that change after a write (start points)."""
    t = _CellTiming()
    digits = re.search(r"\d+", c.type)
    depth = int(digits.group(0)) if digits else 64
    read = m.lut + (m.muxf if depth >= 128 else 0) + (m.muxf if depth >= 256 else 0)
    write_addr = _LUTRAM_WRITE_ADDR.get(c.type)
    for pin in c.inputs:
        address = pin.startswith(("A", "DPRA", "ADDR"))
        if address:
            for out in c.outputs:
                t.arcs.append((pin, None, out, None, read))
        # Write ports: data, enable, and the write address (not the read-only ports).
        is_write_addr = address and not pin.startswith("DPRA") and (
            pin == write_addr if write_addr else not pin.startswith("ADDR") or pin == "ADDR")
        if not address or is_write_addr:
            t.ends.append((pin, m.lutram_setup))
    t.starts += [(out, m.lutram_clk_to_out) for out in c.outputs]
    return t


def _bram_timing(c: _Cell, m: DelayModel) -> _CellTiming:
    t = _CellTiming(level=False)
    for pin in c.inputs:
        t.ends.append((pin, m.bram_setup))
    for out in c.outputs:
        port_a = re.match(r"(DOA|DOUTA|DOPA|DOUTPA|CASDOUTA|CASDOUTPA)", out) is not None
        reg = _param(c.cell, "DOA_REG" if port_a else "DOB_REG", 0)
        t.starts.append((out, m.bram_clk_to_out_reg if reg else m.bram_clk_to_out))
    return t


def cell_timing(c: _Cell, m: DelayModel) -> _CellTiming:
    kind = c.type
    if kind in _FF:
        return _CellTiming(starts=[("Q", m.ff_clk_to_q)], level=False,
                           ends=[("D", m.ff_setup_d), ("CE", m.ff_setup_ce), (_FF[kind], m.ff_setup_sr)])
    if kind in _LUTS:
        return _CellTiming(arcs=[(pin, None, out, None, m.lut) for pin in c.inputs for out in c.outputs])
    if kind in ("MUXF7", "MUXF8", "MUXF9"):
        return _CellTiming(arcs=[(pin, None, "O", None, m.muxf) for pin in c.inputs])
    if kind == "CARRY4":
        return _carry_timing(c, m, 4)
    if kind == "CARRY8":
        return _carry_timing(c, m, 8)
    if kind in ("DSP48E1", "DSP48E2"):
        return _dsp_timing(c, m)
    if kind.startswith("RAMB"):
        return _bram_timing(c, m)
    if kind.startswith(("RAM", "SRL")):
        return _lutram_timing(c, m)
    if kind in _BUFFERS:
        # IBUF: the port is a start point; OBUF: an end point; BUFG: the clock (not data).
        if kind.startswith("IBUF"):
            return _CellTiming(starts=[(out, m.io_buffer) for out in c.outputs], level=False)
        if kind.startswith("OBUF"):
            return _CellTiming(ends=[(pin, m.io_buffer) for pin in c.inputs], level=False)
        return _CellTiming(level=False)
    # Anything else: one LUT level per input-output pair (pessimistic, and listed in the result).
    return _CellTiming(arcs=[(pin, None, out, None, m.lut) for pin in c.inputs for out in c.outputs])


_KNOWN = _LUTS | set(_FF) | _BUFFERS | {"MUXF7", "MUXF8", "MUXF9", "CARRY4", "CARRY8", "DSP48E1", "DSP48E2"}

# Dedicated routes: no general-purpose net between these pins.
_DEDICATED_LOADS = {"CI", "PCIN", "ACIN", "BCIN", "CARRYCASCIN", "MULTSIGNIN", "CASDINA", "CASDINB"}


# ----------------------------------------------------------------------------- the analysis

@dataclass
class _Graph:
    arrival_start: dict          # node -> (clock-to-out ns, start cell index)
    edges: dict                  # node -> [(dst node, ns, cell index)]
    ends: list                   # (node or None, ns after the node's arrival, cell index, pin, bit)
    levels: dict                 # cell index -> counts as a logic level


def _build_graph(net: Netlist, model: DelayModel, unknown: Counter) -> _Graph:
    starts: dict = {}
    edges: dict = defaultdict(list)
    ends: list = []
    levels: dict = {}
    wire_cache: dict = {}

    # LUT -> MUXF7 -> MUXF8 stay inside the slice: no routed net where a bit feeds F-muxes only.
    mux_only = {bit for bit, loads in net.loads.items()
                if loads and all(li >= 0 and net.cells[li].type.startswith("MUXF") for li, _ in loads)}

    def wire(bit, pin) -> float:
        if pin in _DEDICATED_LOADS or bit in mux_only:
            return 0.0
        if bit not in wire_cache:
            n = net.fanout(bit)
            extra = model.fanout_per_doubling * max(0.0, math.log2(max(n, 1) / model.fanout_free))
            wire_cache[bit] = model.net + extra
        return wire_cache[bit]

    virtual = -1
    for ci, c in enumerate(net.cells):
        t = cell_timing(c, model)
        levels[ci] = t.level
        if c.type not in _KNOWN and not c.type.startswith(("RAM", "SRL")):
            unknown[c.type] += 1
        for pin, tco in t.starts:
            for b in c.outputs.get(pin, ()):
                if isinstance(b, int):
                    starts[b] = (tco, ci)
        for pin, setup in t.ends:
            for k, b in enumerate(c.inputs.get(pin, ())):
                if isinstance(b, int):
                    ends.append((b, wire(b, pin) + setup, ci, pin, k))
        # Arcs from every bit of a bus to every bit of another go through one virtual node.
        grouped = defaultdict(list)
        for arc in t.arcs:
            ipin, ii, opin, oi, ns = arc
            if ii is None and oi is None:
                grouped[(ipin, ns)].append(opin)
            else:
                in_bits = c.inputs.get(ipin, ())
                out_bits = c.outputs.get(opin, ())
                srcs = in_bits if ii is None else in_bits[ii:ii + 1]
                dsts = out_bits if oi is None else out_bits[oi:oi + 1]
                for s in srcs:
                    if isinstance(s, int):
                        for d in dsts:
                            if isinstance(d, int):
                                edges[s].append((d, wire(s, ipin) + ns, ci))
        by_outputs = defaultdict(list)
        for (ipin, ns), opins in grouped.items():
            by_outputs[(tuple(sorted(set(opins))), ns)].append(ipin)
        for (opins, ns), ipins in by_outputs.items():
            out_bits = [b for p in opins for b in c.outputs.get(p, ()) if isinstance(b, int)]
            in_bits = [(b, p) for p in ipins for b in c.inputs.get(p, ()) if isinstance(b, int)]
            if len(in_bits) * len(out_bits) <= 16:
                for s, p in in_bits:
                    for d in out_bits:
                        edges[s].append((d, wire(s, p) + ns, ci))
                continue
            v, virtual = virtual, virtual - 1
            for s, p in in_bits:
                edges[s].append((v, wire(s, p) + ns, ci))
            for d in out_bits:
                edges[v].append((d, 0.0, ci))
    for bits in net.inputs.values():
        for b in bits:
            if isinstance(b, int) and b not in starts:
                starts[b] = (0.0, -1)
    for name, bits in net.outputs.items():
        for k, b in enumerate(bits):
            if isinstance(b, int):
                ends.append((b, 0.0, -1, name, k))
    return _Graph(starts, edges, ends, levels)


def _propagate(g: _Graph, allowed_start=None):
    """Longest arrival per node from the (allowed) start points, in topological order."""
    indeg: Counter = Counter()
    for src, outs in g.edges.items():
        for dst, _, _ in outs:
            indeg[dst] += 1
    arrival: dict = {}
    pred: dict = {}
    for node, (tco, ci) in g.arrival_start.items():
        if allowed_start is None or allowed_start(node):
            arrival[node] = tco
    nodes = set(g.edges) | set(indeg) | set(g.arrival_start)
    queue = deque(n for n in nodes if indeg[n] == 0)
    seen = 0
    while queue:
        n = queue.popleft()
        seen += 1
        a = arrival.get(n)
        for dst, ns, ci in g.edges.get(n, ()):
            if a is not None and (dst not in arrival or a + ns > arrival[dst]):
                arrival[dst] = a + ns
                pred[dst] = (n, ci)
            indeg[dst] -= 1
            if indeg[dst] == 0:
                queue.append(dst)
    loops = len(nodes) - seen            # nodes on combinational loops (left unresolved)
    return arrival, pred, loops


@dataclass
class _Path:
    ns: float
    start: str
    end: str
    end_pin: str
    nodes: list
    cells: list
    cycles: int = 1


def _trace(net: Netlist, g: _Graph, pred: dict, node, end_ci: int, end_pin: str, end_bit: int,
           ns: float) -> _Path:
    nodes, cells = [node], []
    while node in pred:
        node, ci = pred[node]
        nodes.append(node)
        if not cells or cells[-1] != ci:
            cells.append(ci)
    nodes.reverse()
    cells.reverse()
    start = _start_name(net, g, nodes[0])
    if end_ci < 0:
        end, pin = f"{end_pin}[{end_bit}]", "port"
    else:
        end, pin = net.cell_label(end_ci), f"{net.cells[end_ci].type}.{end_pin}"
    return _Path(ns, start, end, pin, nodes, cells)


def _start_name(net: Netlist, g: _Graph, node) -> str:
    _, ci = g.arrival_start.get(node, (0.0, -1))
    if ci >= 0 and net.cells[ci].type.startswith("IBUF"):
        return net.cell_label(ci)
    return net.name(node) or (net.cell_label(ci) if ci >= 0 else "?")


def analyze(netlist, family: str, *, budget_ns: float = CLOCK_PERIOD_NS, paths: int = 15,
            exceptions: list[PathException] | None = None, model: DelayModel | None = None,
            top: str | None = None) -> dict:
    """Worst path per end point of a netlist (Yosys JSON dict or :class:`Netlist`)."""
    net = netlist if isinstance(netlist, Netlist) else Netlist(netlist, top)
    model = model or MODELS[family]
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    unknown: Counter = Counter()
    g = _build_graph(net, model, unknown)
    arrival, pred, loops = _propagate(g)

    # The start point of each node's worst path, found lazily for end points that need it.
    def start_of(node):
        while node in pred:
            node = pred[node][0]
        return node

    results = []                 # (equivalent single-cycle ns, _Path builder args)
    reruns: dict = {}
    for node, after, ci, pin, bit in g.ends:
        if node not in arrival:
            continue
        ns = arrival[node] + after
        rules = []
        if exceptions:
            end_name = net.cell_label(ci) if ci >= 0 else f"{pin}[{bit}]"
            rules = [e for e in exceptions if e.matches_end(end_name)]
        if rules and any(e.matches_start(_start_name(net, g, start_of(node))) for e in rules):
            # The worst path is an exception: the worst of the other start points counts, and a
            # multicycle path counts as its delay over its cycles.
            best = None
            for idx, e in enumerate(exceptions):
                if e not in rules:
                    continue
                if idx not in reruns:
                    reruns[idx] = (
                        _propagate(g, lambda n, e=e: not e.matches_start(_start_name(net, g, n))),
                        _propagate(g, lambda n, e=e: e.matches_start(_start_name(net, g, n)))
                        if e.cycles else None)
                (arr_o, pred_o, _), mc = reruns[idx]
                if node in arr_o:
                    cand = (arr_o[node] + after, 1, pred_o)
                    best = cand if best is None or cand[0] > best[0] else best
                if mc is not None and node in mc[0]:
                    cand = ((mc[0][node] + after) / e.cycles, e.cycles, mc[1], mc[0][node] + after)
                    best = cand if best is None or cand[0] > best[0] else best
            if best is None:
                continue
            results.append((best[0], node, ci, pin, bit, best[2], best[1],
                            best[3] if len(best) > 3 else best[0]))
        else:
            results.append((ns, node, ci, pin, bit, pred, 1, ns))

    results.sort(key=lambda r: -r[0])
    over_budget = sum(r[0] > budget_ns for r in results)
    # Where the endpoints over budget are: the worst path lists only the worst few groups.
    modules = net.cell_modules()
    by_module: dict[str, dict] = {}
    for eq_ns, _node, ci, *_ in results:
        entry = by_module.setdefault(modules[ci] if ci >= 0 else "top",
                                     {"worst_ns": 0.0, "endpoints": 0, "over_budget_endpoints": 0})
        entry["worst_ns"] = max(entry["worst_ns"], round(eq_ns, 3))
        entry["endpoints"] += 1
        entry["over_budget_endpoints"] += eq_ns > budget_ns
    over_clock = sum(r[0] > CLOCK_PERIOD_NS for r in results)

    # The N worst distinct paths by name: one per (end signal, pin kind, start signal), all bits.
    groups: dict = {}
    for eq_ns, node, ci, pin, bit, p, cycles, real_ns in results:
        path = _trace(net, g, p, node, ci, pin, bit, real_ns)
        key = (path.end.split("[", 1)[0], path.end_pin, path.start.split("[", 1)[0])
        if key in groups:
            groups[key]["bits"] += 1
            groups[key]["bits_over_budget"] += eq_ns > budget_ns
            continue
        if len(groups) >= paths:
            # Enough groups: the remaining results only add to existing counts (checked above).
            continue
        groups[key] = {"ns": round(real_ns, 3), "cycles": cycles, "start": path.start, "end": path.end,
                       "end_pin": path.end_pin,
                       "levels": sum(1 for c in path.cells if c >= 0 and g.levels.get(c, True)
                                     and net.cells[c].type not in _FF),
                       "nets": _named(net, path.nodes),
                       "cells": [net.cells[c].type for c in path.cells if c >= 0],
                       "bits": 1, "bits_over_budget": int(eq_ns > budget_ns)}
    return {
        "family": family, "budget_ns": budget_ns, "clock_ns": CLOCK_PERIOD_NS,
        "worst_ns": round(results[0][0], 3) if results else 0.0,
        "endpoints": len(results), "over_budget_endpoints": over_budget,
        "over_clock_endpoints": over_clock,
        "by_module": dict(sorted(by_module.items())),
        "paths": list(groups.values()),
        "exceptions": [asdict(e) for e in exceptions],
        "unknown_cells": dict(unknown), "loop_nodes": loops,
    }


def _named(net: Netlist, nodes: list) -> list[str]:
    """The named nets along a path (Yosys' auto-named ones between them are skipped; a bus is
    listed once per run of its bits)."""
    out: list[str] = []
    for n in nodes:
        name = net.name(n)
        if name and (not out or out[-1] != name):
            out.append(name)
    return out


def resources_by_module(net: Netlist) -> dict[str, dict[str, int]]:
    """LUT / FF / DSP / BRAM18 per submodule of the top (`top` for the rest)."""
    from .synth import resources_from_cells

    counts: dict[str, Counter] = defaultdict(Counter)
    for c, module in zip(net.cells, net.cell_modules()):
        counts[module][c.type] += 1
    return {module: resources_from_cells(dict(cells)) for module, cells in sorted(counts.items())}


# ----------------------------------------------------------------------------- entry points

def part_timing(verilog: str, part: str, *, paths: int = 15, top: str = TOP_MODULE,
                exceptions: list[PathException] | None = None, netlist_out: str | None = None) -> dict:
    """One Yosys run for a part: resources (as ``report.synthesize``), resources per submodule and
    the timing estimate."""
    import json

    from .synth import synthesize

    family = PARTS[part]
    res = synthesize(verilog, family, top, netlist=True)
    data = res.pop("netlist")
    if netlist_out:
        with open(netlist_out, "w") as f:
            json.dump(data, f)
        with open(netlist_out.removesuffix(".json").removesuffix(".netlist") + ".v", "w") as f:
            f.write(verilog)            # the names' declarations (see Netlist)
    net = Netlist(data, top, verilog)
    res["per_module"] = resources_by_module(net)
    timing = analyze(net, family, budget_ns=BUDGET_NS[part], paths=paths, exceptions=exceptions)
    return {"part": part, "resources": res, "timing": timing}


def timing(parts: list[str] | None = None, params: AcceleratorParams = DEFAULT_PARAMS, *, paths: int = 15,
           progress=lambda msg: None) -> dict:
    """`insitu rtl timing`: the estimate for each part, one Yosys run after another."""
    from .sim import top_verilog

    verilog = top_verilog(params)
    out = {}
    for part in parts or list(PARTS):
        progress(f"synthesizing the top level for {part} (yosys synth_xilinx -family {PARTS[part]})")
        out[part] = part_timing(verilog, part, paths=paths)
    return out


def format_paths(part: str, t: dict) -> list[str]:
    """Text lines of one part's estimate (no column cut: names are long)."""
    lines = [f"{part}: worst {t['worst_ns']:.2f} ns (budget {t['budget_ns']:.1f} ns); "
             f"{t['over_budget_endpoints']} of {t['endpoints']} endpoints over budget, "
             f"{t['over_clock_endpoints']} over {t['clock_ns']:.0f} ns"]
    for module, m in t.get("by_module", {}).items():
        lines.append(f"  {module:<8} worst {m['worst_ns']:6.2f} ns, {m['over_budget_endpoints']} of "
                     f"{m['endpoints']} endpoints over budget")
    for p in t["paths"]:
        mc = f" /{p['cycles']} cycles" if p.get("cycles", 1) > 1 else ""
        lines.append(f"  {p['ns']:6.2f} ns{mc} {p['levels']:3d} levels  {p['start']} -> {p['end']} "
                     f"({p['end_pin']}, {p['bits']} bits, {p['bits_over_budget']} over budget)")
        lines.append(f"      via {' > '.join(p['nets'])}")
    if t.get("unknown_cells"):
        lines.append(f"  cells timed as one LUT level (no model): {t['unknown_cells']}")
    return lines
