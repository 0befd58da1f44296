"""The twin's models of the programmable logic: they serve the accelerator's registers and streams.

Interchangeable models of the same hardware, behind one small interface (``axil_read``,
``axil_write``, ``advance``, ``cycles``, ``in_flight``):

* :class:`CompiledRTLModel` runs the accelerator's RTL itself, its generated Verilog compiled
  with Verilator (:mod:`insitu.rtl.compiled`): every register access is an AXI-Lite transaction
  on the design's bus and every stream word is a beat on its AXI-Streams, stepped in C++.
  Exact, including CYCLES, at a few hundred thousand cycles per second (``--mode rtl``).
* :class:`RTLModel` runs the same RTL (:class:`insitu.rtl.top.Accelerator`) in Amaranth's
  simulator, cycle for cycle as the compiled model does (the same CYCLES), at about a thousand
  cycles per second: the reference the compiled model is checked against (``--mode rtl-amaranth``).
* :class:`FunctionalModel` serves the same registers and streams from the bit-exact golden
  models (:mod:`insitu.tt.pe_stream`, :class:`insitu.lrt.pe_ops.LRTPEModel`) with CYCLES from
  their cycle models: for long runs.

Every model is built with the design's :class:`~insitu.accel.params.AcceleratorParams` (the
twin's board's, from its overlay): the RTL models elaborate (and the compiled one builds and
caches) that design, the functional model checks configurations against its bounds and estimates
its cycles (``pe_stream.estimated_cycles(cfg, params)``).

Both RTL models run in the driver's own process and are stepped from it (a register read
advances the clock), so the twin needs no second process, socket or protocol between the driver
and the simulator; cocotb (on Verilator or Icarus) on the generated Verilog stays the RTL's own
verification (``tests/rtl``).

The streams meet the twin's AXI DMA model (:class:`insitu.fpga.twin.AxiDmaModel`) through
``dma.input_beats()`` / ``dma.pop_input(n)`` / ``dma.unpop_input(n)`` and ``dma.output_room()`` /
``dma.push_output(...)``.
"""

from __future__ import annotations

from collections import deque
from typing import cast

import numpy as np

from insitu.lrt.pe_ops import REGISTER_NAMES as LRT_ATTRS
from insitu.lrt.pe_ops import LRTPEModel
from insitu.accel.params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams
from insitu.accel.regmap import LRT_OPS, OFFSETS, PE_OPS, REGISTERS, ErrorCode, Op, reset_value
from insitu.accel import stream
from insitu.tt import pe_stream

from .regs import ABORT, BUSY, DONE, ERROR, START, decode

_BY_OFFSET = {r.offset: r for r in REGISTERS}
_TT_KINDS = {op: kind for kind, op in PE_OPS.items()}
#: The ops of PE3: an op of these that ends in ERROR resets PE3, and with it the PSG registers.
_PE3_OPS = (Op.PE3, Op.PE3_PSG)
_U32 = (1 << 32) - 1
_CTRL_OFFSET = OFFSETS["CTRL"]
#: The Amaranth simulator's clock when no board clock is given (only simulated time depends on
#: it: the models count cycles).
_SIM_CLOCK_HZ = 100_000_000


