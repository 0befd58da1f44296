"""The framed binary link to the board over USB serial (host side of ``firmware/link.py``).

Frames are ``sync | type u8 | seq u16 | length u16 | payload | CRC-32 u32``, little-endian. A reply
carries the seq of the request it answers; :meth:`DeviceLink.request` resends a request that got no
reply (same seq, so the firmware answers a resend from its last reply instead of doing the work
twice) and reopens a port that went away (a cable pulled, a twin's ``drop_link``).

:func:`start_program` starts a program on the board from its friendly REPL, the same way on a board
and on its twin (``insitu mcu emulate``).
"""

from __future__ import annotations

import ast
import contextlib
import binascii
import os
import re
import struct
import time
from collections import deque
from typing import Any, NamedTuple

from insitu.errors import InsituError
from insitu.resources import package_dir


def firmware_literals(source: str) -> dict[str, Any]:
    """The top-level ``NAME = <literal>`` assignments of a firmware source (``firmware/<source>``).

    CPython cannot import the firmware (it imports `micropython`), so the host reads the constants
    the device defines from the source: it never restates one the device could disagree with.
    Assignments whose value is not a literal (``const(...)``, expressions) are left out."""
    path = package_dir("firmware") / source
    found = {}
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def _constants_from_firmware() -> dict:
    # The frame layout is written once, in firmware/link.py, which the board needs anyway.
    wanted = ("SYNC", "HEADER", "CRC", "MAX_PAYLOAD")
    found = {k: v for k, v in firmware_literals("link.py").items() if k in wanted}
    missing = [name for name in wanted if name not in found]
    if missing:
        raise InsituError(f"{package_dir('firmware') / 'link.py'} does not define {', '.join(missing)} as "
                          "literals; reinstall insitu")
    return found


_FIRMWARE = _constants_from_firmware()
SYNC: bytes = _FIRMWARE["SYNC"]
HEADER = struct.Struct(_FIRMWARE["HEADER"])      # sync, type, seq, payload length
CRC = struct.Struct(_FIRMWARE["CRC"])            # CRC-32 of what follows the sync bytes
MAX_PAYLOAD: int = _FIRMWARE["MAX_PAYLOAD"]

_MCU_HINT = "is the board plugged in? `insitu mcu emulate` starts a simulated one"


class LinkError(InsituError):
    """The serial link to the board failed; the message names the port."""


class LinkTimeout(LinkError):
    """No (valid) frame came from the board in time."""


class LinkDropped(LinkError):
    """The port went away under an open link (cable pulled); :meth:`DeviceLink.reopen` it."""


class FirmwareStopped(LinkError):
    """The board is at its REPL prompt, not running the firmware (it was reset, or exited)."""


class FirmwareCrashed(InsituError):
    """The firmware stopped with a Python traceback; the message holds it. Restarting would only
    crash again, so this is not a :class:`LinkError` that recovery retries."""


# What MicroPython prints when a program ends: its prompt, after a traceback if it raised (a
# board ends lines with CRLF, the twin's raw pty with LF).
_PROMPT = b"\n>>> "
_TRACEBACK = b"Traceback (most recent call last):"
_FILE_FRAME = re.compile(r'File "([^"]+)"')
_GARBAGE_TAIL = 4096


class Frame(NamedTuple):
    type: int
    seq: int
    payload: bytes


def encode_frame(ftype: int, seq: int, payload: bytes = b"", max_payload: int = MAX_PAYLOAD) -> bytes:
    """The bytes of one frame."""
    if not 0 <= ftype <= 0xFF:
        raise ValueError(f"frame type must be 0..255, got {ftype}")
    if not 0 <= seq <= 0xFFFF:
        raise ValueError(f"sequence number must be 0..65535, got {seq}")
    payload = bytes(payload)
    if len(payload) > max_payload:
        raise ValueError(f"payload of {len(payload)} bytes is over the link's maximum of "
                         f"{max_payload}: split it into several frames")
    body = HEADER.pack(SYNC, ftype, seq, len(payload)) + payload
    return body + CRC.pack(binascii.crc32(body[len(SYNC):]))


