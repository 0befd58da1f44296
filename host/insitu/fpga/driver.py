"""The PYNQ host driver of the accelerator: what runs on the board's ARM core (and on twins).

* :class:`InsituAcceleratorIP` is pynq's driver for the accelerator IP (bound to its VLNV, so
  ``pynq.Overlay`` hands it out as ``overlay.insitu_accel_0``); its registers are reached by name
  through :class:`insitu.fpga.regs.Registers`, generated from the register-map spec.
* :class:`InsituOverlay` loads the bitstream and its .hwh and refuses one whose accelerator reports
  another register-map VERSION.
* :class:`Accelerator` runs ops: registers, START, the two AXI DMA channels of
  ``pynq.lib.dma.DMA`` on buffers from ``pynq.allocate``, and a deadline on every wait (an
  :class:`AcceleratorTimeout` with a register dump, never an endless poll). It counts cycles and
  bytes for the figures, and converts cycles to seconds at the design's PL clock: the rate the
  overlay's .hwh records for PL clock 0 (:func:`overlay_clock_hz`), or the one it is given (the
  board file's). It is the *port* the training code programs against.

The code here is what runs on a board: it knows pynq's devices, not which one it is given (a
board's own, or a simulated twin's: :mod:`insitu.fpga.boards` chooses).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pynq import DefaultIP, Overlay
from pynq.bitstream import Bitstream

from insitu.errors import InsituError, UsageError
from insitu.accel import ip
from insitu.accel.params import BEAT_BYTES, IP_VLNV, STREAM_WORDS
from insitu.accel.regmap import ID_VALUE, VERSION, ErrorCode, Op

from .regs import DONE, ERROR, Registers, format_dump

if TYPE_CHECKING:
    from pynq.buffer import PynqBuffer

#: Seconds any one wait may take on a board or a fast twin (an op of the TT network takes
#: milliseconds).
DEFAULT_TIMEOUT_S = 10.0


class BitstreamError(UsageError):
    """A bitstream or its .hwh is missing, of another design, or of another register map."""


class AcceleratorError(InsituError):
    """The accelerator ended an op in ERROR (the message has the error code and the registers)."""


class AcceleratorTimeout(AcceleratorError):
    """A wait passed its deadline (the message has the registers and the DMA status)."""


class InsituAcceleratorIP(DefaultIP):
    """pynq's driver of the accelerator IP (bound to :data:`insitu.accel.params.IP_VLNV`)."""

    bindto = [IP_VLNV]

    def __init__(self, description):
        super().__init__(description)
        self.regs = Registers(self.mmio)

    def check_design(self, source: str) -> None:
        ident, version = self.regs.read("ID"), self.regs.read("VERSION")
        if ident != ID_VALUE:
            raise BitstreamError(f"{source}: the IP at the accelerator's address reads ID {ident:#010x}, "
                                 f"not {ID_VALUE:#010x}: not an insitu accelerator")
        if version != VERSION:
            raise BitstreamError(f"{source}: the accelerator's register map is version {version:#010x}; "
                                 f"this driver speaks {VERSION:#010x}. Rebuild the bitstream from this "
                                 "insitu version (insitu rtl generate, then Vivado) or install the "
                                 "insitu version the bitstream came from")


class InsituOverlay(Overlay):
    """The accelerator's overlay: ``insitu_accel_0`` and ``axi_dma_0``, checked at load.

    ``set_pl_clocks=False`` loads the design without programming the PL clocks from the .hwh
    (``pynq.Overlay.download`` does that through the board's processing system, which a device
    without one, as a simulated twin, does not have: its clock is the board's).
    """

    def __init__(self, bitfile, device=None, download: bool = True, set_pl_clocks: bool = True):
        bitfile = Path(bitfile)
        for path in (bitfile, bitfile.with_suffix(".hwh")):
            if not path.is_file():
                raise BitstreamError(f"{path} is missing: pynq.Overlay needs the .bit and its .hwh "
                                     "side by side (Vivado leaves both: see docs/rtl.md)")
        super().__init__(str(bitfile.resolve()), download=False, device=device)
        if download and set_pl_clocks:
            self.download()
        elif download:
            Bitstream.download(self, self.parser)
        self.accel = getattr(self, ip.ACCEL_CELL)
        self.dma = getattr(self, ip.DMA_CELL)
        if not isinstance(self.accel, InsituAcceleratorIP):
            raise BitstreamError(f"{bitfile}: {ip.ACCEL_CELL} is not {IP_VLNV}")
        self.accel.check_design(str(bitfile))