class FunctionalModel:
    """The accelerator as the golden models compute it (see the module docstring).

    It follows the control plane of :mod:`insitu.rtl.top`: configuration errors at START, TLAST
    checks (STREAM_SHORT / STREAM_LONG), ABORT, DONE when the last output beat has left. An op
    computes when its whole input has arrived, so an op cut short leaves the PE's state as it
    was (the RTL may leave LRT memories partly written; either way the op ends in ERROR).
    """

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS, version: int | None = None):
        self.params = params
        self.lrt = LRTPEModel(params)
        self.regs = {r.name: reset_value(r, params) for r in REGISTERS if r.access != "wo"}
        if version is not None:
            self.regs["VERSION"] = version
        self.busy = False
        self.op: dict | None = None             # the running op's configuration (set at START)
        self.inputs: list[np.ndarray] = []
        self.outputs = np.zeros(0, np.int64)

    # ----------------------------------------------------------------------------- bus
    def axil_read(self, offset: int) -> int:
        reg = _BY_OFFSET.get(offset)
        if reg is None or reg.access == "wo":
            return 0
        if not self.busy and reg.name in ("IN_BEATS", "OUT_BEATS"):
            self._beats_of_config()
        return self.regs[reg.name] & _U32

    def axil_write(self, offset: int, value: int) -> None:
        reg = _BY_OFFSET.get(offset)
        if reg is None or reg.access == "ro":
            return
        if reg.access == "rw":
            if not self.busy:          # the RTL freezes the configuration while an op runs
                self.regs[reg.name] = value & ((1 << reg.width) - 1)
            return
        if value & START and not self.busy:
            self._start()
        elif value & ABORT and self.busy:
            self._fail(ErrorCode.ABORTED)

    # ----------------------------------------------------------------------------- ops
    def _config(self) -> dict:
        return {r.name: decode(r, self.regs[r.name]) for r in REGISTERS if r.access == "rw"}

    def _tt_config(self, cfg: dict) -> pe_stream.PEConfig:
        sizes = (cfg["SIZE_A"], cfg["SIZE_B"], cfg["SIZE_C"], cfg["SIZE_D"], cfg["SHIFT"])
        if cfg["OP"] == Op.PE3_PSG:
            return pe_stream.PSGConfig("PE3_PSG", *sizes, cfg["PSG_TAU"])
        return pe_stream.PEConfig(_TT_KINDS[Op(cfg["OP"])], *sizes)

    def _configure_lrt(self, cfg: dict) -> None:
        for attr, name in LRT_ATTRS.items():
            setattr(self.lrt, attr, cfg[name])

    def _error_and_beats(self) -> tuple[int, int, int]:
        cfg = self._config()
        op = cfg["OP"]
        if op in _TT_KINDS:
            tt = self._tt_config(cfg)
            code = pe_stream.cfg_error(tt, self.params)
            in_beats, out_beats = (tt.in_beats(), tt.out_beats()) if not code else (0, 0)
            return code, in_beats, out_beats
        if op in LRT_OPS:
            self._configure_lrt(cfg)
            code = self.lrt.cfg_error(op)
            in_beats, out_beats = ((self.lrt.in_beats(op), self.lrt.out_beats(op)) if not code
                                   else (0, 0))
            return code, in_beats, out_beats
        return ErrorCode.BAD_OP, 0, 0

    def _beats_of_config(self) -> None:
        _, self.regs["IN_BEATS"], self.regs["OUT_BEATS"] = self._error_and_beats()

    def _start(self) -> None:
        code, in_beats, out_beats = self._error_and_beats()
        self.regs.update(STATUS=0, ERROR_CODE=0, CYCLES=0, BEATS_DONE_IN=0, BEATS_DONE_OUT=0,
                         IN_BEATS=in_beats, OUT_BEATS=out_beats)
        if code:
            self._fail(code)
            return
        self.busy, self.op, self.inputs = True, self._config(), []
        self.outputs = np.zeros(0, np.int64)
        self.regs["STATUS"] = BUSY
        if self.op["OP"] == Op.PE3_PSG:
            self.regs.update(PSG_PREDICTED=0, PSG_MAX=0)
        if in_beats == 0:
            self._compute()

    def _fail(self, code: int) -> None:
        if self.busy and self.op is not None and self.op["OP"] in _PE3_OPS:   # (busy: op is set)
            # the RTL holds the running PE in reset: PE3's PSG registers clear
            self.regs.update(PSG_PREDICTED=0, PSG_MAX=0)
        self.busy = False
        self.regs.update(STATUS=ERROR, ERROR_CODE=int(code))

    def _compute(self) -> None:
        cfg = self.op
        assert cfg is not None                  # set at START
        words = np.concatenate(self.inputs) if self.inputs else np.zeros(0, np.int64)
        if cfg["OP"] in _TT_KINDS:
            tt = self._tt_config(cfg)
            lhs, rhs = pe_stream.operands_from_stream(tt, words)
            if tt.kind == "PE3_PSG":
                run = pe_stream.psg_run(cast(pe_stream.PSGConfig, tt), lhs, rhs)
                self.outputs = pe_stream.pack_out(tt, run.out)
                self.regs.update(PSG_PREDICTED=run.predicted_count, PSG_MAX=run.peak)
            else:
                self.outputs = pe_stream.reference_stream_out(tt, lhs, rhs)
            cycles = pe_stream.estimated_cycles(tt, self.params)
        else:
            self._configure_lrt(cfg)
            cycles = self.lrt.cycles(cfg["OP"])
            self.outputs = self.lrt.execute(cfg["OP"], stream.from_words(words))
            self.regs.update(LRT_NORM2_LO=self.lrt.norm2 & _U32, LRT_NORM2_HI=self.lrt.norm2 >> 32,
                             LRT_WRITES_MAX=self.lrt.writes_max, LRT_WRITES_TOTAL=self.lrt.writes_total)
        self.regs["CYCLES"] = min(cycles, _U32)
        self._finish_if_sent()

    def _finish_if_sent(self) -> None:
        if self.regs["BEATS_DONE_OUT"] == self.regs["OUT_BEATS"]:
            self.busy = False
            self.regs["STATUS"] = DONE

    # ----------------------------------------------------------------------------- streams
    def advance(self, dma) -> None:
        """Move what the streams can move now: take input beats, compute, send output beats."""
        if not self.busy:
            return
        need = self.regs["IN_BEATS"] - self.regs["BEATS_DONE_IN"]
        while need and dma.input_beats():
            words, last = dma.pop_input(need)
            got = words.size // STREAM_WORDS
            self.inputs.append(words)
            self.regs["BEATS_DONE_IN"] += got
            need -= got
            if last and need:
                self._fail(ErrorCode.STREAM_SHORT)
                return
            if not last and not need:
                self._fail(ErrorCode.STREAM_LONG)
                return
            if not need:
                self._compute()
        if need or not self.busy:
            return
        sent = self.regs["BEATS_DONE_OUT"]
        room = min(dma.output_room(), self.regs["OUT_BEATS"] - sent)
        if room:
            chunk = self.outputs[sent * STREAM_WORDS:(sent + room) * STREAM_WORDS]
            dma.push_output(chunk, last=sent + room == self.regs["OUT_BEATS"])
            self.regs["BEATS_DONE_OUT"] = sent + room
            self._finish_if_sent()


