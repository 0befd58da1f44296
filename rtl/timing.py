"""`insitu rtl timing`: a register-to-register timing estimate over the Yosys netlist.

Yosys' ``sta`` has no timing arcs for Xilinx cells after ``synth_xilinx``, and ``ltp -noff`` walks
through flip-flops, so this module walks the flattened netlist (``write_json``) itself:

* start points: clocked outputs (FF Q, block RAM data out, DSP outputs behind an enabled register,
  distributed RAM / SRL outputs after a write) and top-level inputs;
* end points: clocked inputs (FF D, CE, R/S and asynchronous CLR/PRE: a reset fan-out is a path
  like any other; block RAM address/data/enable; DSP inputs at the first register enabled on
  their way: their own input register, else AD (pre-adder), M, P for A/B/D/INMODE, P for C and
  the ALU controls; LUT-RAM write ports) and top-level outputs;
* combinational arcs: LUTs, MUXF7/F8, CARRY4/CARRY8 bit by bit, DSPs by their register attributes,
  distributed RAM asynchronous reads;
* one topological longest-path pass (arrival time per net bit), so the cost is linear in the
  netlist; the worst path to each end point is traced back through its predecessors.

The delay model (:data:`MODELS`) is a first-order estimate, about ±30 %: a LUT level with its net,
a fan-out term for nets with many loads, and the primitive delays of the -1 speed grade (where
a data sheet gives them: each constant's comment says which are estimates). It is documented in
docs/rtl.md ("Timing estimate"). Exceptions (false or multicycle paths that are so by
construction) are declared once, in :data:`EXCEPTIONS`: the estimate honours them and
:func:`xdc_text` writes them as constraints.
"""

from __future__ import annotations

import bisect
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
    """Delays in ns of one family at speed grade -1 (see docs/rtl.md, "Timing estimate").

    Where a constant comes from a published figure, its comment names the document and symbol;
    every other one is an estimate (the figures of the issue that introduced this model, or
    chosen to be consistent with them): the data sheets' tables of these delays were not
    available to check them against."""

    ff_clk_to_q: float = 0.46       # TCKO (estimate)
    ff_setup_d: float = 0.10        # TDICK (estimate; the LUT in front is counted as a level)
    ff_setup_ce: float = 0.40       # TCECK (estimate)
    ff_setup_sr: float = 0.45       # TSRCK (estimate); also the recovery of asynchronous CLR/PRE
    lut: float = 0.12               # TILO (the figure)
    net: float = 0.45               # a routed net of low fan-out (estimate, no data-sheet figure)
    fanout_free: int = 4            # loads a net drives before its delay grows (estimate)
    fanout_per_doubling: float = 0.25   # extra net delay per doubling of the loads (estimate)
    muxf: float = 0.30              # MUXF7 / MUXF8 (estimate)
    carry_entry: float = 0.40       # S/DI into a carry cell, through to its CO/O (estimate)
    carry_stage: float = 0.115      # CI -> CO through one CARRY4, TBYP (the figure)
    carry_sum: float = 0.25         # CI -> O (the XOR of a bit) (estimate)
    # DSP48E1/E2. "Into X" is the setup time into register X from a DSP input pin whose own
    # input register is off; "X -> P" runs from register X's clock through the rest to the P
    # outputs with the later registers off.
    dsp_mult: float = 4.20          # A/B -> P through multiplier and ALU, no register (the issue's)
    dsp_to_mreg: float = 2.90       # A/B through the multiplier into M (estimate)
    dsp_mreg_to_p: float = 1.90     # M register -> P (PREG = 0) (estimate)
    dsp_areg_to_p: float = 4.00     # A/B/D/AD register -> multiplier -> P (MREG = PREG = 0) (est.)
    dsp_to_preg_mult: float = 3.90  # A/B through the multiplier into P (MREG = 0) (estimate)
    dsp_preadd: float = 1.30        # extra for a path through the pre-adder (A/D, INMODE) (est.)
    dsp_to_adreg: float = 1.60      # A/D through the pre-adder into AD (estimate)
    dsp_alu: float = 1.90           # C / PCIN / OPMODE / ALUMODE / CARRYIN -> P, PREG = 0 (est.)
    dsp_to_preg_alu: float = 1.50   # C / PCIN / OPMODE / ALUMODE / CARRYIN into P (estimate)
    dsp_creg_to_p: float = 2.30     # C / OPMODE / ALUMODE / CARRYIN register -> P, PREG = 0 (est.)
    dsp_preg_to_p: float = 0.65     # P register -> P, PCOUT, CARRYOUT... (estimate)
    dsp_in_setup: float = 0.35      # into an enabled input register (A, B, C, D, INMODE...) (est.)
    dsp_ctrl_setup: float = 0.50    # CE / RST pins of an enabled register (estimate)
    dsp_cascade: float = 0.30       # A/B -> ACOUT/BCOUT, AREG/BREG = 0 (estimate)
    dsp_cascade_clk_to_out: float = 0.65    # A/B register -> ACOUT/BCOUT (estimate)
    bram_clk_to_out: float = 2.45   # TRCKO_DO, no output register (the figure)
    bram_clk_to_out_reg: float = 0.90   # TRCKO_DO_REG, DO_REG = 1 (estimate)
    bram_setup: float = 0.60        # address / data / write and port enables, TRCCK (estimate)
    lutram_clk_to_out: float = 1.10     # WCLK -> O after a write, TSHCKO (estimate)
    lutram_setup: float = 0.70      # write address / data / enable (estimate)
    io_buffer: float = 0.0          # IBUF/OBUF: the ports are inside the FPGA (block design)

    def scaled(self, factor: float) -> "DelayModel":
        return replace(self, **{k: v * factor for k, v in asdict(self).items() if isinstance(v, float)})


