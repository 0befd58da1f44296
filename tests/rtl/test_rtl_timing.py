"""`insitu rtl timing`: the netlist walk on small designs synthesized by Yosys in seconds."""

import pytest
from amaranth.hdl import Cat, Elaboratable, Instance, Module, ResetInserter, Signal
from amaranth.back import verilog

from insitu.rtl import timing
from insitu.rtl.synth import synthesize

pytestmark = pytest.mark.rtl

CHAINS = (4, 8)


class _Chains(Elaboratable):
    """LUT6 chains of 4 and 8 levels between registers (instantiated: abc would rebalance them)."""

    def __init__(self):
        self.i = Signal(64)
        self.end = [Signal(name=f"end{n}") for n in CHAINS]

    def elaborate(self, platform):
        m = Module()
        src = Signal(64)
        m.d.sync += src.eq(self.i)
        for n, end in zip(CHAINS, self.end):
            x = src[0]
            for k in range(n):
                lvl = Signal(name=f"c{n}_lvl{k}")
                inputs = {f"i_I{j}": src[(5 * k + j + 7 * n) % 64] for j in range(1, 6)}
                m.submodules[f"lut{n}_{k}"] = Instance("LUT6", p_INIT=0x6996966996696996, i_I0=x,
                                                       o_O=lvl, **inputs)
                x = lvl
            m.d.sync += end.eq(x)
        return m


class _Wide(Elaboratable):
    """600 flip-flops in one reset domain."""

    def __init__(self):
        self.i = Signal()
        self.o = Signal()

    def elaborate(self, platform):
        m = Module()
        shift = Signal(600)
        m.d.sync += shift.eq((shift << 1) | self.i)
        m.d.comb += self.o.eq(shift[-1])
        return m


class _Design(Elaboratable):
    def __init__(self):
        self.i = Signal(64)
        self.x = Signal(16)
        self.y = Signal(16)
        self.o = Signal(32 + 32 + 3)

    def elaborate(self, platform):
        m = Module()
        m.submodules.chains = chains = _Chains()
        m.d.comb += chains.i.eq(self.i)
        # A multiply between registers (Yosys packs them into the DSP) and one between LUTs.
        a = Signal(16)
        b = Signal(16)
        prod_r = Signal(32)
        m.d.sync += [a.eq(self.x), b.eq(self.y), prod_r.eq(a * b)]
        x1 = Signal(16)
        x2 = Signal(16)
        y1 = Signal(16)
        y2 = Signal(16)
        prod_u = Signal(32)
        m.d.sync += [x1.eq(self.x), x2.eq(self.y), y1.eq(self.y + 1), y2.eq(self.x - 1)]
        m.d.sync += prod_u.eq(((x1 ^ x2) * (y1 ^ y2)) ^ prod_r)
        # A 32-bit accumulator: a carry chain.
        acc = Signal(32)
        inc = Signal(32)
        m.d.sync += [inc.eq(self.i[:32]), acc.eq(acc + inc)]
        # A reset from a register to 600 flip-flops.
        big_reset = Signal()
        m.d.sync += big_reset.eq(self.i[63])
        m.submodules.wide = wide = ResetInserter(big_reset)(_Wide())
        m.d.comb += wide.i.eq(self.i[5])
        m.d.comb += self.o.eq(Cat(prod_u, acc, wide.o, chains.end[0], chains.end[1]))
        return m


@pytest.fixture(scope="module", params=["xc7", "xcup"])
def netlist(request):
    design = _Design()
    src = verilog.convert(design, name="top", ports=[design.i, design.x, design.y, design.o])
    res = synthesize(src, request.param, "top", netlist=True)
    return request.param, timing.Netlist(res["netlist"], "top", src), res


def _paths(netlist, **kw):
    family, net, _ = netlist
    return timing.analyze(net, family, paths=1000, **kw)


