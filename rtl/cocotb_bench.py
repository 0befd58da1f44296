"""A cocotb bench of the accelerator top level, as the board's processor sees it.

Runs inside the simulator (imported by cocotb test modules): an AXI-Lite master on
``s_axi_control`` and AXI-Stream source/sink on ``s_axis``/``m_axis`` (cocotbext-axi), register
access by the names of :mod:`insitu.accel.regmap`, and :meth:`AccelBench.run_op` that configures an
op, streams its words in and collects the words out, as the PYNQ driver does with its DMA.
"""

from __future__ import annotations

import random

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import (AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamFrame, AxiStreamSink,
                           AxiStreamSource)

from insitu.accel.params import STREAM_WORDS
from insitu.accel.stream import beats, from_words, to_words

from insitu.accel.regmap import OFFSETS, ErrorCode

CLOCK_NS = 10
STATUS_BUSY, STATUS_DONE, STATUS_ERROR = 1, 2, 4


def words_to_bytes(words) -> bytes:
    return np.asarray(to_words(words), dtype="<u2").tobytes()


def bytes_to_words(data: bytes) -> np.ndarray:
    return from_words(np.frombuffer(bytes(data), dtype="<u2").astype(np.int64))


def pauses(rng: random.Random, busy_fraction: float):
    """An endless pause pattern for cocotbext-axi (True = stall this cycle)."""
    while True:
        yield rng.random() < busy_fraction