#: UltraScale+ -1 against Zynq-7000 -1: about 0.6x (the issue's ratio, an estimate) for every
#: delay the data sheet does not give.
XCUP_SCALE = 0.6

#: DS925 (Zynq UltraScale+ MPSoC DC and AC Switching Characteristics), "DSP48 Slice Switching
#: Characteristics", speed grade -1 at VCCINT 0.85 V: the maximum frequencies of the DSP's
#: internal register-to-register paths (MHz). Their periods are the delays from an input register
#: through the multiplier (and pre-adder) into M or P; the model uses them for a path from the
#: input pin with its register off (the bypassed register's clock-to-out standing for the pin's
#: own entry delay).
DS925_DSP_FMAX_MHZ = {
    "FMAX": 645,                    # with all registers used: every internal stage, A/B -> M too
    "FMAX_MULT_NOMREG": 456,        # two-register multiply without MREG: A/B reg -> P reg
    "FMAX_PREADD_NOADREG": 468,     # without ADREG: A/D reg -> pre-adder -> multiplier -> M
    "FMAX_NOPIPELINEREG": 338,      # without MREG, ADREG: A/D reg -> pre-adder -> mult -> P
}


def _period(mhz: float) -> float:
    return round(1e3 / mhz, 3)


def _xcup_model() -> DelayModel:
    f = DS925_DSP_FMAX_MHZ
    return replace(
        DelayModel().scaled(XCUP_SCALE),
        dsp_to_mreg=_period(f["FMAX"]),                                     # 1.550
        dsp_to_preg_mult=_period(f["FMAX_MULT_NOMREG"]),                    # 2.193
        dsp_to_adreg=_period(f["FMAX"]),                                    # 1.550
        # The pre-adder's share: no ADREG/MREG against no MREG (2.959 - 2.193).
        dsp_preadd=round(_period(f["FMAX_NOPIPELINEREG"]) - _period(f["FMAX_MULT_NOMREG"]), 3),
    )


MODELS = {"xc7": DelayModel(), "xcup": _xcup_model()}


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