def _path_to(result, end, pin="FDRE.D"):
    found = [p for p in result["paths"] if p["end"].split("[")[0] == end and p["end_pin"] == pin]
    assert found, f"no path to {end} ({pin})"
    return max(found, key=lambda p: p["ns"])


def test_lut_chain_levels_and_delay(netlist):
    family, _, _ = netlist
    model = timing.MODELS[family]
    r = _paths(netlist)
    short, long = _path_to(r, "chains.end4"), _path_to(r, "chains.end8")
    assert (short["levels"], long["levels"]) == CHAINS
    # Each level: a LUT and its net (0.57 ns on xc7 -1).
    per_level = (long["ns"] - short["ns"]) / (CHAINS[1] - CHAINS[0])
    assert per_level == pytest.approx(model.lut + model.net, rel=0.05)
    if family == "xc7":
        assert per_level == pytest.approx(0.57, abs=0.01)
    # Names along the path are Amaranth's.
    assert [f"chains.c8_lvl{k}" for k in range(8)] == [n for n in long["nets"] if "lvl" in n]
    assert long["start"].startswith("chains.src[")
    # An input port of a submodule is not the register's name: `chains.i` is the top's `i`.
    assert _path_to(r, "chains.src")["start"].startswith("i[")


def test_registered_and_unregistered_multiply(netlist):
    family, net, res = netlist
    model = timing.MODELS[family]
    assert res["DSP"] >= 2
    r = _paths(netlist)
    unreg = _path_to(r, "prod_u")
    assert "DSP48E1" in unreg["cells"] or "DSP48E2" in unreg["cells"]
    assert unreg["ns"] > model.dsp_mult + 2 * model.net
    through = [p for p in r["paths"] if p["end"].startswith("prod_r") or p["start"].startswith(("a[", "b["))]
    if family == "xc7":
        # Yosys packs the registers around the other multiply into the DSP48E1: no path crosses it.
        assert all(p["ns"] < model.dsp_mult for p in through)
    else:
        # For xcup Yosys leaves the DSP48E2 registers off (FFs beside it): the multiply is a path.
        assert any("DSP48E2" in p["cells"] and p["ns"] > model.dsp_mult for p in through)


def test_carry_chain(netlist):
    family, _, _ = netlist
    model = timing.MODELS[family]
    p = _path_to(_paths(netlist), "acc")
    carries = [c for c in p["cells"] if c.startswith("CARRY")]
    assert len(carries) >= 32 // (8 if "CARRY8" in carries else 4) - 1
    # Ripple: much less than a LUT level per 4 bits.
    assert p["ns"] < model.ff_clk_to_q + 3 * (model.lut + model.net) + len(carries) * model.carry_stage * 2 + 1


def test_high_fanout_reset_is_long(netlist):
    family, _, _ = netlist
    model = timing.MODELS[family]
    r = _paths(netlist)
    resets = [p for p in r["paths"] if p["end"].startswith("wide.shift") and p["end_pin"] == "FDRE.R"]
    assert sum(p["bits"] for p in resets) == 600
    # The reset (the top's `rst` or `big_reset` through one LUT) reaches 600 loads: about
    # log2(600/4) doublings of net delay over a net of low fan-out.
    worst = max(p["ns"] for p in resets)
    assert worst > model.lut + 2 * model.net + model.ff_setup_sr + 7 * model.fanout_per_doubling
    assert resets[0]["start"] in ("rst", "big_reset")


def test_resources_by_submodule(netlist):
    _, net, res = netlist
    by = timing.resources_by_module(net)
    assert by["wide"]["FF"] >= 600
    assert by["chains"]["LUT"] >= sum(CHAINS)
    assert sum(m["FF"] for m in by.values()) == res["FF"]
    assert sum(m["LUT"] for m in by.values()) == res["LUT"]
    # Endpoints over budget are counted per module: the 8-level chain (~5 ns) is over a 3 ns
    # budget, every endpoint is in exactly one module.
    r = _paths(netlist, budget_ns=3.0)
    assert sum(m["endpoints"] for m in r["by_module"].values()) == r["endpoints"]
    assert sum(m["over_budget_endpoints"] for m in r["by_module"].values()) == r["over_budget_endpoints"]
    assert r["by_module"]["chains"]["over_budget_endpoints"] > 0