class FrameDecoder:
    """Frames out of a byte stream with garbage in it.

    A candidate frame whose sync, length or CRC is wrong loses its first byte and the rest is
    scanned again, so every valid frame comes out, in order, whatever lies between them.
    ``skipped`` counts the bytes dropped.
    """

    def __init__(self, max_payload: int = MAX_PAYLOAD):
        self.max_payload = max_payload
        self.skipped = 0
        self.garbage = bytearray()       # the last bytes skipped: REPL output among them
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held: the start of a frame not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; returns the frames they complete."""
        self._buf += data
        return self._parse()

    def stall(self) -> list[Frame]:
        """The sender went quiet with a frame begun: that candidate is garbage (a truncated frame,
        or a false sync whose length would swallow the next frames), and so is any candidate
        after it that the held bytes do not complete. Returns the complete frames among them."""
        frames = []
        while self._buf:
            self._skip(1)
            frames += self._parse()
        return frames

    def reset(self) -> None:
        """Forget the bytes held (counted as skipped): what came before a reconnection."""
        self._skip(len(self._buf))
        self.garbage.clear()

    def _skip(self, n: int) -> None:
        self.garbage += self._buf[:n]
        del self.garbage[:-_GARBAGE_TAIL]
        del self._buf[:n]
        self.skipped += n

    def _parse(self) -> list[Frame]:
        frames, buf, body_at = [], self._buf, len(SYNC)
        while True:
            at = buf.find(SYNC)
            if at < 0:
                # Keep a last byte that may be the first half of a sync split across reads.
                self._skip(len(buf) - (1 if buf.endswith(SYNC[:1]) else 0))
                return frames
            self._skip(at)
            if len(buf) < HEADER.size:
                return frames
            _, ftype, seq, length = HEADER.unpack_from(buf)
            if length > self.max_payload:
                self._skip(1)
                continue
            end = HEADER.size + length
            if len(buf) < end + CRC.size:
                return frames
            (crc,) = CRC.unpack_from(buf, end)
            if binascii.crc32(buf[body_at:end]) != crc:
                self._skip(1)
                continue
            frames.append(Frame(ftype, seq, bytes(buf[HEADER.size:end])))
            del buf[:end + CRC.size]


def _serial_module():
    try:
        import serial
    except ImportError:
        raise InsituError("pyserial is missing: pip install 'insitu[mcu]' "
                          "(or bash scripts/setup.sh)") from None
    return serial


def open_serial(port: str, baudrate: int = 115200, timeout_s: float = 0.05):
    """A pyserial port; a port that is missing or cannot be opened is a :class:`LinkError`."""
    serial = _serial_module()
    try:
        return serial.Serial(port, baudrate, timeout=timeout_s, write_timeout=5.0)
    except (serial.SerialException, OSError) as exc:
        errno = getattr(exc, "errno", None)
        reason = os.strerror(errno) if errno else str(exc)
        raise LinkError(f"cannot open the serial port {port}: {reason}; {_MCU_HINT}") from None


class DeviceLink:
    """Frames to and from the firmware's ``link.Link`` over a serial port."""

    #: Silence, with a frame begun, after which that frame is taken for a truncated one.
    stall_s = 0.2

    def __init__(self, port: str, baudrate: int = 115200, timeout_s: float = 2.0,
                 max_payload: int = MAX_PAYLOAD):
        self.port = port
        self.baudrate = baudrate
        self.timeout_s = timeout_s
        self.max_payload = max_payload
        self.resends = 0            # requests sent again for want of a reply
        self.discarded = 0          # frames that answered no pending request (late replies)
        # A random first seq: the firmware answers a frame identical (seq and CRC) to the one it
        # answered last from its last reply; a new session starting where the last left off
        # would get an old reply to a repeated request.
        self._seq = int.from_bytes(os.urandom(2), "little")
        self._decoder = FrameDecoder(max_payload)
        self._frames: deque[Frame] = deque()
        self._serial = None
        self._open()

    def __enter__(self) -> DeviceLink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def garbage_bytes(self) -> int:
        """Bytes that were not part of a valid frame (noise, REPL output, truncated frames)."""
        return self._decoder.skipped

    def _open(self) -> None:
        self._serial = open_serial(self.port, self.baudrate)
        self._serial.reset_input_buffer()      # what the board printed before we listened

    def close(self) -> None:
        if self._serial is not None:
            try:
                self._serial.close()
            except OSError:
                pass                           # the port is gone already
            self._serial = None

    def reopen(self, wait_s: float = 5.0) -> None:
        """Open the port again after it went away, waiting up to ``wait_s`` for it to come back."""
        self.close()
        self._decoder.reset()
        self._frames.clear()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._open()
                return
            except LinkError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _open_port(self):
        """The serial port; :class:`LinkError` once the link is closed."""
        if self._serial is None:
            raise LinkError(f"the link to {self.port} is closed")
        return self._serial

    def _io(self, fn, *args):
        if self._serial is None:
            raise LinkError(f"the link to {self.port} is closed")
        serial = _serial_module()
        try:
            return fn(*args)
        except (serial.SerialException, OSError) as exc:
            raise LinkDropped(f"lost the link to {self.port} ({exc}); {_MCU_HINT}") from None

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFF
        return self._seq

    def send(self, ftype: int, payload: bytes = b"") -> int:
        """Send one frame with a new sequence number; returns it."""
        seq = self._next_seq()
        self._io(self._open_port().write, encode_frame(ftype, seq, payload, self.max_payload))
        return seq

    def recv(self, timeout_s: float | None = None) -> Frame:
        """The next valid frame; :class:`LinkTimeout` if none comes in ``timeout_s``."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        deadline, last_byte = now + timeout_s, now
        while not self._frames:
            if now >= deadline:
                raise LinkTimeout(f"no frame from {self.port} in {timeout_s:g} s; is the firmware "
                                  "running on the board?")
            port = self._open_port()
            data = self._io(port.read, max(1, self._io(lambda: port.in_waiting)))
            now = time.monotonic()
            if data:
                self._frames.extend(self._decoder.feed(data))
                last_byte = now
                if not self._frames:
                    self._check_repl()
            elif self._decoder.pending and now - last_byte >= self.stall_s:
                self._frames.extend(self._decoder.stall())
        return self._frames.popleft()

    def start_program(self, statement: str, **kwargs) -> None:
        """:func:`start_program` on this link's open port; what the program printed right away (a
        traceback, if it failed at import) is taken as received on the link."""
        self._frames.clear()
        self._decoder.reset()
        if self._serial is None:
            raise LinkError(f"the link to {self.port} is closed")
        self.absorb(start_program(self.port, statement, self.baudrate, serial=self._serial, **kwargs))

    def absorb(self, data: bytes) -> None:
        """Take bytes read from the port outside :meth:`recv` as if they had just arrived."""
        self._frames.extend(self._decoder.feed(data))
        if not self._frames:
            self._check_repl()

    def _check_repl(self) -> None:
        # Bytes that are no frame and hold the REPL prompt: the firmware is not running. With a
        # traceback before the prompt it crashed, and the traceback says why.
        garbage = self._decoder.garbage
        end = garbage.find(_PROMPT)
        if end < 0:
            return
        # Whatever follows the prompt (the REPL echoing a frame sent into it) does not matter.
        text = bytes(garbage[:end + len(_PROMPT)])
        garbage.clear()
        at = text.rfind(_TRACEBACK)
        trace = text[at:-len(_PROMPT)].decode(errors="replace").replace("\r\n", "\n").strip() if at >= 0 else ""
        # A traceback through a file is the firmware's; one in <stdin> alone is the REPL running
        # the bytes of a frame sent after the firmware had gone (a reset): it is not running.
        if any(name != "<stdin>" for name in _FILE_FRAME.findall(trace)):
            raise FirmwareCrashed(f"the firmware on {self.port} stopped with an error:\n{trace}")
        raise FirmwareStopped(f"{self.port} is at the MicroPython prompt: the firmware is not running "
                              "(was the board reset?)")

    def request(self, ftype: int, payload: bytes = b"", reply_types=None,
                timeout_s: float | None = None, retries: int = 3) -> Frame:
        """Send a request and return the reply with its seq (and a type in ``reply_types``).

        Without a reply in ``timeout_s`` the same frame is sent again, up to ``retries`` times; a
        port that went away is reopened. Frames that answer nothing pending are dropped (counted
        in ``discarded``).
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        seq = self._next_seq()
        frame = encode_frame(ftype, seq, payload, self.max_payload)
        # Before a resend, zeros as long as the longest frame: a firmware whose stdin read blocks
        # until it has every byte it asked for may sit inside a truncated frame or a false
        # header; the zeros complete it (its CRC fails), and zeros never make a sync.
        pad = bytes(HEADER.size + self.max_payload + CRC.size)
        for attempt in range(retries + 1):
            if attempt:
                self.resends += 1
            try:
                self._io(self._open_port().write, pad + frame if attempt else frame)
                deadline = time.monotonic() + timeout_s
                while True:
                    reply = self.recv(max(0.0, deadline - time.monotonic()))
                    if reply.seq == seq and (reply_types is None or reply.type in reply_types):
                        return reply
                    self.discarded += 1
            except LinkTimeout:
                continue
            except LinkDropped:
                self.reopen(wait_s=timeout_s)
        raise LinkTimeout(f"no reply from {self.port} to a frame of type {ftype} after "
                          f"{retries + 1} tries of {timeout_s:g} s; is the firmware running on the "
                          "board?")


