"""firmware/link.py in the real MicroPython interpreter, talking to the host's link code: over
pipes (the unix port), and over the serial port of both twins, the Cortex-M7 one and the unix port
(garbage both ways, every byte value, a pulled cable)."""

import os
import random
import select
import shutil
import subprocess
import time

import pytest

from insitu.mcu.link import (HEADER, MAX_PAYLOAD, SYNC, DeviceLink, Frame, FrameDecoder,
                             encode_frame, start_program)
from insitu.mcu.flash import flash
from insitu.mcu.twin import TWINS, McuTwin, find_tool
from insitu.resources import package_dir

pytestmark = pytest.mark.firmware

ECHO, COUNT, NOISY, ALLOC = 1, 2, 3, 4

# The device side: echoes frames; counts the echoes it handled (a resend answered from the last
# reply is not handled again); NOISY writes its payload raw before an empty reply; ALLOC measures
# what 50 echoes of 1 KB allocate.
ECHO_SERVER = """
import gc, sys, link

def serve(timeout_ms=200):
    handled = 0
    with link.Link(timeout_ms=timeout_ms) as l:
        while True:
            t, seq, payload = l.recv()
            if t == 1:
                handled += 1
                l.send(1, seq, payload)
            elif t == 2:
                l.send(2, seq, handled.to_bytes(4, 'little'))
            elif t == 3:
                sys.stdout.buffer.write(payload)
                l.send(3, seq)
            elif t == 4:
                gc.collect()
                before = gc.mem_alloc()
                for _ in range(50):
                    t2, seq2, p2 = l.recv()
                    l.send(t2, seq2, p2)
                l.send(4, seq, (gc.mem_alloc() - before).to_bytes(4, 'little'))
"""

EVERY_BYTE = bytes(range(256)) * 4 + b"\x03\x03\x04\r\n\r\x01\x02\x05\x04"


def install(folder):
    shutil.copy(package_dir("firmware") / "link.py", folder / "link.py")
    (folder / "echo_server.py").write_text(ECHO_SERVER)


# -- over pipes --------------------------------------------------------------------------------