_CFG_SETTLE = (
    "the top's cfg_* registers follow the configuration registers only while idle (frozen from "
    "START), and {pe}'s cfg_ready (pe_interface.settled) rises {ready} cycles after their last "
    "change; {what} {depth} registers deep: final {depth} cycles after it with one-cycle "
    "paths, {ready} with a first hop of 2 cycles, by the cycle cfg_ready rises. cfg_ready gates "
    "CHECK and the launch: the top's in_last/out_last and the PE's own copies (out_left, the "
    "LRT control's and skid's counts) are taken then; nothing samples them earlier (the "
    "driver reads IN_BEATS/OUT_BEATS once they have settled, docs/rtl.md 'Control plane')")

#: THE list of timing exceptions of the accelerator: the estimate honours it and xdc_text() writes
#: it. Only paths that are false or multicycle by construction belong here, never a blanket one.
#: (PE1/PE2 have none: their cfg_ready rises the cycle their 5-deep in_beats settles, no spare
#: cycle; tests/rtl/test_rtl_timing.py measures each PE's margin against these declarations.)
EXCEPTIONS: list[PathException] = [
    PathException(
        start="accel.cfg_*", end="accel.pe3.config.*", cycles=2,
        reason=_CFG_SETTLE.format(
            pe="PE3", ready=6, depth=5,
            what="PE3Config's registers (in_beats, out_beats, cfg_error and their pipeline) are at "
                 "most")),
    PathException(
        start="accel.cfg_*", end="accel.pe_lrt.config.*_beats", cycles=2,
        reason=_CFG_SETTLE.format(
            pe="the LRT PE", ready=3, depth=2,
            what="LrtConfig's in_beats/out_beats (through cells, m n registered) are at most")),
    PathException(
        start="accel.cfg_*", end="accel.pe_lrt.config.cfg_error", cycles=2,
        reason=_CFG_SETTLE.format(
            pe="the LRT PE", ready=3, depth=2,
            what="LrtConfig's cfg_error (through cells, m n registered) is at most")),
]


def _glob(name: str, pattern: str) -> bool:
    base = name.split("[", 1)[0]
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(base, pattern)


def _vivado_filter(pattern: str, registers: list[tuple[str, str, set]] | None = None) -> str | None:
    """The ``get_cells -filter`` of a glob on Amaranth names, None where it names nothing.

    A whole scope ``accel.pe3.config.*`` is every leaf cell in ``accel/pe3/config`` (registers,
    and DSPs with their internal registers: the exception takes their valid start or end
    points). Other globs name registers, ``accel.x`` being Vivado's ``accel/x_reg[...]``; with
    the Verilog's ``registers`` (:func:`verilog_registers`) they are the registers Amaranth
    wrote under any matching name: a register often takes another name of its net (the top's
    ``cfg_a`` is written ``reg a``, ``cfg_a`` only an alias of it)."""
    if pattern.endswith(".*"):
        return f"NAME =~ *{pattern[:-2].replace('.', '/')}/* && IS_PRIMITIVE"
    if registers is None:
        return f"NAME =~ *{pattern.replace('.', '/')}_reg*"
    found = sorted({(scope, reg) for scope, reg, names in registers
                    if any(_glob(n, pattern) for n in names)})
    if not found:
        return None
    return " || ".join(f"NAME =~ *{scope.replace('.', '/') + '/' if scope else ''}{reg}_reg*"
                       for scope, reg in found)


