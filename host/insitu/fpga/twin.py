"""Simulated boards: a ``pynq.Device`` whose registers and DMA buffers are served by a model of
the programmable logic, so that the unchanged PYNQ driver (:mod:`insitu.fpga.driver`:
``pynq.Overlay``, ``DefaultIP``, ``MMIO``, ``allocate``, ``pynq.lib.dma.DMA``) runs here as it runs
on a board. The driver is handed a :class:`TwinDevice` instead of the board's own device
(:func:`insitu.fpga.boards.open_board`); it does not know the difference.

* :class:`TwinDevice` has pynq's ``REGISTER_RW`` capability: ``pynq.MMIO`` sends every register
  access to :meth:`TwinDevice.read_registers` / :meth:`write_registers`, which route it by
  address, as the board's interconnect does, to the accelerator (served by a model of
  :mod:`insitu.fpga.twin_models`: the functional model, or the RTL compiled with Verilator or in
  Amaranth's simulator) or to the AXI DMA.
* :class:`AxiDmaModel` is the register interface of Xilinx's AXI DMA in simple mode (PG021:
  MM2S/S2MM control, status, address and length registers), moving bytes between the twin's
  DDR and the accelerator's streams; TLAST ends each MM2S transfer, as the DMA does.
* :class:`DeviceMemory` is the board's DDR: ``allocate`` returns real ``pynq.buffer.PynqBuffer``
  arrays with device addresses the DMA model resolves.

A twin loads a *twin overlay*: the ``.hwh`` of the board's block design (the one a Vivado build
leaves, :mod:`insitu.fpga.hwh`, at the board's PL clock) next to a ``.bit`` that, instead of a
configuration bitstream, names the design (JSON: board, register-map version, accelerator
parameters (the board's, :func:`insitu.boards.accelerator_params`), PL clock).
"""

from __future__ import annotations

import bisect
import json
import weakref
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pynq
from pynq.buffer import PynqBuffer

from insitu.errors import UsageError
from insitu.io import atomic_write
from insitu.accel import ip
from insitu.accel.params import BEAT_BYTES, IP_VLNV, STREAM_WORDS, AcceleratorParams
from insitu.accel.regmap import VERSION

from .driver import BitstreamError
from .hwh import write_hwh
from .twin_models import CompiledRTLModel, FunctionalModel, RTLModel

#: A twin's models of the PL: the functional model (fast), the RTL compiled with Verilator (rtl),
#: the RTL in Amaranth's simulator (rtl-amaranth: the reference, ~1000x slower than rtl).
MODES = ("fast", "rtl", "rtl-amaranth")
RTL_MODELS = {"rtl": CompiledRTLModel, "rtl-amaranth": RTLModel}
#: Where the twin's DDR hands out buffer addresses (inside the HP port's DDR window of both boards).
DDR_BASE = 0x1000_0000
TWIN_FORMAT = "insitu-twin-bitstream"


# ------------------------------------------------------------------------------------ twin overlay

def write_twin_overlay(board: str, folder, params: AcceleratorParams | None = None,
                       version: int = VERSION, clock_hz: int | None = None) -> Path:
    """Write ``insitu_<board>.bit`` (the design's description) and ``.hwh`` into ``folder``;
    returns the .bit path. ``board`` is the real board the twin stands for (its block design);
    ``params`` and ``clock_hz`` default to that board's (its board file's ``[accelerator]`` and
    ``pl_clock_hz``)."""
    from insitu.boards import accelerator_params, pl_clock_hz

    params = accelerator_params(board) if params is None else params
    clock_hz = pl_clock_hz(board) if clock_hz is None else clock_hz
    folder = Path(folder)
    bit = folder / f"{ip.bitstream_name(board)}.bit"
    write_hwh(board, bit.with_suffix(".hwh"), clock_hz=clock_hz)
    atomic_write(bit, json.dumps({"format": TWIN_FORMAT, "board": board, "ip": IP_VLNV,
                                  "register_map_version": version, "params": asdict(params),
                                  "pl_clock_hz": clock_hz}, indent=1))
    return bit