@pytest.fixture
def piped(tmp_path):
    install(tmp_path)
    proc = subprocess.Popen([find_tool("micropython"), "-X", "heapsize=256K", "-c",
                             "import echo_server; echo_server.serve()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    yield proc
    proc.kill()
    proc.wait()


def read_frames(proc, count, dec, timeout_s=10.0):
    frames, deadline = [], time.monotonic() + timeout_s
    while len(frames) < count:
        assert select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0], \
            f"{len(frames)} of {count} frames came back in {timeout_s} s"
        data = os.read(proc.stdout.fileno(), 65536)
        assert data, f"the echo server ended: {proc.stderr.read().decode()}"
        frames += dec.feed(data)
    return frames


def test_every_frame_sent_between_garbage_comes_back_in_order(piped):
    rng = random.Random(3)
    sent = [Frame(ECHO, seq, rng.randbytes(rng.randrange(0, 700)) + EVERY_BYTE[:rng.randrange(300)])
            for seq in range(30)]
    stream = bytearray()
    for frame in sent:
        encoded = encode_frame(*frame)
        junk = rng.choice([rng.randbytes(rng.randrange(40)),                     # noise
                           encoded[:rng.randrange(1, len(encoded))],             # truncated
                           SYNC[:1],                                             # half a sync
                           HEADER.pack(SYNC, 1, 0, MAX_PAYLOAD + 1),             # over the cap
                           bytes([encoded[0] ^ 0x10]) + encoded[1:]])            # flipped bit
        stream += junk + encoded
    piped.stdin.write(bytes(stream))
    piped.stdin.flush()
    assert read_frames(piped, len(sent), FrameDecoder()) == sent


def test_a_frame_that_stops_midway_is_dropped_after_the_timeout(piped):
    dec = FrameDecoder()
    # A false header whose length would swallow the next request, then silence.
    piped.stdin.write(HEADER.pack(SYNC, ECHO, 1, 1500))
    piped.stdin.flush()
    time.sleep(1.0)                                      # the device waits 200 ms, then rescans
    piped.stdin.write(encode_frame(ECHO, 2, b"after the stall"))
    piped.stdin.flush()
    assert read_frames(piped, 1, dec) == [Frame(ECHO, 2, b"after the stall")]


def test_frames_are_not_copied_on_the_device(piped):
    dec = FrameDecoder()
    payload = bytes(range(256)) * 4
    piped.stdin.write(encode_frame(ALLOC, 1) + b"".join(encode_frame(ECHO, 2 + i, payload)
                                                        for i in range(50)))
    piped.stdin.flush()
    frames = read_frames(piped, 51, dec)
    assert [f.payload for f in frames[:50]] == [payload] * 50
    allocated = int.from_bytes(frames[50].payload, "little")
    # Only small objects (memoryview slices, result tuples): less than one payload per frame,
    # which copying every payload would take on its own.
    assert allocated < 50 * len(payload), allocated


# -- over the twin's serial port ---------------------------------------------------------------

@pytest.fixture(scope="module", params=TWINS)
def echo_board(tmp_path_factory, request):
    """A board of each twin's kind with the echo server flashed (the twin stopped)."""
    folder = tmp_path_factory.mktemp("echo-board") / "flash"
    with McuTwin(folder, twin=request.param) as twin:
        # Deployed as on a board (sources: the echo server is the test's, not insitu's firmware).
        flash(twin.port, {"link.py": package_dir("firmware") / "link.py",
                          "echo_server.py": ECHO_SERVER.encode()}, compile_mpy=False)
    return folder, request.param


@pytest.fixture
def device(tmp_path, echo_board):
    """A fresh start of a copy of that board, its echo server serving."""
    flashed, kind = echo_board
    shutil.copytree(flashed, tmp_path / "flash")
    with McuTwin(tmp_path / "flash", twin=kind) as twin:
        start_program(twin.port, "import echo_server; echo_server.serve()")
        with DeviceLink(twin.port, timeout_s=1.0) as dl:
            yield twin, dl


def handled(dl):
    return int.from_bytes(dl.request(COUNT, reply_types={COUNT}).payload, "little")


def test_every_byte_value_survives_the_serial_port(device):
    _, dl = device
    for payload in (EVERY_BYTE, bytes([3]) * 64, b"\x04", b"\r\n" * 100, bytes(MAX_PAYLOAD)):
        assert dl.request(ECHO, payload, reply_types={ECHO}).payload == payload
    assert dl.resends == 0 and dl.garbage_bytes == 0


def test_garbage_both_ways_costs_no_frame(device):
    twin, dl = device
    rng = random.Random(5)
    injector = os.open(twin.port, os.O_WRONLY | os.O_NOCTTY)      # line noise towards the board
    try:
        for i in range(20):
            os.write(injector, rng.randbytes(rng.randrange(1, 50)) + b"\x03\r\x04")
            noise = rng.randbytes(rng.randrange(1, 200))
            assert dl.request(NOISY, noise, reply_types={NOISY}).payload == b""
            payload = rng.randbytes(rng.randrange(0, 500))
            assert dl.request(ECHO, payload, reply_types={ECHO}).payload == payload
    finally:
        os.close(injector)
    assert dl.garbage_bytes > 0
    assert handled(dl) == 20


def test_a_resend_is_answered_from_the_last_reply_not_handled_twice(device):
    twin, dl = device
    before = handled(dl)
    frame = encode_frame(ECHO, 4242, b"once")
    sender = os.open(twin.port, os.O_WRONLY | os.O_NOCTTY)
    try:
        for _ in range(3):                               # as if two replies had been lost
            os.write(sender, frame)
            assert dl.recv() == Frame(ECHO, 4242, b"once")
    finally:
        os.close(sender)
    assert handled(dl) == before + 1


def test_a_request_swallowed_by_a_false_header_is_answered_at_the_first_resend(device):
    twin, dl = device
    # The request's bytes go into the false frame's length, inside one read of the device, which
    # then waits for more: the sender never went quiet between reads, so only a resend helps.
    sender = os.open(twin.port, os.O_WRONLY | os.O_NOCTTY)
    try:
        os.write(sender, HEADER.pack(SYNC, ECHO, 1, MAX_PAYLOAD))
    finally:
        os.close(sender)
    assert dl.request(ECHO, b"swallowed", timeout_s=1.0, retries=1).payload == b"swallowed"
    assert dl.resends == 1
    assert handled(dl) == 1


def test_a_pulled_cable_is_survived_by_reopening_the_port(device):
    twin, dl = device
    assert dl.request(ECHO, b"before").payload == b"before"
    twin.drop_link(0.3)
    assert not os.path.exists(twin.port)
    assert dl.request(ECHO, b"after", timeout_s=1.0, retries=3).payload == b"after"
    assert dl.resends >= 1
    assert handled(dl) == 2