def verilog_registers(verilog: str) -> list[tuple[str, str, set]]:
    """The registers of Amaranth's Verilog: (scope, the name Vivado's cells take, every name of
    it there). Amaranth writes one module per hierarchy node (``top.accel.pe3.config``); a
    register is ``reg x``, and ``assign y = x;`` gives it another name."""
    out = []
    module, regs, aliases = None, [], defaultdict(set)

    def flush():
        if module is not None:
            scope = module.split(".", 1)[1] if "." in module else ""
            prefix = f"{scope}." if scope else ""
            for reg in regs:
                names = {prefix + re.sub(r"\$\d+$", "", n) for n in {reg, *aliases[reg]}}
                out.append((scope, reg, names))

    for line in verilog.splitlines():
        if m := re.match(r"module\s+\\?(\S+)", line):
            flush()
            module, regs, aliases = m.group(1), [], defaultdict(set)
        elif m := re.match(r"\s*reg\s+(?:signed\s+)?(?:\[[^]]*\]\s*)?\\?(\S+?)\s*(?:=|;)", line):
            regs.append(m.group(1))
        elif m := re.match(r"\s*assign\s+\\?(\S+)\s*=\s*\\?([^\s;\[]+)\s*;", line):
            aliases[m.group(2)].add(m.group(1))
    flush()
    return out


def xdc_clock_text(clock_port: str = CLOCK_PORT, period_ns: float = CLOCK_PERIOD_NS) -> str:
    """The IP's out-of-context clock: the period its own synthesis and the estimate are held to.
    In a block design the clock comes from the processing system, whose IP constrains it."""
    return ("# Generated by insitu.rtl.timing: the accelerator's clock for out-of-context runs\n"
            f"create_clock -period {period_ns:.3f} -name {clock_port} [get_ports {clock_port}]\n")


def xdc_exceptions_text(exceptions: list[PathException] | None = None, verilog: str | None = None) -> str:
    """The declared false and multicycle paths as XDC (empty when there are none).

    ``verilog``: the top level's Verilog the XDC goes with; the exceptions' registers are named
    as it names them (:func:`verilog_registers`), and one that names none there is left out
    (and said so). Without it, :data:`EXCEPTIONS` are written for the reference design's
    Verilog (:func:`insitu.rtl.sim.top_verilog`, ~10 s once per process; every board's design
    names these registers alike), a list given here by the plain mapping ``a.b.x`` ->
    ``a/b/x_reg``."""
    if exceptions is None:
        exceptions = EXCEPTIONS
        if exceptions and verilog is None:
            from .sim import top_verilog
            verilog = top_verilog()
    if not exceptions:
        return ""
    registers = verilog_registers(verilog) if verilog is not None else None
    lines = ["# Generated by insitu.rtl.timing (exceptions: insitu.rtl.timing.EXCEPTIONS)"]
    for e in exceptions:
        if e.cycles is not None and (e.cycles < 2 or e.end == "*"):
            raise ValueError(f"multicycle path {e}: needs cycles >= 2 and its end points")
        start, end = _vivado_filter(e.start, registers), _vivado_filter(e.end, registers)
        if e.reason:
            lines.append(f"# {e.reason}")
        if start is None or (end is None and e.end != "*"):
            lines.append(f"# (left out: {e.start if start is None else e.end} names no register of "
                         "the Verilog)")
            continue
        src = f"[get_cells -hierarchical -filter {{{start}}}]"
        to = "" if e.end == "*" else f" -to [get_cells -hierarchical -filter {{{end}}}]"
        if e.cycles is None:
            lines.append(f"set_false_path -from {src}{to}")
        else:
            # UG903 ("Example Two: Setup=5 / Hold=4"): within one clock, a setup multiplier N
            # moves the capture edge N - 1 cycles later and the hold check with it; a hold
            # multiplier of N - 1 moves the hold check back to the launch edge.
            lines.append(f"set_multicycle_path {e.cycles} -setup -from {src}{to}")
            lines.append(f"set_multicycle_path {e.cycles - 1} -hold -from {src}{to}")
    return "\n".join(lines) + "\n"