def test_exception_removes_the_path_and_is_in_the_xdc(netlist):
    rule = timing.PathException(start="chains.src", end="chains.end8", reason="test")
    before = _paths(netlist, exceptions=[])
    after = _paths(netlist, exceptions=[rule])
    assert _path_to(before, "chains.end8")
    assert not [p for p in after["paths"] if p["end"] == "chains.end8" and p["end_pin"] == "FDRE.D"]
    assert _path_to(after, "chains.end4")["ns"] == _path_to(before, "chains.end4")["ns"]
    assert after["endpoints"] < before["endpoints"]
    # A multicycle path of 2 counts half its delay.
    mc = _paths(netlist, exceptions=[timing.PathException(start="chains.src", end="chains.end8", cycles=2)])
    p = _path_to(mc, "chains.end8")
    assert p["cycles"] == 2 and p["ns"] == _path_to(before, "chains.end8")["ns"]
    xdc = timing.xdc_text([rule])
    assert "create_clock -period 10.000 -name aclk [get_ports aclk]" in xdc
    assert "set_false_path -from [get_cells -hierarchical -filter {NAME =~ *chains/src_reg*}]" in xdc
    assert "-to [get_cells -hierarchical -filter {NAME =~ *chains/end8_reg*}]" in xdc


def test_default_xdc_has_the_clock_of_the_top():
    from insitu.accel.ip import CLOCK_PORT

    assert f"[get_ports {CLOCK_PORT}]" in timing.xdc_text()


def test_cli_timing_is_registered(run_cli):
    r = run_cli("rtl", "timing", "--help")
    assert r.returncode == 0, r.stderr
    for option in ("--part", "--paths", "--json", "--out"):
        assert option in r.stdout


# ----------------------------------------------------------------------------- DSP inputs
# Tiny hand-written netlists (Yosys JSON): flip-flops, LUTs and one or two DSPs, timed by the
# model's constants. No Yosys run.

class _Hand:
    """A flattened Yosys JSON netlist built by hand: ``bits`` names a new bus, ``ff``/``lut``/
    ``dsp`` add cells (unconnected pins are simply absent, constants are "0"/"1")."""

    def __init__(self):
        self.cells, self.netnames, self._next = {}, {}, 2
        self.clk = self.bits("clk")

    def bits(self, name, width=1):
        out = list(range(self._next, self._next + width))
        self._next += width
        self.netnames[name] = {"bits": out, "hide_name": 0, "attributes": {}}
        return out

    def cell(self, name, kind, inputs, outputs, params=None):
        self.cells[name] = {
            "type": kind, "parameters": {k: (v if isinstance(v, str) else format(v, "032b"))
                                         for k, v in (params or {}).items()},
            "port_directions": {**{p: "input" for p in inputs}, **{p: "output" for p in outputs}},
            "connections": {**inputs, **outputs}}

    def ff(self, d, q, name=None):
        self.cell(name or f"ff{len(self.cells)}", "FDRE",
                  {"C": self.clk, "CE": ["1"], "R": ["0"], "D": d}, {"Q": q})

    def lut(self, i, o):
        self.cell(f"lut{len(self.cells)}", "LUT1", {"I0": i}, {"O": o}, {"INIT": 1})

    def chain(self, name, levels, width=1):
        """A register ``name`` and ``levels`` LUTs behind it; returns the last bits."""
        src = self.bits(name, width)
        for k in range(width):
            self.ff(self.bits(f"{name}_d{k}"), [src[k]])
        x = src
        for level in range(levels):
            y = self.bits(f"{name}_l{level}", width)
            for k in range(width):
                self.lut([x[k]], [y[k]])
            x = y
        return x

    def netlist(self):
        ports = {"clk": {"direction": "input", "bits": self.clk}}
        mod = {"attributes": {"top": "1"}, "ports": ports, "cells": self.cells,
               "netnames": self.netnames}
        return timing.Netlist({"modules": {"top": mod}}, "top")


