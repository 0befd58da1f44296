"""`insitu train --algo sparse` on the simulated STM32F746 end to end, and what can go wrong on the
way: a pulled cable, a reset board, a bad weight blob, a crashing firmware, a scheme that does not
fit, a port that does not exist (refused before any pretraining); `insitu mcu minheap`.

Every device run is checked against the host simulator, which runs the same compiled program and
is bit-exact with the firmware: the trained tensors the device checkpoints (tte_ckpt.bin: magic,
model id, samples done, then the trained arena ranges) must equal the simulator's after the same
samples, so a sample lost or trained twice shows.

mbv2-tiny only (its pretrained cache builds in seconds). Every test that runs a board runs on both
twins: the Cortex-M7 one (QEMU, the default) and the unix port. The end-to-end run flashes a new
board; the other runs start from a copy of that board without its checkpoint (`flashed`), where a
flash sends only the files that changed (the copies over the twin's UART are most of a run's time).
"""

import json
import shutil
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import insitu.mcu.flash as mcu_flash
from insitu.mcu.device import DeviceError, TrainingDevice
from insitu.mcu.link import DeviceLink, FirmwareCrashed, LinkError, LinkTimeout
from insitu.sparse.simulate import Simulator
from insitu.mcu.board_runs import HEAP_MARGIN, Prepared, device_loss, firmware_files, run_on_device
from insitu.sparse import abi
from insitu.mcu.twin import TWINS, FlashFiles, McuTwin
from insitu.training import sample_order

pytestmark = pytest.mark.system

MODEL, TASK, SCHEME, LR, SEED = "mbv2-tiny", "digits", "bias-4", 0.01, 0
LR_SCALE = {"classifier": 5.0}     # with LR, the commands' default rates
SIM_BOARD, REAL_BOARD = "stm32f746-disco-sim", "stm32f746-disco"
BUDGET = 262144                    # the stm32f746-disco's training budget (its twin's heap)
SPARSE = ("train", "--algo", "sparse", "--model", MODEL, "--scheme", SCHEME)
BLOB = "tte_model.bin"


PLATFORM = {"qemu": "qemu", "unix": "linux"}     # sys.platform of each twin


# --------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module", params=TWINS)
def kind(request):
    """The kind of twin a test runs on."""
    return request.param


@pytest.fixture(scope="module")
def prep():
    """The compiled program `insitu train` builds for these options (deterministic)."""
    return Prepared(MODEL, TASK, SCHEME, LR, SEED, lr_scale=LR_SCALE)


@pytest.fixture(scope="module")
def end_to_end(kind, tmp_path_factory):
    """`insitu train --algo sparse` on a new board of this twin: its JSON and the board's flash."""
    from conftest import insitu_cli

    flash_dir = tmp_path_factory.mktemp("end-to-end") / "flash"
    run = insitu_cli(*SPARSE, "--board", SIM_BOARD, "--samples", 20, "--test-samples", 20,
                     "--flash-dir", flash_dir, "--twin", kind, "--json", timeout=180)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), flash_dir


@pytest.fixture(scope="module")
def flashed(prep, kind, end_to_end, tmp_path_factory):
    """A flash folder with the firmware and this program deployed by mpremote, not trained yet
    (the twin stopped): the end-to-end run's board without its checkpoint."""
    folder = tmp_path_factory.mktemp("flashed") / "flash"
    shutil.copytree(end_to_end[1], folder)
    files = FlashFiles(folder, kind)
    files.remove("tte_ckpt.bin")
    assert files.read(BLOB) == prep.compiled.blob
    c_kernels = ["tte_native.mpy"] if kind == "qemu" else []      # the C kernels where they load
    assert sorted(files.names()) == sorted([n.replace(".py", ".mpy") for n in firmware_files(prep.compiled)] + c_kernels)
    return folder


def copy_of(flashed, tmp_path) -> Path:
    """A board of its own with what `flashed` deployed (a test may break its files)."""
    folder = tmp_path / "flash"
    shutil.copytree(flashed, folder)
    return folder


