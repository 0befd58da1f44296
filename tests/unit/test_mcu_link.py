"""The host side of the framed serial link: encoding, resynchronisation, requests over a pty."""

import binascii
import os
import random
import re
import select
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from insitu.errors import InsituError
from insitu.mcu import link
from insitu.mcu.link import (CRC, HEADER, MAX_PAYLOAD, SYNC, DeviceLink, Frame, FrameDecoder,
                             LinkError, LinkTimeout, encode_frame)

pytestmark = pytest.mark.unit

frames_st = st.lists(st.builds(Frame, st.integers(0, 255), st.integers(0, 0xFFFF),
                               st.binary(max_size=300)), min_size=1, max_size=8)


def decode_all(data: bytes, chunks: list[int] | None = None) -> tuple[list[Frame], FrameDecoder]:
    """Feed ``data`` in pieces, then let the sender go quiet."""
    dec, out, at = FrameDecoder(), [], 0
    for size in chunks or [len(data)]:
        out += dec.feed(data[at:at + size])
        at += size
    out += dec.feed(data[at:])
    out += dec.stall()
    assert dec.pending == 0
    return out, dec


def test_frame_layout_comes_from_the_firmware_source():
    assert SYNC == b"\xa5\x5a" and HEADER.size == 7 and CRC.size == 4 and MAX_PAYLOAD == 2048
    frame = encode_frame(0x12, 0x3456, b"xyz")
    assert frame[:7] == b"\xa5\x5a\x12\x56\x34\x03\x00" and frame[7:10] == b"xyz"
    assert int.from_bytes(frame[10:], "little") == binascii.crc32(frame[2:10])


def test_a_firmware_file_without_the_constants_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "link.py").write_text('SYNC = b"\\xa5\\x5a"\nHEADER = "<2sBHH"\nCRC = "<I"\n'
                                      "MAX_PAYLOAD = 1024 * 2\n")
    monkeypatch.setattr(link, "package_dir", lambda name: tmp_path)
    with pytest.raises(InsituError, match="MAX_PAYLOAD"):
        link._constants_from_firmware()


@given(frames_st, st.data())
def test_frames_round_trip_whatever_the_read_sizes(frames, data):
    stream = b"".join(encode_frame(*f) for f in frames)
    chunks = data.draw(st.lists(st.integers(1, 64), max_size=40))
    out, dec = decode_all(stream, chunks)
    assert out == frames and dec.skipped == 0


def _damaged(frame: bytes, rng: random.Random) -> bytes:
    """A frame that must not come out: truncated, or with one bit flipped."""
    if rng.random() < 0.5:
        return frame[:rng.randrange(1, len(frame))]
    at = rng.randrange(len(frame))
    return frame[:at] + bytes([frame[at] ^ (1 << rng.randrange(8))]) + frame[at + 1:]


@settings(max_examples=200)
@given(frames_st, st.lists(st.binary(max_size=40), min_size=9, max_size=9), st.randoms(),
       st.lists(st.integers(1, 50), max_size=30))
def test_every_valid_frame_comes_out_in_order_between_garbage_truncations_and_flipped_bits(
        frames, garbage, rng, chunks):
    stream = bytearray(garbage[0])
    for i, frame in enumerate(frames):
        encoded = encode_frame(*frame)
        # The damaged copy right before the frame: bytes after a truncated copy could complete
        # it into a valid frame (garbage ending with the missing CRC byte, say); the frame's own
        # bytes can only complete it into the same frame, which then loses its head.
        stream += garbage[i + 1] + _damaged(encoded, rng) + encoded
    stream += garbage[-1]
    out, dec = decode_all(bytes(stream), chunks)
    assert out == frames
    assert dec.skipped > 0


def test_garbage_that_looks_like_a_header_is_dropped_when_the_sender_goes_quiet():
    # A false sync whose length field would swallow the frame after it.
    fake = SYNC + bytes([1, 0, 0]) + (MAX_PAYLOAD).to_bytes(2, "little")
    frame = encode_frame(5, 9, b"payload")
    dec = FrameDecoder()
    assert dec.feed(fake + frame) == []         # the frame is inside the fake one's length
    assert dec.stall() == [Frame(5, 9, b"payload")]
    assert dec.skipped == len(fake) and dec.pending == 0


def test_a_length_over_the_cap_is_refused_without_waiting():
    header = HEADER.pack(SYNC, 1, 2, MAX_PAYLOAD + 1)
    frame = encode_frame(3, 4, bytes(MAX_PAYLOAD))
    dec = FrameDecoder()
    assert dec.feed(header + frame) == [Frame(3, 4, bytes(MAX_PAYLOAD))]
    assert dec.skipped == len(header)
    with pytest.raises(ValueError, match="over the link's maximum"):
        encode_frame(1, 1, bytes(MAX_PAYLOAD + 1))
    small = FrameDecoder(max_payload=16)
    assert small.feed(encode_frame(1, 1, bytes(17)) + encode_frame(1, 2, bytes(16))) == \
        [Frame(1, 2, bytes(16))]


def test_a_bad_crc_drops_the_frame_and_keeps_the_next():
    bad = bytearray(encode_frame(1, 1, b"abc"))
    bad[-1] ^= 0xFF
    good = encode_frame(1, 2, b"def")
    dec = FrameDecoder()
    assert dec.feed(bytes(bad) + good) == [Frame(1, 2, b"def")]
    assert dec.skipped == len(bad)


@pytest.mark.parametrize("args", [(256, 0), (-1, 0), (0, 0x10000), (0, -1)])
def test_encode_refuses_out_of_range_fields(args):
    with pytest.raises(ValueError):
        encode_frame(*args)


