"""The simulated STM32F746 through the tools a real board is reached with: mpremote, `insitu
flash`, `insitu mcu emulate`. Each test runs on both twins: the Cortex-M7 one (MicroPython's QEMU
port, the default) and the MicroPython unix port."""

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN
from insitu.mcu.twin import TWINS, FlashFiles, McuTwin, find_tool
from insitu.resources import package_dir

pytestmark = pytest.mark.firmware


def mpremote(port, *args, check=True):
    run = subprocess.run([find_tool("mpremote"), "connect", port, *args], capture_output=True,
                         text=True, timeout=30)
    if check:
        assert run.returncode == 0, run.stdout + run.stderr
    return run


@pytest.fixture(params=TWINS)
def kind(request):
    return request.param


@pytest.fixture
def twin(tmp_path, kind):
    with McuTwin(tmp_path / "flash", twin=kind) as t:
        yield t


def test_the_cortex_m7_twin_is_a_32_bit_board_with_single_precision_floats(tmp_path):
    with McuTwin(tmp_path / "flash") as twin:
        out = mpremote(twin.port, "exec", "import sys, array; print(sys.maxsize, sys.platform, "
                                          "array.array('f', [1/3])[0] == 1/3, sys.implementation._machine)")
    maxsize, platform, floats_are_single, machine = out.stdout.split(maxsplit=3)
    assert (maxsize, platform, floats_are_single) == ("2147483647", "qemu", "True")
    assert machine.strip().endswith("with Cortex-M7")


def test_mpremote_runs_code_and_each_command_soft_resets_the_board(twin):
    for i in range(3):
        assert mpremote(twin.port, "exec", f"print({i} + 40)").stdout == f"{40 + i}\n"
    # Each mpremote command starts with a soft reset: on the Cortex-M7 twin inside the board, as
    # on a real one; the unix port exits and the twin starts it again.
    assert twin.restarts == (3 if twin.twin == "unix" else 0)
    mpremote(twin.port, "exec", "X = 5")
    assert mpremote(twin.port, "resume", "exec", "print(X)").stdout == "5\n"   # no reset: kept
    run = mpremote(twin.port, "exec", "print(X)", check=False)                   # reset: gone
    assert run.returncode != 0 and "NameError" in run.stdout + run.stderr


def test_files_copied_with_mpremote_land_in_the_flash_folder_and_import(twin, tmp_path):
    (tmp_path / "x.py").write_text("VALUE = 6 * 7\n")
    mpremote(twin.port, "fs", "cp", str(tmp_path / "x.py"), ":x.py")
    assert twin.files.read("x.py") == b"VALUE = 6 * 7\n"
    assert mpremote(twin.port, "exec", "import x; print(x.VALUE)").stdout == "42\n"


def test_the_heap_is_the_boards_training_budget(twin):
    assert twin.heap_bytes == 262144
    assert mpremote(twin.port, "exec", "b = bytearray(200_000); print(len(b))").stdout == "200000\n"
    run = mpremote(twin.port, "exec", "b = bytearray(300_000)", check=False)
    assert run.returncode != 0 and "MemoryError" in run.stdout + run.stderr


def test_a_smaller_heap_is_honoured(tmp_path, kind):
    with McuTwin(tmp_path, heap_bytes="64K", twin=kind) as small:
        assert small.heap_bytes == 65536
        run = mpremote(small.port, "exec", "import gc; print(gc.mem_free() + gc.mem_alloc()); "
                                           "b = bytearray(100_000)", check=False)
    assert "MemoryError" in run.stdout + run.stderr
    # What the interpreter has of it: 64 KiB less its allocation tables, as a board's heap.
    assert 0.95 * 65536 < int(run.stdout.split()[0]) <= 65536


def test_the_board_comes_back_after_a_crash_and_after_a_hard_reset(twin, tmp_path):
    (tmp_path / "kept.py").write_text("print('still here')\n")
    mpremote(twin.port, "fs", "cp", str(tmp_path / "kept.py"), ":kept.py")
    crashed = twin.pid
    os.kill(crashed, signal.SIGKILL)
    assert mpremote(twin.port, "exec", "import kept").stdout == "still here\n"
    assert twin.pid != crashed
    before = twin.pid
    twin.reset()
    assert twin.pid != before
    assert twin.files.exists("kept.py")
    assert mpremote(twin.port, "exec", "import kept").stdout == "still here\n"