# Every register off unless a test turns it on (Yosys writes them all).
_OFF = {r: 0 for r in ("AREG", "BREG", "CREG", "DREG", "ADREG", "MREG", "PREG", "INMODEREG",
                       "OPMODEREG", "ALUMODEREG", "CARRYINREG", "CARRYINSELREG",
                       "ACASCREG", "BCASCREG")}


def _hand_dsp(params, inputs, kind="DSP48E1", p_reg_name="prod", capture=True):
    """DSP ``kind`` with ``params`` over the registers in _OFF; ``inputs`` maps a pin to the
    number of LUT levels between its source register (named after the pin) and the pin. P's low
    bit is captured by the register ``p_reg_name``."""
    h = _Hand()
    conn = {"CLK": h.clk}
    for pin, levels in inputs.items():
        conn[pin] = h.chain(f"src_{pin.lower()}", levels)
    p = h.bits("p_out", 2)
    h.cell("dsp", kind, conn, {"P": p}, {**_OFF, "USE_MULT": "MULTIPLY", **params})
    if capture:
        h.ff([p[0]], h.bits(p_reg_name))
    return h


def _ends(result, pin):
    """The worst arrival (ns) per start signal at the DSP pin ``pin``."""
    return {p["start"].split("[")[0]: p["ns"] for p in result["paths"] if p["end_pin"] == pin}


def _analyze(h, family):
    return timing.analyze(h.netlist(), family, paths=1000, exceptions=[])