def simulate(prep, samples: int):
    """The host simulator after `samples` training samples of the run's stream, and its
    predictions (made before each update)."""
    sim = Simulator(prep.compiled)
    order = sample_order(len(prep.y_train), SEED, 0, samples)
    predicted = [sim.train_step(prep.x_train[i], int(prep.y_train[i])) for i in order]
    return sim, np.array(predicted)


def checkpoint(folder: Path, kind: str) -> tuple[bytes, str, int, bytes]:
    """(magic, model id, samples done, trained tensors) of the device's checkpoint."""
    data = FlashFiles(folder, kind).read("tte_ckpt.bin")
    return data[:4], data[4:20].decode(), struct.unpack_from("<I", data, 20)[0], data[24:]


def assert_matches_simulation(prep, folder: Path, kind: str, result: dict, samples: int,
                              test_samples: int):
    sim, sim_predicted = simulate(prep, samples)
    magic, model_id, done, trained = checkpoint(folder, kind)
    assert (magic, model_id) == (b"TTE1", prep.compiled.model_id)
    assert done == samples                                   # no sample lost or counted twice
    assert trained == sim.trained_bytes()                    # ... or trained twice
    seen = result["predicted_during_training"] >= 0
    assert seen.any()
    np.testing.assert_array_equal(result["predicted_during_training"][seen], sim_predicted[seen])
    accuracy = sim.accuracy(prep.x_test[:test_samples], prep.y_test[:test_samples])
    assert result["accuracy_after"] == accuracy


@pytest.fixture
def waits(monkeypatch) -> list[str]:
    """The timeouts the host sat out, as they happen: each LinkTimeout of a link's recv (no frame
    in its time). A host that sees a pulled cable, a reset board or a firmware's refusal or crash
    in what comes over the link (the port failing, the REPL's prompt, an error frame, a
    traceback) sits out none."""
    seen = []
    real_recv = DeviceLink.recv

    def recv(self, timeout_s=None):
        try:
            return real_recv(self, timeout_s)
        except LinkTimeout as exc:
            seen.append(str(exc))
            raise

    monkeypatch.setattr(DeviceLink, "recv", recv)
    return seen