# -- DeviceLink over a pseudo-terminal, with a Python stand-in for the firmware -----------------

class FakeBoard:
    """Answers each request on a pty with its payload reversed, after noise and a stale frame (a
    wrong seq); drops the first ``lose`` replies; with ``false_header``, the reply is hidden
    behind a false header whose length swallows it, and nothing follows."""

    def __init__(self, lose=0, false_header=False):
        self.master, slave = os.openpty()
        self.port = os.ttyname(slave)
        self._slave = slave
        self.lose = lose
        self.false_header = false_header
        self.requests = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        dec = FrameDecoder()
        while not self._stop.is_set():
            if not select.select([self.master], [], [], 0.02)[0]:
                continue
            for frame in dec.feed(os.read(self.master, 4096)):
                self.requests.append(frame)
                if self.lose:
                    self.lose -= 1
                    continue
                stale = encode_frame(frame.type, (frame.seq - 1) & 0xFFFF, b"stale")
                false = HEADER.pack(SYNC, 0, 0, 1500) if self.false_header else b""
                os.write(self.master, b"noise" + stale + false +
                         encode_frame(frame.type, frame.seq, frame.payload[::-1]))

    def close(self):
        self._stop.set()
        self._thread.join()
        os.close(self.master)
        os.close(self._slave)


@pytest.fixture
def board(request):
    fake = FakeBoard(**getattr(request, "param", {}))
    yield fake
    fake.close()


def test_request_gets_its_own_reply_past_noise_and_stale_frames(board):
    with DeviceLink(board.port, timeout_s=1.0) as dl:
        for payload in (b"", b"\x03\x04\r\n", bytes(range(256))):
            reply = dl.request(7, payload, reply_types={7})
            assert reply.payload == payload[::-1] and reply.seq == board.requests[-1].seq
        assert dl.discarded == 3 and dl.garbage_bytes == 3 * len(b"noise")
        assert dl.resends == 0


@pytest.mark.parametrize("board", [{"lose": 2}], indirect=True)
def test_a_lost_reply_is_asked_again_with_the_same_seq(board):
    with DeviceLink(board.port) as dl:
        reply = dl.request(1, b"ab", timeout_s=0.5, retries=3)
    assert reply.payload == b"ba"
    assert dl.resends == 2
    assert len({f.seq for f in board.requests}) == 1 and len(board.requests) == 3


@pytest.mark.parametrize("board", [{"lose": 10}], indirect=True)
def test_no_reply_after_all_retries_is_a_timeout_naming_the_port(board):
    with DeviceLink(board.port) as dl:
        with pytest.raises(LinkTimeout, match=f"no reply from {board.port}.*after 3 tries"):
            dl.request(1, b"x", timeout_s=0.1, retries=2)


@pytest.mark.parametrize("board", [{"false_header": True}], indirect=True)
def test_a_reply_swallowed_by_a_false_header_comes_out_when_the_board_goes_quiet(board):
    with DeviceLink(board.port) as dl:
        assert dl.request(1, b"xy", timeout_s=1.0, retries=0).payload == b"yx"
    assert dl.garbage_bytes >= HEADER.size


def test_an_unknown_port_is_a_link_error_naming_it(tmp_path):
    port = str(tmp_path / "ttyACM9")
    with pytest.raises(LinkError, match=f"{re.escape(port)}.*plugged in.*insitu mcu emulate"):
        DeviceLink(port)


# What a REPL prints when the firmware is not serving: a prompt, after a traceback if it raised.
_CRASH = (b'Traceback (most recent call last):\n  File "<stdin>", line 1, in <module>\n'
          b'  File "fw_train.py", line 9, in serve\nMemoryError: memory allocation failed\n>>> ')
_TYPED = (b'\x1b[KTraceback (most recent call last):\r\n  File "<stdin>", line 1\r\n'
          b'SyntaxError: invalid syntax\r\n>>> junk echoed after the prompt')


@pytest.mark.parametrize("printed, error, says", [
    (_CRASH, link.FirmwareCrashed, "(?s)fw_train.py.*MemoryError: memory allocation failed"),
    (b"soft reboot\r\nMicroPython v1.24 on linux\r\nType \"help()\" for more information.\r\n>>> ",
     link.FirmwareStopped, "at the MicroPython prompt"),
    # the REPL running a frame's bytes typed into it after a reset: not the firmware's traceback
    (_TYPED, link.FirmwareStopped, "at the MicroPython prompt"),
], ids=["crashed", "reset", "frame-typed-into-the-repl"])
def test_a_board_at_its_prompt_is_reported_at_once(printed, error, says):
    master, slave = os.openpty()
    try:
        with DeviceLink(os.ttyname(slave), timeout_s=5.0) as dl:
            os.write(master, b"noise" + printed)
            with pytest.raises(error, match=says) as info:
                dl.recv(timeout_s=5.0)
            assert (error is link.FirmwareStopped) == isinstance(info.value, LinkError)   # retried or not
    finally:
        os.close(master)
        os.close(slave)


def test_output_read_before_the_link_opened_is_not_lost():
    master, slave = os.openpty()
    try:
        with DeviceLink(os.ttyname(slave), timeout_s=1.0) as dl:
            with pytest.raises(link.FirmwareCrashed, match="MemoryError"):
                dl.absorb(_CRASH)
            dl.absorb(encode_frame(4, 9, b"ok"))
            assert dl.recv().payload == b"ok"
    finally:
        os.close(master)
        os.close(slave)
