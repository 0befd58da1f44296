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
