"""The accelerator: AXI-Lite control plane, AXI-Stream data plane, and the four PEs behind them.

``Accelerator`` is the design; ``AcceleratorTop`` is the thin Vivado-facing wrapper with the port
names Vivado's IP packager infers interfaces from (``aclk``, ``aresetn``, ``s_axi_control_*``,
``s_axis_*``, ``m_axis_*``).

Control (registers of :mod:`insitu.accel.regmap`):

* while idle, the PEs see the live configuration registers (one cycle later), so IN_BEATS /
  OUT_BEATS show what the configured op will move (the PEs settle them within a few cycles of a
  configuration write: PE1/PE2 5, PE3 6, the LRT PE 2); CTRL.START freezes the configuration and checks it
  two cycles later (the selected PE's verdict is registered), or once the selected PE's
  ``cfg_ready`` says its checks have settled:
  an unknown OP or a PE's ``cfg_error`` ends the op at once with STATUS.ERROR and ERROR_CODE
  (nothing starts, nothing hangs); otherwise the PE starts and STATUS.BUSY is set;
* a START while busy is ignored (the running op is unaffected);
* the op ends when the PE drops ``busy``: STATUS.DONE; CYCLES holds START-to-done cycles;
* CTRL.ABORT, or an input stream whose TLAST does not come exactly on the op's last beat, holds
  the running PE in reset for a cycle (the cycle after; a registered reset per PE) and ends the
  op with ERROR (ABORTED / STREAM_SHORT /
  STREAM_LONG); the other PEs keep their state;
* TLAST on the output marks the op's last beat (OUT_BEATS), so an AXI DMA S2MM transfer ends
  exactly there.
"""

from __future__ import annotations

from amaranth.hdl import Cat, ClockDomain, Elaboratable, Module, Mux, ResetInserter, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from .axil import AXILiteRegisters, AXILiteSignature
from insitu.accel.params import DEFAULT_PARAMS, STREAM_BITS, AcceleratorParams
from .pe1 import PE1
from .pe2 import PE2
from .pe3 import PE3
from .pe_lrt import PELRT
from insitu.accel.regmap import LRT_OPS, ErrorCode, Op