def overlay_clock_hz(overlay) -> int | None:
    """PL clock 0 of a loaded overlay in Hz, as its design records it, or None.

    pynq's ``clock_dict`` gives the achieved rate where its metadata reads it (pynqmetadata's
    ``frequency``, MHz: newer releases, Zynq UltraScale+ only); otherwise the .hwh beside the .bit
    is read for the processing system's achieved-rate parameter (what Vivado writes: pynq 3.0's
    ``clock_dict`` has only the enable and the divisors)."""
    from .hwh import hwh_clock_hz

    try:
        clock = overlay.clock_dict[0]
        frequency = clock.get("frequency") if clock.get("enable", 1) else None
    except (AttributeError, KeyError, TypeError, IndexError):
        frequency = None
    if frequency:
        return round(float(frequency) * 1e6)
    bitfile = getattr(overlay, "bitfile_name", None)
    return hwh_clock_hz(Path(bitfile).with_suffix(".hwh")) if bitfile else None


class Accelerator:
    """Runs accelerator ops through the overlay's registers and DMA (module docstring).

    ``run(op, words, **registers)`` writes the named registers (regmap names), starts ``op``,
    streams ``words`` (signed 16-bit words, a whole number of beats) in and returns the output
    stream as signed int64 words. Registers keep their values between ops, as on the hardware,
    and are only written when they change.

    ``clock_hz``: the PL clock the figures convert cycles to seconds with; None reads it from
    the overlay (:func:`overlay_clock_hz`), and an overlay that records none is refused.
    ``clock_source`` says where the given clock came from (for the figures).
    """

    def __init__(self, overlay: InsituOverlay, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock_hz: int | None = None, clock_source: str = "given"):
        self.overlay = overlay
        self.regs = overlay.accel.regs
        self.dma = overlay.dma
        self.device = overlay.device
        self.timeout_s = timeout_s
        if clock_hz is None:
            clock_hz, clock_source = overlay_clock_hz(overlay), "hwh"
            if clock_hz is None:
                raise BitstreamError(f"{getattr(overlay, 'bitfile_name', 'the overlay')}: its .hwh "
                                     "records no PL clock rate; give the board's clock (clock_hz)")
        if clock_hz <= 0:
            raise ValueError(f"clock_hz must be positive, got {clock_hz}")
        self.clock_hz = int(clock_hz)
        self.clock_source = clock_source
        self.written: dict[str, int] = {}
        self.buffers: dict[str, PynqBuffer] = {}
        self.ops: Counter = Counter()
        self.cycles_by_op: Counter = Counter()
        self.dma_bytes = 0
        for channel in (self.dma.sendchannel, self.dma.recvchannel):
            channel.start()

    # ------------------------------------------------------------------------------ figures
    @property
    def cycles(self) -> int:
        return sum(self.cycles_by_op.values())

    def figures(self) -> dict:
        return {"pl_cycles": self.cycles, "seconds_at_board_clock": self.cycles / self.clock_hz,
                "pl_clock_hz": self.clock_hz, "pl_clock_source": self.clock_source,
                "dma_bytes": self.dma_bytes,
                "ops": dict(sorted(self.ops.items())),
                "cycles_by_op": dict(sorted(self.cycles_by_op.items()))}

    # ------------------------------------------------------------------------------ registers
    def read(self, name: str) -> int:
        return self.regs.read(name)

    def _configure(self, registers: dict) -> None:
        for name, value in registers.items():
            if self.written.get(name) != value:
                self.regs.write(name, value)
                self.written[name] = value

    def _buffer(self, role: str, words: int):
        """A DMA buffer of at least ``words`` 16-bit words, reused across ops (grown by doubling)."""
        import pynq

        buf = self.buffers.get(role)
        if buf is None or buf.size < words:
            size = max(words, 2 * buf.size if buf is not None else 4096)
            # (pynq.allocate is unannotated: pyright takes its "u4" default for the dtype's type.)
            buf = self.buffers[role] = pynq.allocate((size,), dtype=np.int16,  # pyright: ignore[reportArgumentType]
                                                     target=self.device)
        return buf

    # ------------------------------------------------------------------------------ ops
    def run(self, op: Op, words=None, **registers) -> np.ndarray:
        op = Op(op)
        words = np.zeros(0, np.int64) if words is None else np.asarray(words).ravel()
        if words.size % STREAM_WORDS:
            raise ValueError(f"{op.name}: the input stream must be whole beats of {STREAM_WORDS} "
                             f"words, got {words.size}")
        self._configure({"OP": int(op), **registers})
        self.regs.command("START")
        if self.regs.field("STATUS", "ERROR"):
            self._failed(op, "refused its configuration")
        # Read while the op runs: the sizes of the op START froze.
        in_beats, out_beats = self.regs.read("IN_BEATS"), self.regs.read("OUT_BEATS")
        if in_beats != words.size // STREAM_WORDS:
            self.regs.command("ABORT")
            self._reset_dma()
            raise ValueError(f"{op.name}: the accelerator expects {in_beats} input beats for "
                             f"{registers}; the stream has {words.size // STREAM_WORDS}")
        out = None
        if out_beats:
            out = self._buffer("out", out_beats * STREAM_WORDS)
            self.dma.recvchannel.transfer(out, 0, out_beats * BEAT_BYTES)
        if in_beats:
            buf = self._buffer("in", words.size)
            buf[:words.size] = words
            self.dma.sendchannel.transfer(buf, 0, words.size * 2)
        channels = (self.dma.sendchannel, self.dma.recvchannel)
        self._wait(op, lambda: self.regs.read("STATUS") & (DONE | ERROR) or any(c.error for c in channels),
                   "the op to end (STATUS.DONE)")
        self._check_dma(op)
        if self.regs.field("STATUS", "ERROR"):
            self._failed(op, "failed")
        for channel, beats in zip(channels, (in_beats, out_beats)):
            if beats:
                self._wait(op, lambda c=channel: c.idle or c.error, "the DMA to go idle")
        self._check_dma(op)
        result = np.zeros(0, np.int64)
        if out_beats:
            assert out is not None              # allocated above when out_beats
            out.invalidate()
            result = out[:out_beats * STREAM_WORDS].astype(np.int64)
        cycles = self.regs.read("CYCLES")
        self.ops[op.name] += 1
        self.cycles_by_op[op.name] += cycles
        self.dma_bytes += (in_beats + out_beats) * BEAT_BYTES
        return result

    def _check_dma(self, op: Op) -> None:
        """A DMA error (a bad address, a transfer the DMA cannot make) ends the op at once."""
        if self.dma.sendchannel.error or self.dma.recvchannel.error:
            dump = self._dump()
            self.regs.command("ABORT")
            self._reset_dma()
            raise AcceleratorError(f"{op.name}: the AXI DMA reported an error (DMASR bits 4-6: "
                                   f"internal, slave, decode). {dump}")

    def _wait(self, op: Op, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            if time.monotonic() > deadline:
                dump = self._dump()
                self.regs.command("ABORT")
                self._reset_dma()
                raise AcceleratorTimeout(f"{op.name}: timed out after {self.timeout_s:g} s waiting for "
                                         f"{what}. {dump}")

    def _dump(self) -> str:
        dma = " ".join(f"{name}_DMASR={c._mmio.read(c._offset + 4):#x}"
                       for name, c in (("MM2S", self.dma.sendchannel), ("S2MM", self.dma.recvchannel)))
        return f"Registers: {format_dump(self.regs.dump())} {dma}"

    def _failed(self, op: Op, what: str):
        code = ErrorCode(self.regs.read("ERROR_CODE"))
        dump = self._dump()
        self._reset_dma()
        raise AcceleratorError(f"{op.name} {what}: {code.name}. {dump}")

    def _reset_dma(self) -> None:
        """After an ERROR a transfer may be left half done: reset the DMA and start it again."""
        self.dma.sendchannel._mmio.write(0x00, 0x4)              # MM2S_DMACR.Reset resets both
        for channel in (self.dma.sendchannel, self.dma.recvchannel):
            channel._first_transfer = True
            channel.start()
        self.written.clear()