class RTLModel:
    """The accelerator's RTL in Amaranth's simulator, stepped by the twin (module docstring).

    One testbench serves requests in order: an AXI-Lite write or read (the design's own bus
    handshakes), or stream cycles. Stream cycles run while an op is in flight and stop when it
    ends (the design's interrupt output), when it waits for input the DMA does not have, when it
    waits for room the DMA does not have, or after ``cycles_per_advance`` cycles (the driver's
    next poll goes on from there).
    """

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS, cycles_per_advance: int = 4096,
                 clock_hz: int | None = None):
        from amaranth.sim import Simulator

        from insitu.rtl.top import Accelerator

        self.params = params
        self.cycles_per_advance = cycles_per_advance
        self.dut = Accelerator(params)
        self.sim = Simulator(self.dut)
        # The board's clock: simulated time (waveforms) in the board's seconds.
        self.sim.add_clock(1 / (clock_hz or _SIM_CLOCK_HZ))
        self.requests: deque = deque()
        self.in_flight = False          # a START was written and the op has not ended
        self.cycles = 0                 # simulated clock cycles so far
        self.sim.add_testbench(self._bench)

    # Requests are (kind, args, result list); the testbench appends the result when done.
    def _call(self, kind: str, *args):
        result: list = []
        self.requests.append((kind, args, result))
        while not result:
            self.sim.advance()
        return result[0]

    def axil_write(self, offset: int, value: int) -> None:
        self._call("write", offset, value)
        if offset == _CTRL_OFFSET and value & START:
            self.in_flight = True

    def axil_read(self, offset: int) -> int:
        return self._call("read", offset)

    def advance(self, dma) -> None:
        if self.in_flight:
            self._call("stream", dma)

    async def _bench(self, ctx):
        # (Amaranth's Component makes its ports from its signature when built: pyright does not
        # see them.)
        bus, s, m = self.dut.s_axi, self.dut.s_axis, self.dut.m_axis  # pyright: ignore[reportAttributeAccessIssue]
        ctx.set(bus.bready, 1)
        ctx.set(bus.rready, 1)
        while True:
            if not self.requests:
                await ctx.tick()
                self.cycles += 1
                continue
            kind, args, result = self.requests.popleft()
            if kind == "write":
                result.append(await self._write(ctx, bus, *args))
            elif kind == "read":
                result.append(await self._read(ctx, bus, *args))
            else:
                result.append(await self._stream(ctx, s, m, *args))

    async def _tick(self, ctx):
        await ctx.tick()
        self.cycles += 1

    async def _write(self, ctx, bus, offset, value):
        ctx.set(bus.awaddr, offset)
        ctx.set(bus.wdata, value)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        aw = w = False
        while not (aw and w):
            aw_now, w_now = ctx.get(bus.awready), ctx.get(bus.wready)
            await self._tick(ctx)
            if aw_now:
                aw = True
                ctx.set(bus.awvalid, 0)
            if w_now:
                w = True
                ctx.set(bus.wvalid, 0)
        while not ctx.get(bus.bvalid):
            await self._tick(ctx)
        await self._tick(ctx)           # the response handshake (bready is held high)
        return True

    async def _read(self, ctx, bus, offset):
        ctx.set(bus.araddr, offset)
        ctx.set(bus.arvalid, 1)
        while not ctx.get(bus.arready):
            await self._tick(ctx)
        await self._tick(ctx)
        ctx.set(bus.arvalid, 0)
        while not ctx.get(bus.rvalid):
            await self._tick(ctx)
        data = ctx.get(bus.rdata)
        await self._tick(ctx)
        return int(data)

    async def _stream(self, ctx, s, m, dma):
        pending_in: deque = deque()
        for _ in range(self.cycles_per_advance):
            # (a port, as in _bench)
            if ctx.get(self.dut.done_irq):  # pyright: ignore[reportAttributeAccessIssue]
                self.in_flight = False
                break
            if not pending_in and dma.input_beats():
                words, last = dma.pop_input(1)
                pending_in.append((stream.beats(words)[0], last))
            if pending_in:
                beat, last = pending_in[0]
                ctx.set(s.tdata, beat)
                ctx.set(s.tlast, last)
            ctx.set(s.tvalid, bool(pending_in))
            room = dma.output_room() > 0
            ctx.set(m.tready, room)
            took = bool(pending_in) and ctx.get(s.tready)
            gave = room and ctx.get(m.tvalid)
            if gave:
                dma.push_output(stream.words_of([ctx.get(m.tdata)]), last=bool(ctx.get(m.tlast)))
            starved = not pending_in and ctx.get(s.tready)
            blocked = not room and ctx.get(m.tvalid)
            await self._tick(ctx)
            if took:
                pending_in.popleft()
            if (starved or blocked) and not (took or gave):
                break
        ctx.set(s.tvalid, 0)
        ctx.set(m.tready, 0)
        if pending_in:
            dma.unpop_input(len(pending_in))
        return True