FAMILIES = ("xc7", "xcup")


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_unregistered_b_runs_through_the_multiplier_into_m(family):
    # The path: a register, 10 LUT levels, B of a DSP48E1 with BREG = 0 and MREG = 1.
    m = timing.MODELS[family]
    r = _analyze(_hand_dsp({"AREG": 1, "MREG": 1}, {"A": 0, "B": 10}), family)
    levels = 10 * (m.lut + m.net)
    assert _ends(r, "DSP48E1.B")["src_b"] == pytest.approx(m.ff_clk_to_q + m.net + levels + m.dsp_to_mreg)
    assert _ends(r, "DSP48E1.A")["src_a"] == pytest.approx(m.ff_clk_to_q + m.net + m.dsp_in_setup)
    # P is combinational from M (PREG = 0): M's clock-to-P, then a net into the capture register.
    assert _path_to(r, "prod")["ns"] == pytest.approx(m.dsp_mreg_to_p + m.net + m.ff_setup_d)
    assert _path_to(r, "prod")["start"] == "p_out[0]"


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_unregistered_b_without_m_ends_at_p(family):
    m = timing.MODELS[family]
    r = _analyze(_hand_dsp({"AREG": 1, "PREG": 1}, {"A": 0, "B": 10}), family)
    levels = 10 * (m.lut + m.net)
    assert _ends(r, "DSP48E1.B")["src_b"] == pytest.approx(
        m.ff_clk_to_q + m.net + levels + m.dsp_to_preg_mult)
    assert _path_to(r, "prod")["ns"] == pytest.approx(m.dsp_preg_to_p + m.net + m.ff_setup_d)


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_without_registers_is_combinational(family):
    m = timing.MODELS[family]
    r = _analyze(_hand_dsp({}, {"A": 2, "B": 1}), family)
    assert not _ends(r, "DSP48E1.A") and not _ends(r, "DSP48E1.B")
    p = _path_to(r, "prod")
    assert p["start"] == "src_a"
    assert p["ns"] == pytest.approx(m.ff_clk_to_q + m.net + 2 * (m.lut + m.net) + m.dsp_mult + m.net
                                    + m.ff_setup_d)
    assert p["cells"] == ["LUT1", "LUT1", "DSP48E1"]


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_registered_a_unregistered_b_no_m_no_p(family):
    # A's register starts a path through the multiplier; B runs through it combinationally.
    m = timing.MODELS[family]
    r = _analyze(_hand_dsp({"AREG": 1}, {"A": 0, "B": 3}), family)
    through_b = m.ff_clk_to_q + m.net + 3 * (m.lut + m.net) + m.dsp_mult
    p = _path_to(r, "prod")
    assert p["ns"] == pytest.approx(max(m.dsp_areg_to_p, through_b) + m.net + m.ff_setup_d)
    assert p["start"] == "src_b"


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_pre_adder(family):
    m = timing.MODELS[family]
    t0 = m.ff_clk_to_q + m.net
    # DSP48E1 with the D port: A and D go through the pre-adder into AD (ADREG = 1), B does not.
    r = _analyze(_hand_dsp({"USE_DPORT": "TRUE", "ADREG": 1, "MREG": 1}, {"A": 0, "B": 0, "D": 0}), family)
    ends = {pin: _ends(r, f"DSP48E1.{pin}")[f"src_{pin.lower()}"] for pin in "ABD"}
    assert ends == pytest.approx({"A": t0 + m.dsp_to_adreg, "D": t0 + m.dsp_to_adreg,
                                  "B": t0 + m.dsp_to_mreg})
    # Without ADREG they run through the pre-adder and the multiplier into M.
    r = _analyze(_hand_dsp({"USE_DPORT": "TRUE", "MREG": 1}, {"A": 0, "D": 1}), family)
    assert _ends(r, "DSP48E1.D")["src_d"] == pytest.approx(t0 + m.lut + m.net + m.dsp_preadd + m.dsp_to_mreg)
    # Without the D port, D is unused: no end point.
    r = _analyze(_hand_dsp({"MREG": 1}, {"A": 0, "D": 1}), family)
    assert not _ends(r, "DSP48E1.D")
    # A registered D (DREG = 1) ends at its register; P from AD through the multiplier (M off).
    r = _analyze(_hand_dsp({"USE_DPORT": "TRUE", "DREG": 1, "ADREG": 1}, {"D": 0}), family)
    assert _ends(r, "DSP48E1.D")["src_d"] == pytest.approx(t0 + m.dsp_in_setup)
    assert _path_to(r, "prod")["ns"] == pytest.approx(m.dsp_areg_to_p + m.net + m.ff_setup_d)
    # DSP48E2: the pre-adder is used when AMULTSEL or BMULTSEL is AD, on B with PREADDINSEL = B.
    e2 = {"AMULTSEL": "AD", "PREADDINSEL": "B", "PREG": 1}
    r = _analyze(_hand_dsp(e2, {"A": 0, "B": 0, "D": 0}, kind="DSP48E2"), family)
    assert _ends(r, "DSP48E2.B")["src_b"] == pytest.approx(t0 + m.dsp_preadd + m.dsp_to_preg_mult)
    assert _ends(r, "DSP48E2.D")["src_d"] == pytest.approx(t0 + m.dsp_preadd + m.dsp_to_preg_mult)
    assert _ends(r, "DSP48E2.A")["src_a"] == pytest.approx(t0 + m.dsp_to_preg_mult)


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_c_and_controls(family):
    m = timing.MODELS[family]
    t0 = m.ff_clk_to_q + m.net
    # Unregistered C and ALU controls end at P; INMODE (A/B/pre-adder select) at M.
    pins = {"A": 0, "C": 0, "OPMODE": 0, "ALUMODE": 0, "CARRYIN": 0, "INMODE": 0}
    r = _analyze(_hand_dsp({"AREG": 1, "MREG": 1, "PREG": 1}, pins), family)
    for pin in ("C", "OPMODE", "ALUMODE", "CARRYIN"):
        assert _ends(r, f"DSP48E1.{pin}")[f"src_{pin.lower()}"] == pytest.approx(t0 + m.dsp_to_preg_alu)
    assert _ends(r, "DSP48E1.INMODE")["src_inmode"] == pytest.approx(t0 + m.dsp_to_mreg)
    # Their own registers on: setup into them.
    regs = {"AREG": 1, "MREG": 1, "PREG": 1, "CREG": 1, "OPMODEREG": 1, "INMODEREG": 1}
    r = _analyze(_hand_dsp(regs, {"C": 0, "OPMODE": 0, "INMODE": 0}), family)
    for pin in ("C", "OPMODE", "INMODE"):
        assert _ends(r, f"DSP48E1.{pin}")[f"src_{pin.lower()}"] == pytest.approx(t0 + m.dsp_in_setup)
    # P off, M on: C runs through the ALU to P, where M's clock-to-P also arrives.
    r = _analyze(_hand_dsp({"AREG": 1, "MREG": 1}, {"A": 0, "C": 4}), family)
    assert not _ends(r, "DSP48E1.C")
    through_c = t0 + 4 * (m.lut + m.net) + m.dsp_alu
    assert _path_to(r, "prod")["ns"] == pytest.approx(max(m.dsp_mreg_to_p, through_c) + m.net + m.ff_setup_d)
    # P off, C registered: C's register clock-to-P.
    r = _analyze(_hand_dsp({"AREG": 1, "MREG": 1, "CREG": 1}, {"A": 0, "C": 0}), family)
    assert _path_to(r, "prod")["ns"] == pytest.approx(
        max(m.dsp_mreg_to_p, m.dsp_creg_to_p) + m.net + m.ff_setup_d)


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_clock_enables_and_resets_of_registers_that_are_off(family):
    m = timing.MODELS[family]
    r = _analyze(_hand_dsp({"MREG": 1}, {"A": 0, "RSTA": 0, "CEA2": 0, "RSTM": 1, "CEM": 0}), family)
    assert not _ends(r, "DSP48E1.RSTA") and not _ends(r, "DSP48E1.CEA2")
    assert _ends(r, "DSP48E1.RSTM")["src_rstm"] == pytest.approx(
        m.ff_clk_to_q + m.net + m.lut + m.net + m.dsp_ctrl_setup)
    assert _ends(r, "DSP48E1.CEM")["src_cem"] == pytest.approx(m.ff_clk_to_q + m.net + m.dsp_ctrl_setup)