def axi_stream_signature(width: int = STREAM_BITS) -> wiring.Signature:
    """An AXI4-Stream source (flip it for a sink): TDATA, TVALID, TREADY, TLAST, TKEEP."""
    return wiring.Signature({
        "tdata": Out(width),
        "tvalid": Out(1),
        "tready": In(1),
        "tlast": Out(1),
        "tkeep": Out(width // 8),
    })


class _State(enum.Enum, shape=2):
    IDLE = 0
    CHECK = 1
    LAUNCH = 2
    BUSY = 3


class Accelerator(wiring.Component):
    """The whole accelerator in the ``sync`` domain (see the module docstring)."""

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS):
        self.params = params
        super().__init__({
            "s_axi": In(AXILiteSignature),
            "s_axis": In(axi_stream_signature()),
            "m_axis": Out(axi_stream_signature()),
            "done_irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        m.submodules.regs = regs = AXILiteRegisters(params=p)
        wiring.connect(m, wiring.flipped(self.s_axi), regs.bus)

        pes = {"pe1": PE1(p), "pe2": PE2(p), "pe3": PE3(p), "pe_lrt": PELRT(p)}
        pe_reset = Signal()                     # this cycle ends the op in error
        ops_of = {"pe1": (Op.PE1,), "pe2": (Op.PE2,), "pe3": (Op.PE3, Op.PE3_PSG), "pe_lrt": sorted(LRT_OPS)}
        # Which PE OP names: registers that follow OP with the configuration (below), so the
        # stream routing, the resets and the selected PE's view start from a flip-flop, not from
        # an 8-bit compare.
        selected = {name: Signal(name=f"sel_{name}", init=int(0 in ops_of[name])) for name in pes}
        for name, pe in pes.items():
            # ABORT resets the running PE only: the others keep their state (the LRT results).
            # One registered reset per PE, a cycle after the error (the op is over and the
            # streams are off by then): the TLAST compare does not drive thousands of resets.
            rst = Signal(name=f"rst_{name}")
            m.d.sync += rst.eq(pe_reset & selected[name])
            m.submodules[name] = ResetInserter(rst)(pe)

        state = Signal(_State)
        frozen = Signal()                       # configuration latched (not idle)
        m.d.comb += frozen.eq(state != _State.IDLE)

        self._configuration(m, regs, pes, ops_of, selected, frozen)

        view = self._selected_view(m, pes, selected)
        any_selected, cfg_error, in_beats, out_beats, pe_busy, cfg_go, cfg_bad = view
        # CHECK decides on the selected PE's verdict as registered a cycle before (its cfg_ready
        # compares the configuration with the last cycle's, a wide compare that should not reach
        # ERROR's enables), and so not in its first cycle: the configuration latched with START
        # may have changed in that very cycle, which only the next cycle's verdict has seen.
        check_first = Signal(name="check_first")
        go, bad = Signal(name="cfg_go_r"), Signal(name="cfg_bad_r")
        error_of_pe = Signal(8, name="cfg_error_r")
        m.d.sync += [go.eq(cfg_go), bad.eq(cfg_bad), error_of_pe.eq(cfg_error)]
        # (Not registered: the driver reads IN_BEATS right after its configuration writes.)
        m.d.comb += [regs.in_beats.eq(in_beats), regs.out_beats.eq(out_beats)]
        # The op's last input / output beat index, latched at launch: the per-beat TLAST checks
        # compare the beat counters with registers, not with the PEs' beat arithmetic.
        in_last, out_last = Signal(32, name="in_last"), Signal(32, name="out_last")
        has_in = Signal(name="has_in")

        # Status registers.
        done, error = Signal(name="done"), Signal(name="error")
        error_code, cycles = Signal(8, name="error_code"), Signal(32, name="cycles")
        beats_in, beats_out = Signal(32, name="beats_in"), Signal(32, name="beats_out")
        m.d.comb += [
            regs.status.eq(frozen | (done << 1) | (error << 2)),
            regs.error_code.eq(error_code),
            regs.cycles.eq(cycles),
            regs.beats_done_in.eq(beats_in),
            regs.beats_done_out.eq(beats_out),
            self.done_irq.eq(done | error),
        ]
        start_cmd, abort_cmd = regs.ctrl[0], regs.ctrl[1]
        with m.If(frozen & (cycles != (1 << 32) - 1)):
            m.d.sync += cycles.eq(cycles + 1)

        # Streams: only the selected PE, only while it runs (BUSY).
        active = {name: Signal(name=f"active_{name}") for name in pes}
        launch = {name: Signal(name=f"start_{name}") for name in pes}
        in_fire, out_fire = self._streams(m, pes, active, launch, beats_out == out_last)
        with m.If(in_fire):
            m.d.sync += beats_in.eq(beats_in + 1)
        with m.If(out_fire):
            m.d.sync += beats_out.eq(beats_out + 1)
        # TLAST must come exactly on the op's last input beat (an AXI DMA transfer of IN_BEATS).
        # Registered: found a cycle after the beat, so that the PEs' TREADY (through in_fire)
        # does not run on into ERROR, the state and the per-PE resets. The PE is still busy
        # then (it has a beat to process), so no op ends in between.
        short, long = Signal(name="short"), Signal(name="long")
        m.d.sync += [short.eq(in_fire & self.s_axis.tlast & has_in & (beats_in < in_last)),
                     long.eq(in_fire & ~self.s_axis.tlast & (beats_in == in_last))]

        def fail(code):
            m.d.sync += [error.eq(1), error_code.eq(code), state.eq(_State.IDLE)]
            m.d.sync += [active[name].eq(0) for name in pes]

        with m.Switch(state):
            with m.Case(_State.IDLE):
                with m.If(start_cmd):
                    m.d.sync += [state.eq(_State.CHECK), check_first.eq(1), done.eq(0), error.eq(0),
                                 error_code.eq(ErrorCode.NONE), cycles.eq(0),
                                 beats_in.eq(0), beats_out.eq(0)]
            with m.Case(_State.CHECK):
                # A PE that computes its checks over a few cycles holds CHECK until they have
                # settled on the frozen configuration (at once when START follows the writes by
                # more than that).
                # (Latched in every CHECK cycle: the last one, the launch, keeps them.)
                m.d.sync += [has_in.eq(in_beats != 0), in_last.eq(in_beats - 1),
                             out_last.eq(out_beats - 1), check_first.eq(0)]
                with m.If(check_first):
                    pass
                with m.Elif(~any_selected):
                    fail(ErrorCode.BAD_OP)
                with m.Elif(bad):
                    fail(error_of_pe)
                with m.Elif(go):
                    m.d.sync += state.eq(_State.LAUNCH)
                    m.d.sync += [launch[name].eq(selected[name]) for name in pes]
            with m.Case(_State.LAUNCH):
                # (the selected PE's start is high in this cycle)
                m.d.sync += state.eq(_State.BUSY)
                m.d.sync += [active[name].eq(selected[name]) for name in pes]
            with m.Case(_State.BUSY):
                with m.If(abort_cmd | short | long):
                    m.d.comb += pe_reset.eq(1)
                    fail(Mux(short, ErrorCode.STREAM_SHORT,
                             Mux(long, ErrorCode.STREAM_LONG, ErrorCode.ABORTED)))
                with m.Elif(~pe_busy):
                    m.d.sync += [done.eq(1), state.eq(_State.IDLE)]
                    m.d.sync += [active[name].eq(0) for name in pes]
        return m

    def _configuration(self, m, regs, pes, ops_of, selected, frozen):
        """The configuration the PEs see: it follows the registers while idle and is frozen from
        START to the end of the op; with it, which PE OP selects (registers too)."""
        # Configuration: follows the registers while idle, frozen from START to the end.
        # Named, so timing paths and waveforms read `cfg_a`, not `$signal$172`.
        shapes = {"op": 8, "a": 16, "b": 16, "c": 16, "d": 16, "shift": regs.shift.shape(),
                  "side": 1, "rows_l": 16, "rows_r": 16, "cols": 8, "recip": 16,
                  "psg_tau": regs.psg_tau.shape()}
        cfg = {k: Signal(shape, name=f"cfg_{k}") for k, shape in shapes.items()}
        live = {
            "op": regs.op, "a": regs.size_a, "b": regs.size_b, "c": regs.size_c, "d": regs.size_d,
            "shift": regs.shift, "side": regs.lrt_side, "rows_l": regs.lrt_rows_l,
            "rows_r": regs.lrt_rows_r, "cols": regs.lrt_cols, "recip": regs.lrt_recip,
            "psg_tau": regs.psg_tau,
        }
        with m.If(~frozen):
            m.d.sync += [cfg[k].eq(live[k]) for k in cfg]
            m.d.sync += [selected[name].eq(Cat(live["op"] == op for op in ops_of[name]).any())
                         for name in pes]

        for name, pe in pes.items():
            m.d.comb += [getattr(pe, k).eq(cfg[k]) for k in ("op", "a", "b", "c", "d", "shift")]
        lrt = pes["pe_lrt"]
        m.d.comb += [getattr(lrt, k).eq(cfg[k]) for k in ("side", "rows_l", "rows_r", "cols", "recip")]
        m.d.comb += [
            regs.lrt_norm2_lo.eq(lrt.norm2[:32]),
            regs.lrt_norm2_hi.eq(lrt.norm2[32:]),
            regs.lrt_writes_max.eq(lrt.writes_max),
            regs.lrt_writes_total.eq(lrt.writes_total),
        ]
        pe3 = pes["pe3"]
        m.d.comb += [
            pe3.psg_tau.eq(cfg["psg_tau"]),
            regs.psg_predicted.eq(pe3.psg_predicted),
            regs.psg_max.eq(pe3.psg_max),
        ]

    def _selected_view(self, m, pes, selected):
        """What the top reads of the PE that OP selects, as AND-OR selects (one PE at most):
        any_selected, cfg_error, in_beats, out_beats, busy, and CHECK's outcome (go, bad)."""
        # (Zeros when OP names no PE.)
        # CHECK's outcome is formed per PE from its own registers (settled and accepted, settled
        # and refused); the select enters last, so OP's select fans out into one gate level.
        any_selected = Signal()
        cfg_error = Signal(8, name="cfg_error")
        in_beats, out_beats = Signal(32, name="in_beats"), Signal(32, name="out_beats")
        pe_busy = Signal(name="pe_busy")
        cfg_go, cfg_bad = Signal(name="cfg_go"), Signal(name="cfg_bad")
        m.d.comb += any_selected.eq(Cat(*selected.values()).any())
        m.d.comb += [
            cfg_error.eq(_select(selected, {n: pe.cfg_error for n, pe in pes.items()})),
            in_beats.eq(_select(selected, {n: pe.in_beats for n, pe in pes.items()})),
            out_beats.eq(_select(selected, {n: pe.out_beats for n, pe in pes.items()})),
            pe_busy.eq(_select(selected, {n: pe.busy for n, pe in pes.items()})),
            cfg_go.eq(_select(selected, {n: pe.cfg_ready & (pe.cfg_error == 0)
                                         for n, pe in pes.items()})),
            cfg_bad.eq(_select(selected, {n: pe.cfg_ready & (pe.cfg_error != 0)
                                          for n, pe in pes.items()})),
        ]
        return any_selected, cfg_error, in_beats, out_beats, pe_busy, cfg_go, cfg_bad

    def _streams(self, m, pes, active, launch, last_out):
        """The AXI-Streams to and from the selected PE, only while it runs (BUSY). ``active_*``
        and ``start_*`` are registers set with the state: a PE's stream handshakes and start
        come from a flip-flop through one gate, not from the state and OP decode. Returns the
        input and output handshakes (``in_fire``, ``out_fire``); ``last_out`` is TLAST."""
        in_fire = Signal()
        out_fire = Signal()
        for name, pe in pes.items():
            m.d.sync += launch[name].eq(0)
            m.d.comb += [
                pe.start.eq(launch[name]),
                pe.s.payload.eq(self.s_axis.tdata),
                pe.s.valid.eq(self.s_axis.tvalid & active[name]),
                pe.m.ready.eq(self.m_axis.tready & active[name]),
            ]
            with m.If(active[name]):
                m.d.comb += [
                    self.s_axis.tready.eq(pe.s.ready),
                    self.m_axis.tdata.eq(pe.m.payload),
                    self.m_axis.tvalid.eq(pe.m.valid),
                ]
        m.d.comb += [
            in_fire.eq(self.s_axis.tvalid & self.s_axis.tready),
            out_fire.eq(self.m_axis.tvalid & self.m_axis.tready),
            self.m_axis.tlast.eq(last_out),
            self.m_axis.tkeep.eq(-1),
        ]
        return in_fire, out_fire


def _select(selected: dict, values: dict):
    """OR over the PEs of ``values[name]`` where ``selected[name]`` (at most one is high)."""
    out = 0
    for name, value in values.items():
        out = out | Mux(selected[name], value, 0)
    return out


class AcceleratorTop(Elaboratable):
    """The Vivado-facing top level: ``aclk``, active-low ``aresetn`` and AXI port names that
    Vivado's packager infers (``s_axi_control_*``, ``s_axis_*``, ``m_axis_*``)."""

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS):
        self.params = params
        self.aclk = Signal()
        self.aresetn = Signal()
        self.interrupt = Signal()
        self.axil = {name: Signal(member.shape, name=f"s_axi_control_{name}")
                     for name, member in AXILiteSignature.members.items()}
        stream = axi_stream_signature().members
        self.s_axis = {name: Signal(member.shape, name=f"s_axis_{name}") for name, member in stream.items()}
        self.m_axis = {name: Signal(member.shape, name=f"m_axis_{name}") for name, member in stream.items()}

    def ports(self) -> list[Signal]:
        return [self.aclk, self.aresetn, self.interrupt, *self.axil.values(), *self.s_axis.values(),
                *self.m_axis.values()]

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = cd = ClockDomain("sync")
        m.d.comb += [cd.clk.eq(self.aclk), cd.rst.eq(~self.aresetn)]
        m.submodules.accel = accel = Accelerator(self.params)
        m.d.comb += self.interrupt.eq(accel.done_irq)
        for name, member in AXILiteSignature.members.items():
            inner, outer = getattr(accel.s_axi, name), self.axil[name]
            # The slave's inputs are the signature's "Out" members (seen from the master).
            m.d.comb += (inner.eq(outer) if member.flow == Out else outer.eq(inner))
        for name, member in axi_stream_signature().members.items():
            sink, source = getattr(accel.s_axis, name), self.s_axis[name]
            m.d.comb += (sink.eq(source) if member.flow == Out else source.eq(sink))
            out_inner, out_outer = getattr(accel.m_axis, name), self.m_axis[name]
            m.d.comb += (out_outer.eq(out_inner) if member.flow == Out else out_inner.eq(out_outer))
        return m