def xdc_text(exceptions: list[PathException] | None = None, clock_port: str = CLOCK_PORT,
             period_ns: float = CLOCK_PERIOD_NS, verilog: str | None = None) -> str:
    """The XDC of the accelerator alone: its clock and the declared exceptions."""
    return xdc_clock_text(clock_port, period_ns) + xdc_exceptions_text(exceptions, verilog)


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
        lines = verilog.splitlines() if verilog else []
        self.names = self._bit_names(mod.get("netnames", {}), lines)
        # Where each Verilog module starts (Amaranth writes one per hierarchy node, named
        # `top.accel.pe3.config`): a cell's `src` line there gives its true scope.
        self._lines = lines
        self._netnames = mod.get("netnames", {})
        self._aliases: dict | None = None           # bit -> its public names, built when asked
        self._registers: dict | None = None         # (scope, Verilog reg) -> its names there
        self._modules = [(k + 1, m.group(1)) for k, line in enumerate(lines)
                         if (m := re.match(r"module\s+\\?(\S+)", line))]
        self._prefix = self._common_prefix()
        self._scopes: list[str] | None = None

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
        """A readable name of a cell: its first named output, else its hierarchy (that of its
        Yosys name, else the one :meth:`cell_scopes` infers) and type, else its Yosys name."""
        c = self.cells[ci]
        if c.type.startswith("IBUF"):           # a top-level input: the port's name
            return next((n for bits in c.inputs.values() for b in bits if (n := self.name(b))), c.name)
        for pin in ("Q", "P", "O", *c.outputs):
            for b in c.outputs.get(pin, ()):
                n = self.name(b)
                if n:
                    return n
        m = re.match(r"\$flatten\\(.*?)\.\$", c.name)
        if m:
            return _strip(m.group(1)) + f".<{c.type}>"
        scope = self.cell_scopes()[ci]
        return f"{scope}.<{c.type}>" if scope else _strip(c.name)

    def cell_scopes(self) -> list[str]:
        """The hierarchical scope of every cell (``accel.pe3.config``; "" for the top), inferred
        as :meth:`cell_modules` does; computed once."""
        if self._scopes is None:
            def scope(name: str) -> str:
                base = name.split("[", 1)[0].removesuffix("(input)")
                return base.rsplit(".", 1)[0] if "." in base else ""
            voted = self._vote(scope)
            self._scopes = [self._src_scope(c) or voted[ci] or "" for ci, c in enumerate(self.cells)]
        return self._scopes

    def _src(self, c: _Cell) -> tuple[int, int] | None:
        """The first Verilog line range (1-based) of a cell's `src` attribute."""
        m = re.search(r"design\.v:(\d+)\.\d+-(\d+)\.", c.cell.get("attributes", {}).get("src", ""))
        return (int(m.group(1)), int(m.group(2))) if m and self._modules else None

    def _src_scope(self, c: _Cell) -> str | None:
        """The scope of the Verilog module a cell's first `src` line lies in (flip-flops keep
        it where their names lose the hierarchy), None without the Verilog."""
        src = self._src(c)
        if src is None:
            return None
        k = bisect.bisect_right(self._modules, (src[0], "\uffff")) - 1
        if k < 0:
            return None
        name = self._modules[k][1]
        return name.split(".", 1)[1] if "." in name else ""

    def aliases(self, bit) -> list[str]:
        """Every public name of a net bit (without its index)."""
        if self._aliases is None:
            self._aliases = defaultdict(list)
            for name, net in self._netnames.items():
                if not net.get("hide_name") and not name.startswith("$"):
                    for b in net["bits"]:
                        if isinstance(b, int):
                            self._aliases[b].append(_strip(name))
        return self._aliases.get(bit, []) if isinstance(bit, int) else []

    def hier_names(self, ci: int) -> list[str]:
        """The names an exception matches a cell by. A register declared in the Verilog (its
        `src` lines, `always @(posedge clk) x <= ...`) is matched in that module's scope: by `x`
        and its aliases there (:func:`verilog_registers`), by the names its output has there and
        by its label's last part (without Yosys' `$N`).
        Its label, the most telling name of its net, may be another module's: the registers
        behind a submodule's output port are labelled after the parent's wire
        (`accel.in_beats$103` for the LRT PE's `accel.pe_lrt.config.in_beats`,
        `accel.cfg_error$97` for a PE's own), the top's `cfg_a` may be labelled `accel.a`.
        Other cells go by their label."""
        c = self.cells[ci]
        label = self.cell_label(ci)
        scope = self._src_scope(c)
        if scope is None:
            return [label]
        first, last = self._src(c)
        lhs = next((m.group(1) for line in self._lines[first - 1:last]
                    if (m := re.match(r"\s*(\\?\S+)\s*<=", line))), None)
        prefix = f"{scope}." if scope else ""
        if self._registers is None:
            self._registers = {(s, r): names for s, r, names in verilog_registers("\n".join(self._lines))}
        names: list[str] = sorted(self._registers.get((scope, _strip(lhs or "")), ()))
        parts = [lhs, label.split("[", 1)[0].rsplit(".", 1)[-1]]
        for bits in c.outputs.values():
            for b in bits[:1]:
                parts += [n[len(prefix):] for n in self.aliases(b)
                          if n.startswith(prefix) and "." not in n[len(prefix):]]
        for part in parts:
            if part:
                name = prefix + re.sub(r"\$\d+$", "", _strip(part))
                if name not in names:
                    names.append(name)
        return names

    def cell_modules(self) -> list[str]:
        """The submodule of every cell. abc's LUTs and the mapped flip-flops lose their hierarchy
        in their names, so a cell takes the module of its named outputs, else (nearest first) that
        of the cells it drives, else that of its drivers."""
        return [label or "top" for label in self._vote(self.module_of_name)]

    def _vote(self, label_of_name) -> list:
        """A label for every cell from ``label_of_name`` of its names: that of its Yosys name
        (``$flatten\\pe3.\\config.$...``) or of its named outputs, else the majority of the
        cells it drives, else of its drivers (None where nothing tells)."""
        labels: list = [None] * len(self.cells)
        for ci, c in enumerate(self.cells):
            m = re.match(r"\$flatten\\(.*?)\.\$", c.name)
            if m:
                labels[ci] = label_of_name(_strip(m.group(1)) + ".x")
                continue
            names = [self.name(b) for bits in c.outputs.values() for b in bits]
            votes = Counter(label_of_name(n) for n in names if n)
            if votes:
                labels[ci] = votes.most_common(1)[0][0]
        for direction in ("loads", "drivers"):
            for _ in range(64):
                changed = False
                for ci, c in enumerate(self.cells):
                    if labels[ci] is not None:
                        continue
                    votes = Counter()
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
        return labels


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