class CompiledRTLModel:
    """The accelerator's RTL compiled with Verilator (module docstring), with the request
    protocol and stream rules of :class:`RTLModel` (so CYCLES agree cycle for cycle); the
    per-cycle loop runs in C++ (``insitu/rtl/compiled_twin.cpp``), and beats cross between the
    DMA model and the design in batches: everything the DMA offers (up to one advance's worth)
    goes in, the beats the design did not take go back.
    """

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS, cycles_per_advance: int = 4096,
                 clock_hz: int | None = None):
        from insitu.rtl.compiled import CompiledTwin

        # (clock_hz: the RTLModel's interface; the compiled model counts cycles, it keeps no time)
        self.params = params
        self.cycles_per_advance = cycles_per_advance
        self.twin = CompiledTwin(params)
        self.in_flight = False          # a START was written and the op has not ended

    @property
    def cycles(self) -> int:
        """Simulated clock cycles so far."""
        return self.twin.cycles

    def axil_write(self, offset: int, value: int) -> None:
        self.twin.write(offset, value)
        if offset == _CTRL_OFFSET and value & START:
            self.in_flight = True

    def axil_read(self, offset: int) -> int:
        return self.twin.read(offset)

    def advance(self, dma) -> None:
        if not self.in_flight:
            return
        limit = self.cycles_per_advance
        # At most one beat per cycle moves: offer no more than the advance can take.
        offered = min(dma.input_beats(), limit)
        words, last = dma.pop_input(offered) if offered else (np.zeros(0, np.int64), False)
        room = min(dma.output_room(), limit)
        taken, out, out_last, ended, _ = self.twin.stream(words & 0xFFFF, last, room, limit)
        if taken < offered:
            dma.unpop_input(offered - taken)
        if out.size:
            dma.push_output(out.astype(np.int64), last=bool(out_last[-1]))
        if ended:
            self.in_flight = False