def read_twin_bitstream(path) -> dict:
    path = Path(path)
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != TWIN_FORMAT:
        raise BitstreamError(f"{path} is not a twin overlay: a simulated board loads the overlays "
                             "`insitu train` writes for it (leave out --bitstream on a -sim board); "
                             "a Vivado .bit runs on the real board")
    return meta


# ------------------------------------------------------------------------------------ DDR

class DeviceMemory:
    """Buffers of the twin's DDR, each at its own device address."""

    def __init__(self, base: int = DDR_BASE):
        self.next_address = base
        self.starts: list[int] = []
        self.segments: dict[int, weakref.ref] = {}

    def allocate(self, device, shape, dtype, **kwargs) -> PynqBuffer:
        dtype = np.dtype(dtype)
        # int64: on a 32-bit PS np.prod of a shape is int32 and wraps past 2**31 without a word
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        backing = np.zeros(nbytes, np.uint8)
        address = self.next_address
        self.next_address += -(-nbytes // 4096) * 4096           # page-aligned, as CMA hands out
        buf = PynqBuffer(shape, dtype, buffer=backing, device=device, device_address=address,
                         bo=address, coherent=False)
        self.starts.append(address)
        self.segments[address] = weakref.ref(backing)
        return buf

    def view(self, address: int, nbytes: int) -> np.ndarray | None:
        """The bytes ``[address, address + nbytes)`` of one live buffer, or None (a decode error)."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0:
            return None
        start = self.starts[i]
        backing = self.segments[start]()
        if backing is None or address + nbytes > start + backing.size:
            return None
        return backing[address - start:address - start + nbytes]


# ------------------------------------------------------------------------------------ AXI DMA

class _Channel:
    def __init__(self):
        self.reset()

    def reset(self):
        self.running = False
        self.idle = True
        self.errors = 0          # DMASR bits 4..6
        self.irq = False
        self.address = 0
        self.length = 0
        self.words: np.ndarray | None = None     # MM2S: the transfer's words; S2MM: None
        self.position = 0        # beats moved
        self.beats = 0           # beats of the transfer

    def status(self) -> int:
        halted = not self.running
        return int(halted) | (int(self.idle) << 1) | self.errors | (int(self.irq) << 12)


class AxiDmaModel:
    """Xilinx AXI DMA in simple mode (the registers pynq's ``DMA`` driver uses), between the
    twin's DDR and the accelerator's streams. ``fault="stall"`` makes a DMA that never moves a
    beat (a hung transfer, for the driver's timeouts)."""

    CR, SR, ADDR, ADDR_MSB, LENGTH = 0x00, 0x04, 0x18, 0x1C, 0x28
    S2MM = 0x30
    INTERNAL_ERROR, DECODE_ERROR = 0x10, 0x40

    def __init__(self, memory: DeviceMemory, fault: str | None = None):
        self.memory = memory
        self.fault = fault
        self.mm2s, self.s2mm = _Channel(), _Channel()

    def read(self, offset: int) -> int:
        channel, reg = (self.s2mm, offset - self.S2MM) if offset >= self.S2MM else (self.mm2s, offset)
        if reg == self.CR:
            return int(channel.running)
        if reg == self.SR:
            return channel.status()
        if reg == self.ADDR:
            return channel.address & 0xFFFF_FFFF
        if reg == self.LENGTH:
            # S2MM: the bytes actually received (what pynq reads as `transferred`).
            return channel.position * BEAT_BYTES if channel is self.s2mm else channel.length
        return 0

    def write(self, offset: int, value: int) -> None:
        channel, reg = (self.s2mm, offset - self.S2MM) if offset >= self.S2MM else (self.mm2s, offset)
        if reg == self.CR:
            if value & 0x4:                         # soft reset: both channels
                self.mm2s.reset()
                self.s2mm.reset()
                return
            channel.running = bool(value & 1)
        elif reg == self.SR:
            if value & 0x1000:
                channel.irq = False                 # write 1 to clear
        elif reg == self.ADDR:
            channel.address = (channel.address & ~0xFFFF_FFFF) | value
        elif reg == self.ADDR_MSB:
            channel.address = (channel.address & 0xFFFF_FFFF) | (value << 32)
        elif reg == self.LENGTH:
            self._start(channel, value)

    def _start(self, channel: _Channel, nbytes: int) -> None:
        if not channel.running:
            return
        channel.length, channel.position, channel.irq = nbytes, 0, False
        view = self.memory.view(channel.address, nbytes)
        if nbytes == 0 or nbytes % BEAT_BYTES:
            channel.errors |= self.INTERNAL_ERROR       # the twin moves whole 128-bit beats only
        elif view is None:
            channel.errors |= self.DECODE_ERROR         # no buffer at that address
        if channel.errors:
            channel.running = False
            return
        assert view is not None                         # (else DECODE_ERROR above)
        channel.idle = False
        channel.beats = nbytes // BEAT_BYTES
        if channel is self.mm2s:
            channel.words = view.view("<i2").astype(np.int64)

    def _complete(self, channel: _Channel) -> None:
        channel.idle, channel.irq = True, True

    # --- the stream side (called by the PL model)
    def input_beats(self) -> int:
        c = self.mm2s
        return 0 if c.idle or self.fault == "stall" else c.beats - c.position

    def pop_input(self, beats: int) -> tuple[np.ndarray, bool]:
        """Up to ``beats`` beats of the MM2S transfer; ``last``: TLAST is on the final one."""
        c = self.mm2s
        assert c.words is not None          # a transfer is under way (input_beats)
        take = min(beats, c.beats - c.position)
        words = c.words[c.position * STREAM_WORDS:(c.position + take) * STREAM_WORDS]
        c.position += take
        last = c.position == c.beats
        if last:
            self._complete(c)
        return words, last

    def unpop_input(self, beats: int) -> None:
        """Give back beats the stream did not accept (the RTL model reads one ahead)."""
        c = self.mm2s
        if beats and c.idle:
            c.irq = False                   # the transfer popped to its end is not complete after all
        c.position -= beats
        c.idle = False

    def output_room(self) -> int:
        c = self.s2mm
        return 0 if c.idle or self.fault == "stall" else c.beats - c.position

    def push_output(self, words, last: bool) -> None:
        c = self.s2mm
        words = np.asarray(words, np.int64)
        beats = words.size // STREAM_WORDS
        view = self.memory.view(c.address + c.position * BEAT_BYTES, words.size * 2)
        assert view is not None             # within the buffer checked when the transfer started
        view[:] = (words & 0xFFFF).astype("<u2").view(np.uint8)
        c.position += beats
        if last or c.position == c.beats:
            self._complete(c)


# ------------------------------------------------------------------------------------ the device

class TwinDevice(pynq.Device):
    """A simulated Ultra96-V2 or ZedBoard as pynq sees a device (module docstring).

    ``mode``: ``"fast"`` (functional model), ``"rtl"`` (the RTL compiled with Verilator) or
    ``"rtl-amaranth"`` (the RTL in Amaranth's simulator). The device
    serves nothing until an overlay is downloaded to it.
    """

    def __init__(self, board: str, mode: str = "fast", fault: str | None = None):
        if mode not in MODES:
            raise UsageError(f"unknown twin mode {mode!r}; choose one of {', '.join(MODES)}")
        super().__init__(f"insitu-twin:{board}:{mode}")
        self.name = f"{board}-sim"
        self.board = board
        self.mode = mode
        self.capabilities = {"REGISTER_RW": True}
        self.memory = DeviceMemory()
        self.dma = AxiDmaModel(self.memory, fault)
        self.pl = None
        self.windows: list[tuple[int, int, str]] = []
        self.timestamp = ""
        self.bitfile_name = None

    # --- what pynq.Overlay calls
    # (pynq's Device.get_bitfile_metadata is a placeholder returning None; a board's device
    # returns the parser, as this one does.)
    def get_bitfile_metadata(  # pyright: ignore[reportIncompatibleMethodOverride]
            self, bitfile_name, partial: bool = False):
        from pynqmetadata.frontends import Metadata
        from pynqmetadata.views.runtime import RuntimeMetadataParser

        self._twin_bitstream(bitfile_name)             # the design first: a clearer error
        hwh = Path(bitfile_name).with_suffix(".hwh")
        if not hwh.is_file():
            raise BitstreamError(f"{hwh} is missing: pynq.Overlay needs the .hwh next to the .bit")
        # What pynq's EmbeddedDevice does on a board for a full bitstream.
        try:
            # (pynqmetadata's annotations are narrower than its code: Metadata takes a path, as
            # pynq's EmbeddedDevice passes it, and returns the Module that the parser takes.)
            return RuntimeMetadataParser(Metadata(input=hwh))  # pyright: ignore[reportArgumentType]
        except Exception as exc:                        # pynqmetadata raises many kinds
            raise BitstreamError(f"{hwh} is not a readable hardware handoff ({exc}); write the "
                                 "twin's overlay again (leave out --bitstream)") from None

    def _twin_bitstream(self, path) -> dict:
        meta = read_twin_bitstream(path)
        if meta.get("board") != self.board:
            raise BitstreamError(f"{path} is the overlay of {meta.get('board')}'s block design; "
                                 f"{self.name} loads {self.board}'s")
        return meta

    def download(self, bitstream, parser=None):
        meta = self._twin_bitstream(bitstream.bitfile_name)
        try:
            params = AcceleratorParams(**meta["params"])
        except (TypeError, ValueError) as exc:
            raise BitstreamError(f"{bitstream.bitfile_name}: its accelerator parameters are not "
                                 f"this insitu's ({exc}); write the twin's overlay again (leave "
                                 "out --bitstream)") from None
        if self.mode in RTL_MODELS:
            if meta["register_map_version"] != VERSION:
                raise BitstreamError(f"{bitstream.bitfile_name} was built from register map "
                                     f"{meta['register_map_version']:#010x}; this RTL has {VERSION:#010x}")
            self.pl = RTL_MODELS[self.mode](params, clock_hz=meta.get("pl_clock_hz"))
        else:
            self.pl = FunctionalModel(params, version=meta["register_map_version"])
        self.windows = []
        assert parser is not None           # pynq.Overlay passes get_bitfile_metadata's parser
        for name, ip in parser.ip_dict.items():
            kind = "accel" if ip["type"] == IP_VLNV else "dma" if "axi_dma" in ip["type"] else None
            if kind:
                self.windows.append((ip["phys_addr"], ip["addr_range"], kind))
        self.post_download(bitstream, parser)

    def read_registers(self, address, length):
        out = b""
        for k in range(0, length, 4):
            out += self._access(address + k).to_bytes(4, "little")
        return out[:length]

    def write_registers(self, address, data):
        data = bytes(data)
        for k in range(0, len(data), 4):
            self._access(address + k, int.from_bytes(data[k:k + 4].ljust(4, b"\0"), "little"))

    def allocate(self, shape, dtype, **kwargs):
        return self.memory.allocate(self, shape, dtype, **kwargs)

    def flush(self, bo, offset, ptr, size):
        pass         # the twin's DDR is the buffer itself: no cache between the CPU and the DMA

    def invalidate(self, bo, offset, ptr, size):
        pass

    # --- the interconnect
    def _access(self, address: int, value: int | None = None) -> int:
        if self.pl is None:
            raise BitstreamError(f"{self.name}: no overlay loaded; load one with "
                                 "insitu.fpga.boards.open_board")
        self.pl.advance(self.dma)
        for base, span, kind in self.windows:
            if base <= address < base + span:
                offset = address - base
                if kind == "accel":
                    if value is None:
                        return self.pl.axil_read(offset)
                    self.pl.axil_write(offset, value)
                elif value is None:
                    return self.dma.read(offset)
                else:
                    self.dma.write(offset, value)
                return 0
        # On a board an access outside every window is a bus error that kills the process.
        raise RuntimeError(f"{self.name}: no IP at address {address:#x} (a bus error on the board)")

    @property
    def cycles(self) -> int | None:
        """Clock cycles simulated so far (RTL modes), for figures."""
        return getattr(self.pl, "cycles", None)