# DSP48E1/E2 (UG479, UG579). Data inputs and the register that takes each (None: no register of
# its own); the defaults of the attributes are the primitives' (UG953/UG974).
_DSP_IN_REG = {"A": "AREG", "ACIN": "AREG", "B": "BREG", "BCIN": "BREG", "D": "DREG",
               "INMODE": "INMODEREG", "C": "CREG", "OPMODE": "OPMODEREG", "ALUMODE": "ALUMODEREG",
               "CARRYIN": "CARRYINREG", "CARRYINSEL": "CARRYINSELREG",
               "PCIN": None, "CARRYCASCIN": None, "MULTSIGNIN": None}
# Inputs into the multiplier (through the pre-adder where it is used): unregistered, they run to
# AD, else M, else P. The others (C, PCIN, the ALU controls) run into P.
_DSP_MULT_PINS = {"A", "ACIN", "B", "BCIN", "D", "INMODE"}
_DSP_ALU_REGS = ("CREG", "OPMODEREG", "ALUMODEREG", "CARRYINREG", "CARRYINSELREG")
# Clock enables and resets, by the register(s) they control: a pin of a register that is off
# is ignored by the primitive, so it is no end point.
_DSP_CTRL_PINS = {
    "CEA1": ("AREG",), "CEA2": ("AREG",), "RSTA": ("AREG",),
    "CEB1": ("BREG",), "CEB2": ("BREG",), "RSTB": ("BREG",),
    "CEC": ("CREG",), "RSTC": ("CREG",), "CED": ("DREG",), "RSTD": ("DREG",), "CEAD": ("ADREG",),
    "CEM": ("MREG",), "RSTM": ("MREG",), "CEP": ("PREG",), "RSTP": ("PREG",),
    "CECTRL": ("OPMODEREG", "CARRYINSELREG"), "RSTCTRL": ("OPMODEREG", "CARRYINSELREG"),
    "CEALUMODE": ("ALUMODEREG",), "RSTALUMODE": ("ALUMODEREG",),
    "CEINMODE": ("INMODEREG",), "RSTINMODE": ("INMODEREG",),
    "CECARRYIN": ("CARRYINREG",), "RSTALLCARRYIN": ("CARRYINREG",),
}
# Outputs that do not come from the ALU/P side: the A/B cascades.
_DSP_CASCADE_OUT = {"ACOUT": ("A", "ACIN"), "BCOUT": ("B", "BCIN")}