def finish_without_waiting(action, twin, waits):
    """``action()``'s result (or its exception), run in a thread. At the first timeout the host
    sits out (``waits``, the fixture; the device's timeouts are its defaults, tens of seconds: no
    twin is that slow to answer), the twin is stopped, which ends the action, and the test fails:
    a host that recovers only through timeouts fails at its first, whatever the machine's speed."""
    outcome = {}

    def work():
        try:
            outcome["value"] = action()
        except BaseException as exc:          # handed to the test's thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="device run", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
        if worker.is_alive() and waits:
            twin.stop()
            worker.join(30)
            break
    if waits:
        pytest.fail(f"the host sat out a timeout: {waits[0]}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class Counter:
    """The `advance` callback of run_on_device: the samples done as the host saw them (each
    change of the count; run_on_device starts with an advance(0))."""

    def __init__(self, hook=None):
        self.done, self.history, self.hook = 0, [], hook

    def __call__(self, n):
        if n == 0:
            return
        self.done += n
        self.history.append(self.done)
        if self.hook:
            self.hook(self.done)


# --------------------------------------------------------------------------- end to end

def test_sparse_training_on_the_twin_end_to_end(end_to_end, prep, kind):
    r, flash_dir = end_to_end
    assert (r["board"], r["algo"], r["model"], r["samples"], r["test_samples"]) == \
        (SIM_BOARD, "sparse", MODEL, 20, 20)
    assert r["scheme"] == prep.compiled.scheme.to_json() and r["model_id"] == prep.compiled.model_id
    assert (r["runtime"], r["platform"], r["twin"]) == ("micropython", PLATFORM[kind], kind)
    if kind == "qemu":                    # the board's own CPU, code compiled for it, the C kernels
        assert r["machine"].endswith("with Cortex-M7") and r["modules"] == "mpy armv7emsp" and r["code"] == "c"
        bt = r["board_time"]              # counted: QEMU icount, at the board's clock and CPI
        assert (bt["clock_hz"], bt["counted"]) == (216_000_000, "instructions") and bt["cycles_per_instruction"] > 0
        for step, n in (("train", 20), ("infer", 2 * 20)):
            assert bt[step]["samples"] == n and bt[step]["instructions_per_sample"] > 0
            assert bt[step]["seconds_per_sample"] == pytest.approx(
                bt[step]["instructions_per_sample"] * bt["cycles_per_instruction"] / 216e6, rel=1e-3)
        assert bt["train"]["instructions_per_sample"] > bt["infer"]["instructions_per_sample"]
    else:                                 # x86 code: no board's time to give
        assert (r["code"], r["board_time"]) == ("viper", None)
    assert r["heap_bytes"] == BUDGET
    assert r["planned_peak_bytes"] == prep.compiled.arena_bytes > 0
    # The firmware's measured peak holds the arena plus the interpreter and the firmware itself.
    assert BUDGET > r["peak_heap_bytes"] > r["planned_peak_bytes"]
    assert r["predicted_heap_bytes"] > r["planned_peak_bytes"]
    for key in ("accuracy_before", "accuracy_after", "accuracy"):
        assert 0.0 <= r[key] <= 1.0, key
    assert r["accuracy"] == r["accuracy_after"]
    # Device and host simulator are bit-exact: same predictions while training, same accuracy.
    assert r["host_sim_agreement"] == 1.0
    assert r["accuracy_before"] == r["host_sim_accuracy_before"]
    assert r["accuracy_after"] == r["host_sim_accuracy_after"]
    assert (r["resumed_from"], r["reconnects"], r["restarts"]) == (0, 0, 0)
    # The twin's flash keeps the device's checkpoint: 20 samples, the simulator's tensors.
    magic, model_id, done, trained = checkpoint(flash_dir, kind)
    assert (magic, model_id, done) == (b"TTE1", prep.compiled.model_id, 20)
    assert trained == simulate(prep, 20)[0].trained_bytes()
    # A curve point a sample: the device's loss (from the p(label) code it answers each sample
    # with: the simulator's, bit for bit), its training accuracy, and the test accuracy of the
    # simulator's probe (here the 20 test samples: the last point is the device's final figure).
    curve = r["curve"]
    assert [p["samples"] for p in curve] == list(range(1, 21))
    for point in curve:
        assert point["loss"] > 0 and point["train_accuracy"] in (0, 1) and 0 <= point["test_accuracy"] <= 1
    sim = Simulator(prep.compiled)
    losses = []
    for i in sample_order(len(prep.y_train), SEED, 0, 20):
        sim.train_step(prep.x_train[i], int(prep.y_train[i]))
        losses.append(device_loss(sim._io(abi.IO_P_LABEL)))
    assert [p["loss"] for p in curve] == losses
    assert curve[-1]["test_accuracy"] == r["accuracy_after"] and r["curve_probe"]["test_samples"] == 20


def test_accumulated_gradients_train_the_same_on_the_twin_and_the_host(run_cli, flashed, kind, tmp_path):
    # --batch-size 3: the gradients of 3 samples are summed on the device, then applied at once.
    # On a board flashed before (--flash-dir of a used twin): only the new program is sent.
    flash_dir = copy_of(flashed, tmp_path)
    run = run_cli("train", "--algo", "sparse", "--model", MODEL, "--scheme", "last-2", "--board", SIM_BOARD,
                  "--samples", 12, "--test-samples", 20, "--batch-size", 3, "--flash-dir", flash_dir,
                  "--twin", kind, "--json", timeout=180)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert r["batch_size"] == 3 and r["host_sim_agreement"] == 1.0
    assert r["accuracy_after"] == r["host_sim_accuracy_after"]        # the probes changed nothing
    assert len(r["curve"]) == 12 and all(p["loss"] > 0 and "test_accuracy" in p for p in r["curve"])
    accumulating = Prepared(MODEL, TASK, "last-2", LR, SEED, accumulate=3, lr_scale=LR_SCALE)
    assert r["model_id"] == accumulating.compiled.model_id
    _, _, done, trained = checkpoint(flash_dir, kind)
    assert done == 12 and trained == simulate(accumulating, 12)[0].trained_bytes()


# --------------------------------------------------------------------------- link trouble

def test_training_survives_pulled_cables_without_losing_or_repeating_a_sample(prep, flashed, kind, tmp_path,
                                                                               monkeypatch, waits):
    samples = 20
    folder = copy_of(flashed, tmp_path)
    links, lose_reply = set(), {"armed": False, "fired": 0}
    real_recv = DeviceLink.recv

    with McuTwin(folder, twin=kind) as twin:
        def recv(self, timeout_s=None):
            links.add(self)
            if lose_reply["armed"]:
                # The request is out: the device trains the sample and answers into a pulled
                # cable. The host's resend (same seq) must be answered, not trained again.
                lose_reply["armed"] = False
                time.sleep(0.1)
                twin.drop_link(0.3)
                lose_reply["fired"] += 1
            return real_recv(self, timeout_s)

        def hook(done):
            if done == 5:
                twin.drop_link(0.3)                   # between two requests
            if done == 12 and not lose_reply["fired"]:
                lose_reply["armed"] = True            # during the next request

        monkeypatch.setattr(DeviceLink, "recv", recv)
        advance = Counter(hook)
        result = finish_without_waiting(
            lambda: run_on_device(prep, twin.port, samples, 10, SEED, advance, checkpoint_every=4),
            twin, waits)

    assert lose_reply["fired"] == 1
    assert sum(link.resends for link in links) >= 1          # the lost reply was asked for again
    assert advance.history == list(range(1, samples + 1))    # one sample at a time, none twice
    assert result["restarts"] == 0                          # the firmware kept running
    assert_matches_simulation(prep, folder, kind, result, samples, 10)


def test_inputs_larger_than_a_frame_go_in_parts(prep, flashed, kind, tmp_path, monkeypatch, waits):
    # A 128x128 RGB image (49,152 B) is 24 of the link's frames; here parts of 40 bytes make
    # the small model's inputs (144 B) several parts each, with a cable pulled between two parts.
    monkeypatch.setattr(TrainingDevice, "input_part_bytes", 40)
    assert prep.x_train[0].size > 2 * 40
    samples, parts = 8, []
    real_request = DeviceLink.request
    folder = copy_of(flashed, tmp_path)

    with McuTwin(folder, twin=kind) as twin:
        def request(self, ftype, payload=b"", *args, **kwargs):
            if ftype == 11:                             # MSG_INPUT
                parts.append(len(payload) - 4)
                if len(parts) == 7:
                    twin.drop_link(0.3)
            return real_request(self, ftype, payload, *args, **kwargs)

        monkeypatch.setattr(DeviceLink, "request", request)
        result = finish_without_waiting(
            lambda: run_on_device(prep, twin.port, samples, 4, SEED, Counter()), twin, waits)
    assert parts and max(parts) <= 40
    assert_matches_simulation(prep, folder, kind, result, samples, 4)


def test_patches_streaming_and_masks_train_on_the_twin_as_in_the_host_simulation(prep, flashed, kind, tmp_path,
                                                                                 monkeypatch, waits):
    # The passes that fit the paper's 128x128 networks in 256 KB, all at once on the small model:
    # its first layers one patch at a time (window, conv_fwd with a patch's pads), every table
    # and frozen full conv streamed from flash a few channels at a time (load, load_rows), the ReLU
    # masks (act_mask, mask_bwd); the firmware runs them bit for bit as the host simulates them.
    # Flashed over another program: only the new program's files are sent, the runtime the board
    # holds is kept, and a stale source that would shadow a kept .mpy is removed all the same.
    import copy

    from insitu.sparse import compiler, scheme as S

    monkeypatch.setattr(compiler, "STREAM_CHUNK_BYTES", 64)      # a layer in parts: 5 load_rows
    monkeypatch.setattr(compiler, "FLASH_TABLE_MIN_BYTES", 4)
    run = copy.copy(prep)
    graph = prep.graph
    run.compiled = compiler.compile_training(
        graph, S.Scheme(4, {graph.convs[-1].name: 1.0, graph.convs[-2].name: 0.5}), prep.grad_scales,
        compiler.Options(lr=LR, lr_scale={graph.convs[-1].name: 5.0}, patches=2, stream=True, masks=True))
    stats = run.compiled.stats
    assert stats["patches"] is not None
    for kernel in ("window", "load_rows", "act_mask", "mask_bwd"):
        assert stats["kernels"].get(kernel), kernel
    assert stats["kernels"]["load_rows"] > 2                  # a layer's weights in several parts
    samples = 6
    folder = copy_of(flashed, tmp_path)
    files = FlashFiles(folder, kind)
    files.write("link.py", b"raise ImportError('a stale link.py')\n")
    flashes, real_flash = [], mcu_flash.flash

    def flash(*args, **kwargs):
        flashes.append(real_flash(*args, **kwargs))
        return flashes[-1]

    monkeypatch.setattr(mcu_flash, "flash", flash)
    with McuTwin(folder, twin=kind) as twin:
        result = finish_without_waiting(
            lambda: run_on_device(run, twin.port, samples, 4, SEED, Counter()), twin, waits)
    (flashed_files,) = [f["files"] for f in flashes]
    assert sorted(f["name"] for f in flashed_files if f["sent"]) == ["tte_model.bin", "tte_model.mpy"]
    assert {f["name"] for f in flashed_files if not f["sent"]} >= {"fw_train.mpy", "link.mpy", "tte_kernels.mpy"}
    assert not files.exists("link.py") and files.exists("link.mpy")
    assert_matches_simulation(run, folder, kind, result, samples, 4)


def test_a_reset_board_resumes_from_its_checkpoint(prep, flashed, kind, tmp_path, monkeypatch, waits):
    samples, every, reset_at = 20, 4, 10
    folder = copy_of(flashed, tmp_path)
    # A restart needs no timeout: the host sees the board at its REPL prompt.
    reset = {"restarts_flashed": None, "at": None}      # the twin's restarts once flashed
    real_flash = mcu_flash.flash

    with McuTwin(folder, twin=kind) as twin:
        def flash(*args, **kwargs):                     # mpremote soft-resets the board too
            out = real_flash(*args, **kwargs)
            reset["restarts_flashed"] = twin.restarts
            return out

        def hook(done):
            if done == reset_at and reset["at"] is None:
                twin.reset()                            # power cycle: RAM lost, flash kept
                reset["at"] = done

        monkeypatch.setattr(mcu_flash, "flash", flash)
        advance = Counter(hook)
        result = finish_without_waiting(
            lambda: run_on_device(prep, twin.port, samples, 10, SEED, advance, checkpoint_every=every),
            twin, waits)

    assert reset["at"] is not None and twin.restarts > reset["restarts_flashed"]
    assert result["restarts"] >= 1                      # the host restarted the firmware
    # Reset after sample 10: the checkpoint has 8 (every 4); the host goes on from there.
    after_reset = advance.history[advance.history.index(reset_at) + 1:]
    assert min(after_reset) == reset_at // every * every
    assert advance.done == samples and max(advance.history) == samples
    assert_matches_simulation(prep, folder, kind, result, samples, 10)


# --------------------------------------------------------------------------- a bad weight blob

def _flip_a_byte(files: FlashFiles) -> None:
    data = bytearray(files.read(BLOB))
    data[len(data) // 2] ^= 0xFF
    files.write(BLOB, bytes(data))


def _truncate(files: FlashFiles) -> None:
    files.write(BLOB, files.read(BLOB)[:-100])


@pytest.mark.parametrize("damage, says", [
    (_flip_a_byte, "is corrupt"),
    (_truncate, "bytes, the model expects"),
    (lambda files: files.remove(BLOB), "is missing"),
], ids=["corrupt", "truncated", "missing"])
def test_a_damaged_weight_blob_is_refused_with_the_reason(flashed, kind, tmp_path, damage, says, waits):
    folder = copy_of(flashed, tmp_path)
    damage(FlashFiles(folder, kind))
    with McuTwin(folder, twin=kind) as twin:
        dev = TrainingDevice(twin.port)
        try:
            with pytest.raises(DeviceError) as err:
                finish_without_waiting(lambda: dev.with_recovery(dev.start), twin, waits)
            # It keeps answering every request with the reason, and trains nothing.
            with pytest.raises(DeviceError, match=BLOB):
                dev.stats()
        finally:
            dev.close()
    text = str(err.value)
    assert BLOB in text and "reflash" in text and says in text, text
    assert not FlashFiles(folder, kind).exists("tte_ckpt.bin")


# Run on the device after flashing: one byte of the blob in its flash flipped.
_FLIP_ON_DEVICE = ("f = open('tte_model.bin', 'r+b'); n = f.seek(0, 2) // 2; f.seek(n); b = f.read(1); "
                   "f.seek(n); f.write(bytes([b[0] ^ 255])); f.close()")


def test_the_host_run_stops_on_a_corrupt_blob(prep, flashed, kind, tmp_path, monkeypatch):
    folder = copy_of(flashed, tmp_path)
    real_flash = mcu_flash.flash

    def flash_then_corrupt(port, *args, **kwargs):
        out = real_flash(port, *args, **kwargs)
        mcu_flash._mpremote(port, ["exec", _FLIP_ON_DEVICE], 30)
        return out

    monkeypatch.setattr(mcu_flash, "flash", flash_then_corrupt)
    # An immediate refusal: the device's first answer, not a wait sat out (no request sent again
    # for want of a reply, no recovery of a link or a firmware taken for lost).
    links, recoveries = set(), []
    real_recv, real_recover = DeviceLink.recv, TrainingDevice._recover

    def recv(self, timeout_s=None):
        links.add(self)
        return real_recv(self, timeout_s)

    def recover(self, *args, **kwargs):
        recoveries.append(args)
        return real_recover(self, *args, **kwargs)

    monkeypatch.setattr(DeviceLink, "recv", recv)
    monkeypatch.setattr(TrainingDevice, "_recover", recover)
    advance = Counter()
    with McuTwin(folder, twin=kind) as twin:
        with pytest.raises(DeviceError, match=r"tte_model\.bin is corrupt.*reflash"):
            run_on_device(prep, twin.port, 4, 4, SEED, advance)
    assert links and [link.resends for link in links] == [0] * len(links) and recoveries == []
    assert advance.history == []


# --------------------------------------------------------------------------- a crashing firmware

def _crash_at_import(prep) -> bytes:
    return b"raise RuntimeError('boom at import')\n"


def _crash_in_train(prep) -> bytes:
    return prep.compiled.module.encode() + b"\n\ndef train(A, P, f):\n    raise ValueError('boom in train')\n"


@pytest.mark.parametrize("module, says", [
    (_crash_at_import, "RuntimeError: boom at import"),
    (_crash_in_train, "ValueError: boom in train"),
], ids=["at-import", "in-train"])
def test_a_crashing_firmware_is_reported_with_its_traceback_promptly(prep, flashed, kind, tmp_path, module,
                                                                      says, waits):
    folder = copy_of(flashed, tmp_path)
    files = FlashFiles(folder, kind)
    files.remove("tte_model.mpy")
    files.write("tte_model.py", module(prep))

    def start_and_train():
        dev.with_recovery(dev.start)
        dev.with_recovery(lambda: dev.train(0, int(prep.y_train[0]), prep.x_train[0]))

    with McuTwin(folder, twin=kind) as twin:
        dev = TrainingDevice(twin.port)
        try:
            with pytest.raises(FirmwareCrashed) as err:
                # Before any request times out: the traceback and the prompt say it all.
                finish_without_waiting(start_and_train, twin, waits)
        finally:
            dev.close()
    assert not isinstance(err.value, LinkError)            # not retried as a link failure
    text = str(err.value)
    assert "Traceback" in text and says in text and "tte_model" in text, text


# --------------------------------------------------------------------------- refused before flashing

def test_a_scheme_that_does_not_fit_is_refused_before_flashing(run_cli, prep, tmp_path):
    # 68 K: more than the firmware's runtime alone (that refusal comes before any work, below),
    # less than this program's prediction: refused once compiled, before a twin starts.
    flash_dir = tmp_path / "flash"
    run = run_cli(*SPARSE, "--board", SIM_BOARD, "--samples", 5, "--heap", 69632,
                  "--flash-dir", flash_dir, "--json", timeout=120)
    assert run.returncode == 2, run.stderr
    assert "does not fit" in run.stderr
    assert f"planned peak {prep.compiled.arena_bytes:,} B" in run.stderr, run.stderr
    assert "69,632 B" in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == "" and not flash_dir.exists()        # no twin started, nothing flashed


#: Refused before any slow work: no pretraining (an empty cache would start one), no data, no
#: firmware build, no twin. Each case runs on the default mbv2-28 with an empty INSITU_CACHE.
EARLY = {
    "missing-port": (("--board", REAL_BOARD, "--port", "/dev/nonexistent"),
                     ["--port /dev/nonexistent", "no such serial port", "/dev/ttyACM", "insitu mcu emulate"]),
    "unopenable-port": (("--board", REAL_BOARD, "--port", "/dev/null"),
                        ["--port /dev/null", "cannot open the serial port", "insitu mcu emulate"]),
    "no-port": (("--board", REAL_BOARD), ["--port"]),
    "twin-port-missing": (("--board", SIM_BOARD, "--port", "/dev/nonexistent"),
                          ["--port /dev/nonexistent", "no such serial port"]),
    "bogus-scheme": (("--board", SIM_BOARD, "--scheme", "bogus"), ["--scheme bogus", "unknown scheme"]),
    "bogus-scheme-real-board": (("--board", REAL_BOARD, "--port", "/dev/nonexistent", "--scheme", "bias-999"),
                                ["--scheme bias-999"]),
    "scheme-layer": (("--board", SIM_BOARD, "--scheme", '{"bias_k": 1, "weights": {"nope": 1}}'),
                     ["--scheme", "no layer 'nope'", "b7.project"]),
    "scheme-too-deep": (("--board", SIM_BOARD, "--scheme", "bias-999"), ["--scheme bias-999", "bias_k"]),
    "heap-below-runtime": (("--board", SIM_BOARD, "--heap", "16K"), ["16,384 B", "does not fit any scheme"]),
    "heap-over-twin": (("--board", SIM_BOARD, "--heap", "64M"), ["at most", "--twin unix"]),
    "heap-on-real-board": (("--board", REAL_BOARD, "--port", "/dev/nonexistent", "--heap", "64K"), ["--heap"]),
    "flash-dir-unwritable": (("--board", SIM_BOARD, "--flash-dir", "/proc/insitu-flash"),
                             ["--flash-dir /proc/insitu-flash", "cannot be written"]),
    "unknown-task": (("--board", SIM_BOARD, "--dataset", "nope"), ["--dataset: unknown task 'nope'"]),
}


@pytest.mark.parametrize("case", list(EARLY))
def test_bad_options_are_refused_before_pretraining(run_cli, insitu_cache, case):
    args, says = EARLY[case]
    cache = insitu_cache
    run = run_cli("train", "--algo", "sparse", "--samples", 2, *args, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("error:") and "Traceback" not in run.stderr, run.stderr
    for text in says:
        assert text in run.stderr, run.stderr
    assert "pretrain" not in run.stderr and "building" not in run.stderr, run.stderr
    assert not (cache / "mcu").exists() and not (cache / "mcu-twin").exists()   # nothing trained, built
    assert list(cache.iterdir()) == []                # nor anything else: no data, no firmware, no twin


@pytest.mark.parametrize("args, code, says", [
    ((), 2, ["--port"]),
    (("--port", "/dev/does-not-exist", "--heap", 65536), 2, ["--heap"]),
    (("--port", "/dev/does-not-exist", "--twin", "unix"), 2, ["--twin"]),
], ids=["no-port", "heap-on-a-real-board", "twin-on-a-real-board"])
def test_a_real_board_needs_a_port_that_exists(run_cli, args, code, says):
    run = run_cli(*SPARSE, "--board", REAL_BOARD, "--samples", 2, "--test-samples", 2, *args, timeout=120)
    assert run.returncode == code, run.stderr
    assert run.stderr.startswith("error:") and "Traceback" not in run.stderr, run.stderr
    for text in says:
        assert text in run.stderr, run.stderr


def test_twin_is_refused_for_a_board_that_is_no_microcontroller(run_cli):
    run = run_cli("train", "--board", "ultra96v2-sim", "--twin", "unix", "--samples", 2, timeout=60)
    # refused as an option of another algorithm (sgd, the default) or of another kind of board
    assert run.returncode == 2 and "--twin" in run.stderr, run.stderr
    assert "ultra96v2-sim" in run.stderr or "--algo sgd" in run.stderr, run.stderr


# --------------------------------------------------------------------------- insitu mcu minheap

@pytest.fixture(scope="module")
def minheap(kind):
    from conftest import insitu_cli

    run = insitu_cli("mcu", "minheap", "--model", MODEL, "--scheme", SCHEME, "--twin", kind, "--json",
                     timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_minheap_bisects_the_twins_heap(minheap, prep, kind):
    r = minheap
    assert (r["board"], r["twin"]) == (SIM_BOARD, kind)
    assert r["planned_peak_bytes"] == prep.compiled.arena_bytes
    found, probes = r["min_heap_bytes"], r["probes"]
    assert r["planned_peak_bytes"] < found < BUDGET
    assert probes[0]["heap_bytes"] == BUDGET and probes[0]["ok"]      # the bracket's top trains
    ok = [p["heap_bytes"] for p in probes if p["ok"]]
    failed = [p["heap_bytes"] for p in probes if not p["ok"]]
    assert found in ok and min(ok) == found and failed and max(failed) < found
    assert found - max(failed) <= 512                                  # bisected to its granule
    for p in probes:
        if p["ok"]:
            assert r["planned_peak_bytes"] < p["peak"] <= p["heap_bytes"], p
        else:
            assert p["peak"] is None and p["why"], p
    assert r["error"] == pytest.approx((found - r["predicted_heap_bytes"]) / r["predicted_heap_bytes"])
    if kind == "qemu":
        # The heap model (insitu.mcu.board_runs) is the Cortex-M7 twin's: firmware that grows (new
        # kernels compiled into the heap at import) must come with a refit
        # (tests/benchmarks/test_bench_mcu_heap.py), or `insitu train` admits schemes that do not fit.
        assert abs(r["error"]) <= HEAP_MARGIN, (found, r["predicted_heap_bytes"])


def test_the_heap_minheap_finds_is_enough_to_train(minheap, prep, flashed, kind, tmp_path, waits):
    # With the margin insitu train asks for: at the exact minimum, a heap fragmented a little
    # differently (other imports, another start) may refuse the arena, which the firmware reports.
    heap = int(minheap["min_heap_bytes"] * (1 + HEAP_MARGIN))
    with McuTwin(copy_of(flashed, tmp_path), heap_bytes=heap, twin=kind) as twin:   # `insitu train --heap HEAP`
        result = finish_without_waiting(lambda: run_on_device(prep, twin.port, 4, 4, SEED, Counter()),
                                        twin, waits)
    assert result["accuracy_after"] is not None
    assert minheap["planned_peak_bytes"] < result["peak_heap_bytes"] <= heap


@pytest.mark.parametrize("args, says", [(("--samples", 0), "--samples"),
                                        (("--board", REAL_BOARD), "not a simulated")],
                         ids=["no-samples", "real-board"])
def test_minheap_refuses_bad_input(run_cli, args, says):
    run = run_cli("mcu", "minheap", "--model", MODEL, "--scheme", SCHEME, *args, timeout=60)
    assert run.returncode == 2 and says in run.stderr, run.stderr