class AccelBench:
    def __init__(self, dut, seed: int = 0):
        self.dut = dut
        self.rng = random.Random(seed)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_control"), dut.aclk, dut.aresetn,
                                  reset_active_level=False)
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.aclk, dut.aresetn,
                                      reset_active_level=False)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.aclk, dut.aresetn,
                                  reset_active_level=False)
        for log in (self.axil.write_if.log, self.axil.read_if.log, self.source.log, self.sink.log):
            log.setLevel("WARNING")

    async def start(self):
        cocotb.start_soon(Clock(self.dut.aclk, CLOCK_NS, unit="ns").start())
        await self.reset()

    async def reset(self, cycles: int = 4):
        self.dut.aresetn.value = 0
        await ClockCycles(self.dut.aclk, cycles)
        self.dut.aresetn.value = 1
        await ClockCycles(self.dut.aclk, 2)

    def backpressure(self, input_idle: float = 0.0, output_stall: float = 0.0):
        """Random idle cycles on the input stream and stalls (TREADY low) on the output."""
        for model, fraction in ((self.source, input_idle), (self.sink, output_stall)):
            if fraction:
                model.set_pause_generator(pauses(self.rng, fraction))
            else:
                model.clear_pause_generator()
                model.pause = False         # a killed generator leaves its last value behind

    async def push_words(self, words, last: bool = False):
        """Drive beats on ``s_axis`` by hand (the stream source must be idle): a stream that stops
        without TLAST, or ends with TLAST early."""
        dut = self.dut
        values = beats(words)
        for k, beat in enumerate(values):
            dut.s_axis_tdata.value = beat
            dut.s_axis_tvalid.value = 1
            dut.s_axis_tlast.value = int(last and k == len(values) - 1)
            while True:
                await RisingEdge(dut.aclk)
                if dut.s_axis_tready.value:
                    break
        dut.s_axis_tvalid.value = 0
        dut.s_axis_tlast.value = 0

    async def read(self, name: str) -> int:
        return await self.axil.read_dword(OFFSETS[name])

    async def read_addr(self, address: int) -> int:
        return await self.axil.read_dword(address)

    async def write(self, name: str, value: int):
        await self.axil.write_dword(OFFSETS[name], value & 0xFFFFFFFF)

    async def write_addr(self, address: int, value: int):
        await self.axil.write_dword(address, value & 0xFFFFFFFF)

    async def configure(self, op: int, a=0, b=0, c=0, d=0, shift=0, **lrt):
        await self.write("OP", int(op))
        for name, value in zip(("SIZE_A", "SIZE_B", "SIZE_C", "SIZE_D"), (a, b, c, d)):
            await self.write(name, value)
        await self.write("SHIFT", shift)
        for name, value in lrt.items():
            await self.write(f"LRT_{name.upper()}", value)

    async def start_op(self):
        await self.write("CTRL", 1)

    async def wait_idle(self, timeout_cycles: int = 200_000) -> int:
        """Poll STATUS until not busy; returns STATUS. Fails after ``timeout_cycles``."""
        for _ in range(timeout_cycles // 16):
            status = await self.read("STATUS")
            if not status & STATUS_BUSY:
                return status
            await ClockCycles(self.dut.aclk, 16)
        raise AssertionError(f"accelerator still busy after {timeout_cycles} cycles")

    async def run_op(self, cfg, in_words, *, expect_out_words: int | None = None,
                     timeout_cycles: int = 200_000) -> tuple[np.ndarray, int]:
        """Configure ``cfg`` (a PEConfig-like object with op/a/b/c/d/shift, and tau for
        PE3_PSG's PSG_TAU), stream ``in_words``
        in, collect the output; returns (output words, CYCLES). Asserts DONE without ERROR."""
        await self.configure(cfg.op, cfg.a, cfg.b, cfg.c, cfg.d, cfg.shift)
        if getattr(cfg, "tau", None) is not None:          # PE3_PSG's threshold
            await self.write("PSG_TAU", cfg.tau)
        in_beats = await self.read("IN_BEATS")
        out_beats = await self.read("OUT_BEATS")
        assert in_beats * STREAM_WORDS == len(in_words), (in_beats, len(in_words))
        if expect_out_words is not None:
            assert out_beats * STREAM_WORDS == expect_out_words, (out_beats, expect_out_words)
        return await self._transfer(in_words, in_beats, out_beats, input_first=False,
                                    timeout_cycles=timeout_cycles)

    async def configure_lrt(self, op: int, shift: int = 0, **lrt):
        """Write OP, SHIFT and the ``LRT_<NAME>`` registers of the keyword arguments (side=,
        rows_l=, rows_r=, cols=, recip=); the PE1-PE3 size registers are left alone."""
        await self.write("OP", int(op))
        await self.write("SHIFT", shift)
        for name, value in lrt.items():
            await self.write(f"LRT_{name.upper()}", value)

    async def run_lrt_op(self, op: int, in_words=None, *, in_beats: int | None = None,
                         out_beats: int | None = None, shift: int = 0, input_first: bool = False,
                         timeout_cycles: int = 200_000, **lrt) -> tuple[np.ndarray, int]:
        """Run one LRT op: configure OP, SHIFT and the LRT registers (``**lrt`` as for
        :meth:`configure_lrt`), check IN_BEATS / OUT_BEATS (against ``in_beats`` / ``out_beats``
        when given, e.g. the golden model's, and against ``len(in_words)``), stream ``in_words``
        in, collect the output; returns (output words, CYCLES). Asserts DONE without ERROR.

        ``input_first``: queue the input stream before START (the source then offers its first
        beat while the accelerator is idle, which must not take it), as a DMA started ahead of
        the op would; otherwise the input is sent after START, as :meth:`run_op` does."""
        in_words = np.zeros(0, np.int64) if in_words is None else np.asarray(in_words).ravel()
        await self.configure_lrt(op, shift, **lrt)
        got_in = await self.read("IN_BEATS")
        got_out = await self.read("OUT_BEATS")
        assert got_in * STREAM_WORDS == len(in_words), (got_in, len(in_words))
        if in_beats is not None:
            assert got_in == in_beats, f"IN_BEATS {got_in}, expected {in_beats}"
        if out_beats is not None:
            assert got_out == out_beats, f"OUT_BEATS {got_out}, expected {out_beats}"
        return await self._transfer(in_words, got_in, got_out, input_first=input_first,
                                    timeout_cycles=timeout_cycles)

    async def _transfer(self, in_words, in_beats: int, out_beats: int, *, input_first: bool,
                        timeout_cycles: int) -> tuple[np.ndarray, int]:
        """START the configured op, stream ``in_words`` in and ``out_beats`` beats out, wait for
        the end; returns (output words, CYCLES). Asserts DONE without ERROR and the beat counts."""
        frame = AxiStreamFrame(words_to_bytes(in_words)) if len(in_words) else None
        if frame is not None and input_first:
            await self.source.send(frame)
        await self.start_op()
        receive = cocotb.start_soon(self.sink.recv()) if out_beats else None
        if frame is not None and not input_first:
            await self.source.send(frame)
        out = np.zeros(0, np.int64)
        if receive is not None:
            # A missing TLAST fails here instead of hanging the simulation.
            frame_out = await with_timeout(receive, timeout_cycles * CLOCK_NS, "ns")
            out = bytes_to_words(bytes(frame_out.tdata))
        status = await self.wait_idle(timeout_cycles)
        code = await self.read("ERROR_CODE")
        assert status == STATUS_DONE, f"STATUS {status:#x}, ERROR_CODE {ErrorCode(code).name}"
        assert await self.read("BEATS_DONE_IN") == in_beats
        assert await self.read("BEATS_DONE_OUT") == out_beats
        return out, await self.read("CYCLES")

    async def expect_error(self, code: ErrorCode):
        status = await self.wait_idle(10_000)
        got = await self.read("ERROR_CODE")
        assert status == STATUS_ERROR and got == code, \
            f"expected ERROR {code.name}, got STATUS {status:#x} ERROR_CODE {got}"