def start_program(port: str, statement: str, baudrate: int = 115200, timeout_s: float = 5.0,
                  soft_reset: bool = True, serial=None) -> bytes:
    """Type ``statement`` at the board's friendly REPL (e.g. ``import fw_train; fw_train.serve()``)
    and return once it has started, without waiting for it to end. With ``soft_reset`` the board
    is soft-reset first (Ctrl-D), so the program starts in a fresh heap, not in one holding what
    mpremote or an earlier session left behind. Returns what the board printed after the echo of
    the statement (the start of the program's output).

    ``serial``: a port already open (a :class:`DeviceLink`'s, see :meth:`DeviceLink.start_program`)
    that stays open, so the program's first output cannot fall between two opens of the port.
    Until the program has opened its ``link.Link``, Ctrl-C still interrupts it on a board: wait
    for its first frame (or a reply) before sending payloads that may hold 0x03.
    """
    if "\r" in statement or "\n" in statement:
        raise ValueError("start_program types one line: join statements with ';'")
    with contextlib.nullcontext(serial) if serial is not None else open_serial(port, baudrate) as ser:
        def expect(ending: bytes, what: str) -> bytes:
            seen = bytearray()
            deadline = time.monotonic() + timeout_s
            while ending not in seen:
                if time.monotonic() >= deadline:
                    tail = bytes(seen[-200:]).decode(errors="replace")
                    raise LinkError(f"{port}: no {what} from MicroPython in {timeout_s:g} s "
                                    f"(got {tail!r}); is the board running MicroPython, and no "
                                    "program that ignores Ctrl-C? Reset it and try again")
                seen += ser.read(max(1, ser.in_waiting))
            return bytes(seen[seen.find(ending) + len(ending):])

        try:
            ser.reset_input_buffer()      # a prompt left from before must not count
            ser.write(b"\r\x03\x03")      # interrupt what runs
            ser.write(b"\r\x02")          # leave the raw REPL if mpremote left the board there
            expect(b"\n>>> ", "prompt")
            if soft_reset:
                ser.reset_input_buffer()
                ser.write(b"\x04")
                expect(b"\n>>> ", "prompt after a soft reset")
            ser.reset_input_buffer()
            line = statement.encode()
            ser.write(line + b"\r")
            return expect(line + b"\r\n", "echo of the statement")   # the REPL echoes the line typed
        except _serial_module().SerialException as exc:
            raise LinkError(f"lost the link to {port} ({exc}); {_MCU_HINT}") from None
