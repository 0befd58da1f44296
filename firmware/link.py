# Framed binary link over the board's USB serial (MicroPython side of insitu.mcu.link).
#
# A frame, little-endian:
#   sync (2 bytes) | type (u8) | seq (u16) | payload length (u16) | payload | CRC-32 (u32)
# The CRC (binascii.crc32, as zlib) covers type, seq, length and payload. The constants below are
# the one definition of the layout: the host reads them from this file's source.
#
# The receiver resynchronises after garbage: a candidate frame whose sync, length or CRC is wrong
# loses its first byte and the rest is scanned again, so a frame hidden behind garbage or behind a
# truncated frame is still found. A candidate that stops arriving mid-frame for timeout_ms is
# treated the same way (a truncated frame whose length would otherwise swallow the next frames).
# Silence is noticed between reads of up to _PIECE bytes (a stdin read blocks until it has them
# all); inside a read, the host's resend completes the candidate: it sends a frame's length of
# zeros before each resend.
#
# Steady state allocates no buffers: rx/tx are preallocated and frames are read and written
# through memoryview slices of them (a slice is a small object; the bytes are never copied out).

import binascii
import micropython
import select
import struct
import sys

SYNC = b"\xa5\x5a"
HEADER = "<2sBHH"            # sync, type, seq, payload length
CRC = "<I"                   # CRC-32 of everything after the sync bytes
MAX_PAYLOAD = 2048

HEADER_SIZE = struct.calcsize(HEADER)
CRC_SIZE = struct.calcsize(CRC)
# Offsets of HEADER's fields, read by hand: unpack_from would allocate a tuple per frame.
_AT_TYPE = len(SYNC)
_AT_SEQ = _AT_TYPE + 1
_AT_LEN = _AT_SEQ + 2
# CRC-32 run over data followed by its own little-endian CRC always gives this residue: checking it
# needs no 32-bit int for the received CRC (that would be a heap object on a 32-bit board).
_CRC_RESIDUE = 0x2144DF1C
# Bytes of a begun frame read per poll: few reads per frame, yet a stall is seen soon.
_PIECE = 256


class Link:
    """Frames over a byte stream pair (default: the REPL's USB serial, stdin/stdout).

    While a Link is open, Ctrl-C (0x03) is an ordinary byte: close() gives it back its meaning.
    Replies carry the seq of their request; a resent request is answered from the last frame
    sent, so reply before sending anything else.
    """

    def __init__(self, stream_in=None, stream_out=None, max_payload=MAX_PAYLOAD, timeout_ms=200):
        self._in = stream_in or sys.stdin.buffer
        self._out = stream_out or sys.stdout.buffer
        self._flush = getattr(self._out, "flush", None)
        self.max_payload = max_payload
        self.timeout_ms = timeout_ms
        size = HEADER_SIZE + max_payload + CRC_SIZE
        self._rx = bytearray(size)
        self._rxv = memoryview(self._rx)
        self._tx = bytearray(size)
        self._txv = memoryview(self._tx)
        self._s = 0              # the candidate frame starts at _rx[_s]
        self._n = 0              # bytes held from _s on
        self._quiet = False      # the sender stopped mid-frame: rescan what is held, wait no more
        self._poll = select.poll()
        self._poll.register(self._in, select.POLLIN)
        self._tx_len = 0
        self._last_seq = -1      # seq of the last frame recv() returned...
        self._last_crc = bytearray(CRC_SIZE)   # ...and its CRC, to recognise a resend
        self._answered = False   # send() replied to it: the reply is the frame in _tx
        self.skipped = 0         # garbage bytes dropped while resynchronising
        micropython.kbd_intr(-1)

    def close(self):
        micropython.kbd_intr(3)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def recv(self):
        """Block until a valid frame arrives; returns (type, seq, payload memoryview).

        The payload is a view into the receive buffer, valid until the next recv(). A resend of
        the request answered last (same seq and CRC: the host lost the reply) is answered again
        with that reply, not returned.
        """
        rx = self._rx
        while True:
            if not self._fill(HEADER_SIZE):
                self._skip(1)
                continue
            s = self._s
            if rx[s] != SYNC[0] or rx[s + 1] != SYNC[1]:
                self._skip(1)
                continue
            n = rx[s + _AT_LEN] | rx[s + _AT_LEN + 1] << 8
            size = HEADER_SIZE + n + CRC_SIZE
            if n > self.max_payload or not self._fill(size):
                self._skip(1)
                continue
            s = self._s                                           # _fill may have compacted
            if binascii.crc32(self._rxv[s + _AT_TYPE:s + size]) != _CRC_RESIDUE:
                self._skip(1)
                continue
            ftype = rx[s + _AT_TYPE]
            seq = rx[s + _AT_SEQ] | rx[s + _AT_SEQ + 1] << 8
            payload = self._rxv[s + HEADER_SIZE:s + HEADER_SIZE + n]
            resend = seq == self._last_seq and self._answered
            for i in range(CRC_SIZE):
                c = rx[s + size - CRC_SIZE + i]
                resend = resend and self._last_crc[i] == c
                self._last_crc[i] = c
            self._consume(size)
            if resend:
                self._write(self._txv[:self._tx_len])
                continue
            self._last_seq = seq
            self._answered = False
            return ftype, seq, payload

    def send(self, ftype, seq, payload=b""):
        """Send one frame (payload: bytes-like, or text); a reply carries the seq of the request
        it answers."""
        if isinstance(payload, str):
            payload = payload.encode()
        n = len(payload)
        if n > self.max_payload:
            raise ValueError("payload too long for the link")
        struct.pack_into(HEADER, self._tx, 0, SYNC, ftype, seq, n)
        self._txv[HEADER_SIZE:HEADER_SIZE + n] = payload
        struct.pack_into(CRC, self._tx, HEADER_SIZE + n,
                         binascii.crc32(self._txv[_AT_TYPE:HEADER_SIZE + n]))
        self._tx_len = HEADER_SIZE + n + CRC_SIZE
        self._answered = seq == self._last_seq
        self._write(self._txv[:self._tx_len])

    def _write(self, data):
        self._out.write(data)
        if self._flush:
            self._flush()

    def _skip(self, k):
        self._s += k
        self._n -= k
        self.skipped += k
        if not self._n:
            self._s = 0

    def _consume(self, k):
        self._s += k
        self._n -= k
        if not self._n:
            self._s = 0

    def _fill(self, k):
        # Hold k bytes from _s on. A board's stdin read blocks until it has every byte asked for,
        # so a frame already begun is read in pieces, each after a poll: a sender gone quiet
        # mid-frame is noticed at the next piece. False if it went quiet before the k bytes came.
        if self._s + k > len(self._rx):
            rx = self._rx
            for i in range(self._n):                              # rare: after a resync
                rx[i] = rx[self._s + i]
            self._s = 0
        while self._n < k:
            want = k - self._n
            if self._n:
                if not self._readable(0 if self._quiet else self.timeout_ms):
                    self._quiet = True
                    return False
                want = min(want, _PIECE)
            else:
                self._readable(-1)                                # idle: wait for a frame
            at = self._s + self._n
            got = self._in.readinto(self._rxv[at:at + want])
            if got == 0:
                raise EOFError("the link's input stream ended")
            if got:                                               # None: nothing yet
                self._n += got
                self._quiet = False
        return True

    def _readable(self, timeout_ms):
        for _ in self._poll.ipoll(timeout_ms):
            return True
        return False