@pytest.mark.parametrize("family", FAMILIES)
def test_dsp_cascades(family):
    # dsp1 (all registers) cascades A and P into dsp2 on dedicated routes (no net delay).
    m = timing.MODELS[family]
    h = _Hand()
    a, b = h.chain("src_a", 0, 2), h.chain("src_b", 0, 2)
    acout, pcout, p1, p2 = h.bits("acout", 2), h.bits("pcout", 2), h.bits("p1", 2), h.bits("p2", 2)
    h.cell("dsp1", "DSP48E1", {"CLK": h.clk, "A": a, "B": b}, {"P": p1, "ACOUT": acout, "PCOUT": pcout},
           {**_OFF, "AREG": 1, "ACASCREG": 1, "BREG": 1, "MREG": 1, "PREG": 1})
    h.cell("dsp2", "DSP48E1", {"CLK": h.clk, "ACIN": acout, "B": b, "PCIN": pcout}, {"P": p2},
           {**_OFF, "A_INPUT": "CASCADE", "BREG": 1, "MREG": 1, "PREG": 1})
    r = _analyze(h, family)
    assert _ends(r, "DSP48E1.ACIN")["acout"] == pytest.approx(m.dsp_cascade_clk_to_out + m.dsp_to_mreg)
    assert _ends(r, "DSP48E1.PCIN")["pcout"] == pytest.approx(m.dsp_preg_to_p + m.dsp_to_preg_alu)
    # Unregistered A: ACOUT follows A (and ACIN of the next one ends at its M).
    h2 = _Hand()
    a = h2.chain("src_a", 0, 2)
    acout, p1, p2 = h2.bits("acout", 2), h2.bits("p1", 2), h2.bits("p2", 2)
    h2.cell("dsp1", "DSP48E1", {"CLK": h2.clk, "A": a}, {"P": p1, "ACOUT": acout}, {**_OFF, "MREG": 1})
    h2.cell("dsp2", "DSP48E1", {"CLK": h2.clk, "ACIN": acout}, {"P": p2}, {**_OFF, "MREG": 1})
    r = _analyze(h2, family)
    assert _ends(r, "DSP48E1.ACIN")["src_a"] == pytest.approx(
        m.ff_clk_to_q + m.net + m.dsp_cascade + m.dsp_to_mreg)