def _dsp_preadder_pins(c: _Cell) -> set[str]:
    """The inputs that reach the multiplier through the pre-adder (empty when it is unused)."""
    if c.type == "DSP48E1":
        return {"A", "ACIN", "D", "INMODE"} if _param(c.cell, "USE_DPORT", "FALSE") == "TRUE" else set()
    if "AD" not in (_param(c.cell, "AMULTSEL", "A"), _param(c.cell, "BMULTSEL", "B")):
        return set()
    first = ("B", "BCIN") if _param(c.cell, "PREADDINSEL", "A") == "B" else ("A", "ACIN")
    return {"D", "INMODE", *first}


def _dsp_timing(c: _Cell, m: DelayModel) -> _CellTiming:
    """A DSP48E1/E2 by its register attributes. Each input ends at the first register enabled on
    its way: its own input register; else, into the multiplier (A, B, D, INMODE), the AD register
    behind the pre-adder when that is used, then M, then P; else, into the ALU (C, PCIN, OPMODE,
    ALUMODE, CARRYIN), P. With none on the way, it runs through to the outputs (combinational).
    The outputs start at the last register enabled before them; ACOUT/BCOUT at the A/B register
    (else they follow A/B)."""
    t = _CellTiming()
    reg = lambda name: int(_param(c.cell, name, 1))          # noqa: E731 (UG953: default 1)
    mult = _param(c.cell, "USE_MULT", "MULTIPLY") != "NONE"
    preadd = _dsp_preadder_pins(c) if mult else set()
    adreg, mreg, preg = bool(preadd) and reg("ADREG") > 0, mult and reg("MREG") > 0, reg("PREG") > 0
    p_outs = [p for p in c.outputs if p not in _DSP_CASCADE_OUT]
    connected = {p for p, bits in c.inputs.items() if any(isinstance(b, int) for b in bits)}
    p_starts = []                            # clock-to-P of the registers driving P (PREG = 0)
    for pin in c.inputs:
        if pin in _DSP_CTRL_PINS:
            if any(reg(r) for r in _DSP_CTRL_PINS[pin]):
                t.ends.append((pin, m.dsp_ctrl_setup))
            continue
        if pin not in _DSP_IN_REG or (pin == "D" and "D" not in preadd):
            continue                         # CLK; D without the pre-adder is unused
        own = _DSP_IN_REG[pin]
        through_mult = mult and pin in _DSP_MULT_PINS
        extra = m.dsp_preadd if pin in preadd else 0.0
        if own and reg(own):
            t.ends.append((pin, m.dsp_in_setup))
            if pin in connected and not preg:
                if through_mult and not mreg:
                    p_starts.append(m.dsp_areg_to_p + (0.0 if adreg else extra))
                elif not through_mult:
                    p_starts.append(m.dsp_creg_to_p)
        elif through_mult and pin in preadd and adreg:
            t.ends.append((pin, m.dsp_to_adreg))
        elif through_mult and mreg:
            t.ends.append((pin, m.dsp_to_mreg + extra))
        elif preg:
            t.ends.append((pin, m.dsp_to_preg_mult + extra if through_mult else m.dsp_to_preg_alu))
        else:
            for out in p_outs:
                t.arcs.append((pin, None, out, None, m.dsp_mult + extra if through_mult else m.dsp_alu))
        # The A/B cascade outputs: registered by AREG/BREG, else A/B (or ACIN/BCIN) go through.
        for out, ins in _DSP_CASCADE_OUT.items():
            if pin in ins and out in c.outputs and not (own and reg(own)):
                t.arcs.append((pin, None, out, None, m.dsp_cascade))
    for out, ins in _DSP_CASCADE_OUT.items():
        if out in c.outputs and reg(_DSP_IN_REG[ins[0]]):
            t.starts.append((out, m.dsp_cascade_clk_to_out))
    # Clock-to-out of the registers in front of P.
    if preg:
        tco = m.dsp_preg_to_p
    else:
        if mreg:
            p_starts.append(m.dsp_mreg_to_p)
        elif adreg:
            p_starts.append(m.dsp_areg_to_p)
        tco = max(p_starts, default=None)
    if tco is not None:
        t.starts += [(out, tco) for out in p_outs]
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