def test_a_twin_that_cannot_start_says_why(tmp_path, kind):
    # Start failures that do not depend on how an interpreter was built: the Cortex-M7 board
    # (firmware/qemu-f746/board.c, ours) refuses a heap under 4 KiB before its REPL starts; the
    # unix port's handling of a tiny heap varies by build (some REPLs start with 1 KiB and only
    # `-c` scripts fail), so its twin is given an interpreter that exits at once, saying nothing.
    from insitu.errors import InsituError

    if kind == "qemu":
        twin, why = McuTwin(tmp_path, heap_bytes=1024), "did not start with heap 1024 bytes.*too small to boot"
    else:
        twin = McuTwin(tmp_path, heap_bytes=1024, twin="unix", micropython="false")
        why = r"unix port \(.*false\) did not start with heap 1024 bytes: no output"
    with pytest.raises(InsituError, match=why):
        twin.start()


def test_the_cortex_m7_twins_heap_has_a_limit(tmp_path):
    from insitu.errors import UsageError

    with pytest.raises(UsageError, match="at most 1,048,576 B.*--twin unix"):
        McuTwin(tmp_path, heap_bytes="2M")


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (the board of an `insitu mcu emulate`)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue                                       # it ended while we looked
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def read_line(stream, timeout_s=20.0) -> str:
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        assert select.select([stream], [], [], max(0.0, deadline - time.monotonic()))[0], \
            f"no line in {timeout_s} s (got {line!r})"
        chunk = os.read(stream.fileno(), 1)
        assert chunk, f"stream closed (got {line!r})"
        line += chunk
    return line.decode()


def test_emulate_serves_mpremote_and_insitu_flash_resets_on_sigusr1_and_stops_on_sigterm(tmp_path, kind):
    flash_dir = tmp_path / "flash"
    with McuTwin(flash_dir, twin=kind):                     # a board that has been used before
        pass
    files = FlashFiles(flash_dir, kind)
    files.write("link.py", b"STALE = True\n")                # would shadow the new link.mpy
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(bytes(range(256)) * 3)
    proc = subprocess.Popen([str(VENV_BIN / "insitu"), "mcu", "emulate", "--json", "--twin", kind,
                             "--flash-dir", str(flash_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        info = json.loads(read_line(proc.stdout))
        assert info["heap_bytes"] == 262144 and info["flash_dir"] == str(flash_dir)
        assert info["twin"] == kind
        assert info["pid"] == proc.pid
        port = info["port"]
        assert mpremote(port, "exec", "print('hello')").stdout == "hello\n"

        run = subprocess.run([str(VENV_BIN / "insitu"), "flash", "--board", "stm32f746-disco-sim",
                              "--port", port, "--model-dir", str(model), "--json"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        runtime = sorted(p.stem for p in package_dir("firmware").glob("*.py"))
        assert result["arch"] == {"qemu": "armv7emsp", "unix": "x64"}[kind]
        # the Cortex-M7 gets the C kernels too (a native module for its arch)
        expected = sorted([f"{name}.mpy" for name in runtime] + ["weights.bin"]
                          + (["tte_native.mpy"] if kind == "qemu" else []))
        assert sorted(f["name"] for f in result["files"]) == expected
        assert all(f["sent"] for f in result["files"])          # none was on the board
        assert files.names() == expected
        assert files.read("weights.bin") == bytes(range(256)) * 3
        out = mpremote(port, "exec", "import link; print(link.MAX_PAYLOAD, link.__file__)").stdout
        assert out == "2048 link.mpy\n"

        (board,) = children(proc.pid)
        proc.send_signal(signal.SIGUSR1)                  # the reset button
        deadline = time.monotonic() + 10
        while children(proc.pid) in ([], [board]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(children(proc.pid)) == 1 and children(proc.pid) != [board]
        assert mpremote(port, "exec", "import link; print(link.MAX_PAYLOAD)").stdout == "2048\n"
        left = children(proc.pid)
        assert len(left) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read().decode()
    assert "hard reset" in proc.stderr.read().decode()
    assert not os.path.exists(port)
    assert not os.path.exists(f"/proc/{left[0]}")         # no orphan machine


def test_flash_to_an_unknown_port_fails_naming_the_port(run_cli, tmp_path):
    port = str(tmp_path / "ttyACM7")
    run = run_cli("flash", "--board", "stm32f746-disco-sim", "--port", port)
    assert run.returncode != 0
    assert port in run.stderr and "insitu mcu emulate" in run.stderr


def test_flash_refuses_a_real_board_name_for_a_twin(run_cli, twin):
    run = run_cli("flash", "--board", "stm32f746-disco", "--port", twin.port)
    assert run.returncode == 2
    assert "--board stm32f746-disco-sim" in run.stderr
    assert twin.files.names() == []


def test_emulate_refuses_a_real_board(run_cli):
    run = run_cli("mcu", "emulate", "--board", "stm32f746-disco")
    assert run.returncode == 2 and "--board stm32f746-disco-sim" in run.stderr