def test_xcup_dsp_constants_are_ds925s():
    # The UltraScale+ DSP constants are the periods of DS925's DSP48 maximum frequencies (-1).
    m = timing.MODELS["xcup"]
    assert m.dsp_to_mreg == pytest.approx(1e3 / 645, abs=1e-3)
    assert m.dsp_to_preg_mult == pytest.approx(1e3 / 456, abs=1e-3)
    assert m.dsp_preadd == pytest.approx(1e3 / 338 - 1e3 / 456, abs=2e-3)
    assert m.lut == pytest.approx(timing.XCUP_SCALE * timing.MODELS["xc7"].lut)


# ----------------------------------------------------------------------------- exceptions vs RTL

def _settle_margin(pe, configs, trials=8, seed=1):
    """Cycles between the last change of a PE's configuration results (cfg_error, in_beats,
    out_beats) and its cfg_ready, after a configuration change, the least over random changes:
    a first hop of N cycles delays the results by N - 1."""
    import random

    from amaranth.sim import Simulator

    rng = random.Random(seed)
    outs = (pe.cfg_error, pe.in_beats, pe.out_beats)
    margins = []

    async def bench(ctx):
        for _ in range(trials):
            for cfg in (configs(rng), configs(rng)):
                for name, value in cfg.items():
                    ctx.set(getattr(pe, name), value)
                trace = []
                for _ in range(12):
                    trace.append((ctx.get(pe.cfg_ready), tuple(ctx.get(o) for o in outs)))
                    await ctx.tick()
            ready = next(k for k in range(12) if all(r for r, _ in trace[k:]))
            last = max([k for k in range(1, 12) if trace[k][1] != trace[k - 1][1]], default=0)
            margins.append(ready - last)

    sim = Simulator(pe)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return min(margins)


def _sizes(rng):
    size = lambda: rng.choice([1, 16, rng.randrange(1, 64), rng.randrange(1 << 16)])  # noqa: E731
    return {"a": size(), "b": size(), "c": size(), "d": size(), "shift": rng.randrange(-128, 128)}


def _pe3_config(rng):
    from insitu.accel.regmap import Op

    cfg = {**_sizes(rng), "op": rng.choice([int(Op.PE3), int(Op.PE3_PSG)]),
           "psg_tau": rng.randrange(1 << 32)}
    if rng.random() < 0.5:                       # a valid block: d divides a
        d = rng.randrange(1, 64)
        cfg.update(c=16, d=d, a=d * rng.randrange(1, 64))
    return cfg


def _lrt_config(rng):
    from insitu.accel.regmap import LRT_OPS

    return {**_sizes(rng), "op": rng.choice(sorted(int(o) for o in LRT_OPS)), "side": rng.randrange(2),
            "rows_l": rng.randrange(1 << 12), "rows_r": rng.randrange(1 << 12), "cols": rng.randrange(16)}