def _start_names(net: Netlist, g: _Graph, node) -> list[str]:
    """The names an exception may match a start point by (see :meth:`Netlist.hier_names`)."""
    _, ci = g.arrival_start.get(node, (0.0, -1))
    if ci < 0 or net.cells[ci].type.startswith("IBUF"):
        return [_start_name(net, g, node)]
    return net.hier_names(ci)


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
    start_cache: dict = {}

    def _starts_at(e: PathException, node) -> bool:
        if node not in start_cache:
            start_cache[node] = _start_names(net, g, node)
        return any(e.matches_start(n) for n in start_cache[node])

    # Per exception: the end points it names, and those whose worst path it covers (none at all
    # means its names no longer match the design).
    ends_matched, applied = Counter(), Counter()
    for node, after, ci, pin, bit in g.ends:
        if node not in arrival:
            continue
        ns = arrival[node] + after
        rules = []
        if exceptions:
            end_names = net.hier_names(ci) if ci >= 0 else [f"{pin}[{bit}]"]
            rules = [e for e in exceptions if any(e.matches_end(n) for n in end_names)]
            worst_starts = _start_names(net, g, start_of(node)) if rules else []
            for idx, e in enumerate(exceptions):
                if e in rules:
                    ends_matched[idx] += 1
                    applied[idx] += any(e.matches_start(n) for n in worst_starts)
        if rules and any(e.matches_start(n) for e in rules for n in worst_starts):
            # The worst path is an exception: the worst of the other start points counts, and a
            # multicycle path counts as its delay over its cycles.
            best = None
            for idx, e in enumerate(exceptions):
                if e not in rules:
                    continue
                if idx not in reruns:
                    reruns[idx] = (
                        _propagate(g, lambda n, e=e: not _starts_at(e, n)),
                        _propagate(g, lambda n, e=e: _starts_at(e, n))
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
        "exceptions": [{**asdict(e), "end_points": ends_matched[idx], "worst_paths": applied[idx]}
                       for idx, e in enumerate(exceptions)],
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
    for e in t.get("exceptions", ()):
        kind = f"multicycle {e['cycles']}" if e.get("cycles") else "false path"
        lines.append(f"  exception ({kind}) {e['start']} -> {e['end']}: {e.get('end_points', '?')} end "
                     f"points, {e.get('worst_paths', '?')} of them with their worst path through it"
                     + ("  ** matches nothing in this netlist **" if e.get("end_points") == 0 else ""))
    if t.get("unknown_cells"):
        lines.append(f"  cells timed as one LUT level (no model): {t['unknown_cells']}")
    return lines