def test_declared_multicycle_paths_settle_before_cfg_ready():
    """Every declared multicycle path is a first hop from the top's configuration registers into
    a PE's configuration results, and that PE's cfg_ready leaves the cycles it needs (measured
    on the RTL). PE1/PE2 have no spare cycle, so none is declared for them."""
    from insitu.accel.params import DEFAULT_PARAMS
    from insitu.rtl.pe1 import PE1
    from insitu.rtl.pe3 import PE3
    from insitu.rtl.pe_lrt import PELRT

    pes = {"accel.pe3.config.": (PE3, _pe3_config), "accel.pe_lrt.config.": (PELRT, _lrt_config)}
    margins = {}
    assert timing.EXCEPTIONS
    for e in timing.EXCEPTIONS:
        assert e.cycles and e.start == "accel.cfg_*" and e.reason
        scope = next((s for s in pes if e.end.startswith(s)), None)
        assert scope, f"{e.end}: no check of this exception"
        if scope not in margins:
            cls, configs = pes[scope]
            margins[scope] = _settle_margin(cls(DEFAULT_PARAMS), configs)
        assert margins[scope] >= e.cycles - 1, (e.end, margins[scope])
    assert _settle_margin(PE1(DEFAULT_PARAMS), lambda rng: {**_sizes(rng), "op": 1}, trials=4) == 0
    assert not [e for e in timing.EXCEPTIONS if ".pe1." in e.end or ".pe2." in e.end]


def test_multicycle_xdc_has_setup_and_hold():
    rule = timing.PathException(start="accel.cfg_*", end="accel.pe3.config.*", cycles=3, reason="r")
    xdc = timing.xdc_exceptions_text([rule])
    src = "[get_cells -hierarchical -filter {NAME =~ *accel/cfg_*_reg*}]"
    dst = "[get_cells -hierarchical -filter {NAME =~ *accel/pe3/config/* && IS_PRIMITIVE}]"
    assert f"set_multicycle_path 3 -setup -from {src} -to {dst}" in xdc
    assert f"set_multicycle_path 2 -hold -from {src} -to {dst}" in xdc
    with pytest.raises(ValueError):
        timing.xdc_exceptions_text([timing.PathException(start="accel.cfg_*", cycles=2)])
    # With the Verilog, registers are named as Amaranth wrote them: `cfg_a` is an alias of `a`.
    verilog = """module \\top.accel (clk);
  reg [15:0] a = 16'h0000;
  reg \\x$3 ;
  wire [15:0] cfg_a;
  assign cfg_a = a;
endmodule
module \\top.accel.pe3.config (clk);
  reg [7:0] x0 = 8'h00;
endmodule
"""
    xdc = timing.xdc_exceptions_text([rule], verilog)
    assert "-from [get_cells -hierarchical -filter {NAME =~ *accel/a_reg*}] -to " + dst in xdc
    lrt = timing.PathException(start="accel.cfg_*", end="accel.pe_lrt.config.in_beats", cycles=2)
    assert "left out: accel.pe_lrt.config.in_beats names no register" in timing.xdc_exceptions_text(
        [lrt], verilog)


def test_declared_exceptions_name_registers_of_the_top_level():
    """The XDC of the declared exceptions names the registers of the reference design's Verilog
    (~10 s: the top level's conversion): the top's configuration registers as Amaranth writes
    them, and every exception is written."""
    xdc = timing.xdc_exceptions_text()
    assert "left out" not in xdc
    assert xdc.count("set_multicycle_path") == 2 * len(timing.EXCEPTIONS)
    for reg in ("op", "a", "b", "c", "d", "shift", "psg_tau", "rows_l", "rows_r", "cols", "side"):
        assert f"NAME =~ *accel/{reg}_reg*" in xdc
    assert "*accel/pe_lrt/config/cfg_error_reg*" in xdc and "*accel/pe_lrt/config/in_beats_reg*" in xdc
