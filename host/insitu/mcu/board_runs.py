"""`insitu train --algo sparse`: sparse-update training on a microcontroller or its twin.

The path is the one a user takes with a board: the pre-trained int8 model gets a new classifier
for the task, the scheme is compiled (backward graph, pruning, reordering, memory plan), checked
against the board's heap, flashed with mpremote, started from the REPL, and fed samples over the
serial link; accuracy is measured by the device before and after. The same compiled program runs
in the host simulator on the same samples, which must agree with the device.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from insitu.boards import Board
from insitu.errors import InsituError, UsageError
from insitu.harness import RunPlan, run_training, sample_order, say
from insitu.mcu.board_time import board_time
from insitu.measure.phases import phase
from insitu.sparse import DEFAULT_LR, HEAD_LR_FACTOR, abi
from insitu.sparse.calibrate import calibrate_gradients
from insitu.sparse.compiler import Compiled, Options, compile_training
from insitu.sparse.graph import input_codes
from insitu.sparse.scheme import preset
from insitu.sparse.simulate import Simulator

DEFAULT_SCHEME = "bias-6"
CALIBRATION_SAMPLES = 64
#: Heap the firmware needs besides the arena and the program table (counted exactly, 4 B a word):
#: the interpreter's state, the imported firmware modules (on a Cortex-M7 the C kernels' native
#: module, code and BSS, or the viper kernels' machine code, lives in the heap too), the link's
#: buffers and what fragmentation leaves unusable for one arena-sized block, plus the generated
#: module's bytecode, which grows with its kernel calls (its .mpy is ~14 B a call). Fitted with
#: `insitu mcu minheap --twin qemu` (measured minimum - arena - program table against calls) on
#: the 32-bit Cortex-M7 twin (MicroPython 1.28 in QEMU, .mpy for armv7emsp, the C kernels) over
#: eight programs of 64 to 223 calls, mbv2-tiny and mbv2-28: `.venv/bin/python -m pytest -m
#: benchmark -s tests/benchmarks/test_bench_mcu_heap.py` (docs/results/mcu/heap-model-cortex-m7.txt).
#: The fit is 63,629 B + 26.2 B a call; the slope stays 24 B (the paper's 1,258-1,336-call programs
#: show less a call, about 13 B, their .mpy's) and the constant is the least-squares one for it,
#: rounded up: fit and held-out errors within -0.3 % .. +0.8 %, long programs overestimated (the
#: safe side). The C kernels take about 16 KB more heap than the viper kernels did (47,600 B then).
#: On the unix-port twin (64-bit, viper, no machine code in its heap) it is an upper bound.
RUNTIME_HEAP_BYTES = 64_000
HEAP_BYTES_PER_CALL = 24
#: The fit's predictions were within a few percent of the measured minimum, on its programs and on
#: held-out ones (docs/mcu.md): a heap must exceed the prediction by this much before training
#: starts (at the very minimum a heap fragmented a little differently refuses the arena).
HEAP_MARGIN = 0.05
#: Test samples of the curve's probe (the first of the device's test set), run by the host
#: simulation at every point of the curve: the board spends no time on it.
PROBE_SAMPLES = 100


class Prepared:
    """Everything the host knows before touching a board: model, data, compiled program."""

    def __init__(self, model: str, task: str, scheme: str, lr: float, seed: int, reorder: bool = True,
                 accumulate: int = 1, lr_scale: dict[str, float] | None = None, patches: int | None = None):
        from insitu.sparse.model_source import calibration_images, model_graph, model_input_shape
        from insitu.sparse.quantize import new_head
        from insitu.sparse.tasks import load_task

        check_scheme(model, scheme)              # in milliseconds, before the data and the pretraining
        channels, height, width = model_input_shape(model)
        if height != width:
            raise UsageError(f"model {model} takes {height}x{width} images; the MCU tasks are square")
        x_train, self.y_train, x_test, self.y_test, classes = load_task(task, height, channels)
        self.x_train, self.x_test = input_codes(x_train), input_codes(x_test)
        # A new head for the task, built-in or imported alike (an ONNX model without insitu's
        # scales is calibrated on the task's training images).
        self.model_graph = model_graph(model, calibration_images(x_train))
        self.graph = new_head(self.model_graph, classes, seed)
        self.scheme = preset(self.graph, scheme)
        calib = np.random.default_rng(seed).permutation(len(self.y_train))[:CALIBRATION_SAMPLES]
        self.grad_scales = calibrate_gradients(self.graph, self.x_train[calib], self.y_train[calib], seed)
        options = Options(lr=lr, reorder=reorder and accumulate == 1, accumulate=accumulate,
                          lr_scale=dict(lr_scale or {}), patches=patches)
        self.compiled = compile_training(self.graph, self.scheme, self.grad_scales, options)


def device_inputs(compiled: Compiled, x_codes: np.ndarray) -> np.ndarray:
    """Samples as the device takes them: each one's input stream (its windows, in order; the
    whole image where the program has no input windows)."""
    return np.stack([compiled.input_stream(x) for x in x_codes]) if len(x_codes) else np.asarray(x_codes)


def runtime_heap_bytes(compiled: Compiled | int) -> int:
    """Heap the firmware needs besides the arena for this program (or a program of that many
    kernel calls)."""
    if isinstance(compiled, int):
        return RUNTIME_HEAP_BYTES + HEAP_BYTES_PER_CALL * compiled
    calls = sum(len(c) for c in compiled.calls.values())
    # The program table is read into a buffer of its own (not the arena): 4 bytes a word.
    return RUNTIME_HEAP_BYTES + HEAP_BYTES_PER_CALL * calls + 4 * len(compiled.program)


def predicted_heap_bytes(compiled: Compiled) -> int:
    return compiled.arena_bytes + runtime_heap_bytes(compiled)


def fits_heap(need: int, heap_bytes: int) -> bool:
    """Whether ``need`` bytes, with the :data:`HEAP_MARGIN` kept, fit a heap of ``heap_bytes``."""
    return need * (1 + HEAP_MARGIN) <= heap_bytes


def check_fits(compiled: Compiled, heap_bytes: int) -> None:
    runtime = runtime_heap_bytes(compiled)
    need = compiled.arena_bytes + runtime
    if not fits_heap(need, heap_bytes):
        raise UsageError(f"the scheme ({compiled.scheme.describe()}) does not fit: planned peak "
                         f"{compiled.arena_bytes:,} B of arena + {runtime:,} B of runtime = "
                         f"{need:,} B, plus a {HEAP_MARGIN:.0%} margin > the heap of {heap_bytes:,} B; "
                         "choose a sparser --scheme (fewer layers, lower ratios) or a larger --heap (twins only)")


def firmware_files(compiled: Compiled) -> dict[str, bytes | Path]:
    """The firmware runtime, the generated training module and the weight blob."""
    from insitu.mcu.flash import firmware_files as runtime

    files: dict[str, bytes | Path] = dict(runtime())
    files["tte_model.py"] = compiled.module.encode()
    files["tte_model.bin"] = compiled.blob
    return files


@contextlib.contextmanager
def board_port(board: Board, port: str | None, heap_bytes: int, flash_dir: str | None,
               twin: str | None = None):
    """The serial port of the board: the given one, or a twin (``twin``: its kind, default the
    Cortex-M7 twin) started here for a -sim board."""
    if port or not board.is_twin:
        if not port:
            raise UsageError(f"{board.name}: give the board's serial port with --port (e.g. /dev/ttyACM0)")
        yield port, None
        return
    from insitu.mcu.twin import TWINS, McuTwin

    with contextlib.ExitStack() as stack:
        if flash_dir is None:
            flash_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="insitu-flash-"))
        Path(flash_dir).mkdir(parents=True, exist_ok=True)
        started = stack.enter_context(McuTwin(flash_dir, heap_bytes=heap_bytes, board=board.name,
                                              twin=twin or TWINS[0]))
        assert started.port is not None             # set by start() (the twin's __enter__)
        yield started.port, started


def device_loss(p_label: int) -> float:
    """A training sample's cross-entropy from the p(label) code the device answers it with (its
    integer softmax's ``q = round(p * 2**LOSS_GRAD_FRAC)``, computed for the gradient anyway):
    ``-ln(q / 2**LOSS_GRAD_FRAC)``; a code of 0 (p below half a code) counts as half a code."""
    return -math.log(max(p_label, 0.5) / (1 << abi.LOSS_GRAD_FRAC))


class DeviceLearner:
    """The device as the run harness's learner: it trains on the samples it is sent and keeps its
    own state (a checkpoint on its flash every ``checkpoint_every`` samples, written by the
    firmware), so the harness goes on from the position the device reports. A step's loss is the
    mean of :func:`device_loss` over its samples, from the device's answers.

    A device that was reset in the middle of a step restarts from its checkpoint and says so in
    its answer (its count of samples done): the step then trains again from there, and the
    progress (``advance``) goes back and forth with it.
    """

    def __init__(self, dev, prep: Prepared, order: np.ndarray, advance=lambda n: None,
                 step_seconds=lambda k: None):
        """``step_seconds(k)``: the board's seconds of a step the device counted as ``k`` thousand
        (instructions or cycles; None where nothing counts), shown live in the progress."""
        self.dev, self.prep, self.order, self.advance = dev, prep, order, advance
        self.step_seconds = step_seconds
        self.predicted = np.full(len(order), -1)      # the device's predictions while training
        self.correct = 0                              # of them right, this session (the curve)

    def train(self, start: int, count: int) -> float | None:
        n, shown = start, start                       # the sample to send; what progress shows
        losses: list[float] = []
        while n < start + count:
            i = self.order[n]
            x = self.prep.compiled.input_stream(self.prep.x_train[i])
            done, self.predicted[n], p_label = self.dev.with_recovery(
                lambda n=n, x=x, i=i: self.dev.train(n, int(self.prep.y_train[i]), x))
            if done != n + 1:                         # reset: the device went back to `done`
                if done < shown:
                    self.advance(done - shown)
                    shown = done
                n = done
                continue
            if n < start:                             # catching up to where the step began
                self.advance(1)
                shown += 1
            else:
                self.correct += int(self.predicted[n] == self.prep.y_train[i])
                if self.predicted[n] >= 0:            # trained now, not acknowledged as done before
                    losses.append(device_loss(p_label))
                    seconds = self.step_seconds(self.dev.step_k) if self.dev.step_k else None
                    if seconds is not None and hasattr(self.advance, "note"):
                        self.advance.note(board_ms_per_sample=round(1000 * seconds, 1))
            n += 1
        return float(np.mean(losses)) if losses else None

    # Nothing to keep on the host: the harness resumes from the device's own position.
    def state(self) -> tuple[dict, dict]:
        return {}, {}

    def load_state(self, arrays: dict, meta: dict) -> None:
        pass


def run_on_device(prep: Prepared, port: str, samples: int, test_samples: int, seed: int, advance,
                  checkpoint_every: int = 1, board: Board | None = None) -> dict:
    """Flash, start, measure, train and measure again; returns the device's figures."""
    from insitu.mcu.device import TrainingDevice
    from insitu.mcu.flash import flash

    compiled = prep.compiled
    flashed = flash(port, firmware_files(compiled))
    dev = TrainingDevice(port)
    try:
        info = dev.with_recovery(dev.start)
        if info.get("model") != compiled.model_id:
            raise InsituError(f"the device runs model {info.get('model')}, not the one flashed "
                              f"({compiled.model_id}); reflash")
        dev.set_checkpoint_every(checkpoint_every)
        resumed_from = int(info["done"])
        x_test, y_test = device_inputs(compiled, prep.x_test[:test_samples]), prep.y_test[:test_samples]
        before = None
        if resumed_from == 0:
            with phase("test"):                 # markers for `--meter` (insitu.measure.phases)
                before = float(np.mean(dev.predict_all(x_test) == y_test))
        learner = DeviceLearner(dev, prep, sample_order(len(prep.y_train), seed, 0, samples), advance,
                                step_seconds=step_seconds(info.get("count"), board))
        # One harness step per sample: a Ctrl-C stops after the sample the device is training on.
        plan = RunPlan("insitu train --algo sparse", {}, samples, 1, kept_by="the device's flash",
                       resume_at=resumed_from)
        outcome = run_training(plan, learner, advance=advance, say=say, evaluate=lambda: {
            "accuracy": float(np.mean(dev.predict_all(x_test) == y_test))})
        stats = dev.stats()
        runtime = info.get("impl", "micropython")
        dev.bye()
    finally:
        dev.close()
    return {"runtime": runtime, "platform": info.get("platform"), "machine": flashed["machine"],
            # the kernels the device ran: C (tte_native.mpy) or viper; the modules as .mpy or source
            "code": info.get("code", "viper"), "modules": "mpy " + flashed["arch"] if flashed["arch"] else "source",
            "board_time": board_time(stats, board) if board is not None else None,
            "accuracy_before": before, "curve": outcome.curve,
            "accuracy_after": outcome.evaluation["accuracy"], "peak_heap_bytes": stats.get("mem_peak"),
            "heap_live_bytes": stats.get("mem_alloc"),
            "heap_free_bytes": stats.get("mem_free"), "resumed_from": resumed_from,
            "reconnects": dev.reconnects, "restarts": dev.restarts, "train_seconds": outcome.seconds,
            "predicted_during_training": learner.predicted}


def step_seconds(counted, board: Board | None):
    """k (a step's count in thousands, as the device acknowledges it) -> the board's seconds."""
    if board is None or counted not in ("instructions", "cycles"):
        return lambda k: None
    from insitu.mcu.board_time import cycles_per_instruction

    cpi = cycles_per_instruction(board) if counted == "instructions" else 1.0
    return lambda k: 1000 * k * cpi / board.cpu_hz


def sim_accuracy(sim: Simulator, x_codes: np.ndarray, labels: np.ndarray) -> float:
    """``sim``'s accuracy on these samples, on a copy of its arena: an inference overwrites
    activations (and, accumulating gradients, what is accumulated), so the copy leaves the
    training exactly where it was."""
    probe = copy.copy(sim)
    probe.A = sim.A.copy()
    return probe.accuracy(x_codes, labels)


def print_to_stderr(text: str) -> None:
    print(f"[insitu] {text}", file=sys.stderr, flush=True)


#: Where a real board's serial port usually is, for the error of a port that cannot be opened.
PORT_HINT = ("give the board's serial port (on Linux /dev/ttyACM0 or another of `ls /dev/ttyACM*`), or "
             "train on a simulated board: --board stm32f746-disco-sim, or a twin started by "
             "`insitu mcu emulate` (its port with --port)")


def check_port(port: str, board: Board) -> None:
    """A given serial port must be there: a real board's must open (and is closed again at once;
    opening a MicroPython board's USB serial port does not reset it), a running twin's (``insitu mcu
    emulate``) must exist. A :class:`UsageError` naming the port otherwise."""
    import os

    if os.sep in port and not os.path.exists(port):
        raise UsageError(f"--port {port}: no such serial port; {PORT_HINT}")
    if board.is_twin:
        return                                  # a twin's port: opening it here would disturb it
    from insitu.mcu.link import LinkError, open_serial

    try:
        open_serial(port).close()
    except LinkError as exc:
        reason = str(exc).split(";")[0].removeprefix(f"cannot open the serial port {port}: ")
        raise UsageError(f"--port {port}: cannot open the serial port ({reason}); {PORT_HINT}") from None


def check_flash_dir(flash_dir: str) -> None:
    """The folder a twin's flash goes to: a writable folder, or one that can be created there
    (tried with a scratch folder, removed at once: permission bits do not stop root)."""
    path = Path(flash_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--flash-dir {flash_dir}: exists and is not a folder")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        Path(tempfile.mkdtemp(prefix=".insitu-check-", dir=parent)).rmdir()
    except OSError as exc:
        raise UsageError(f"--flash-dir {flash_dir}: cannot be written ({parent}: {exc.strerror})") from None


def default_scheme(model, heap_bytes: int) -> str:
    """The paper's networks: the largest of the schemes released with the paper (``paper-49kb``
    ... ``paper-148kb``, searched by its authors) whose planned heap fits ``heap_bytes`` (the
    board's training budget) with the margin, else its smallest; the other models:
    :data:`DEFAULT_SCHEME`, or the biases of every layer of a model with fewer layers."""
    from insitu.sparse.model_source import model_untrained_graph
    from insitu.sparse.models import PAPER_SCHEMES

    if str(model) in PAPER_SCHEMES:
        return _largest_released_fitting(str(model), heap_bytes)
    depth = int(DEFAULT_SCHEME.split("-")[1])
    layers = len(model_untrained_graph(model).convs)
    return DEFAULT_SCHEME if layers >= depth else f"bias-{layers}"


def _largest_released_fitting(model: str, heap_bytes: int) -> str:
    """Planned on the untrained network with a 10-class head (shapes and sizes as trained: the
    plan does not depend on the values), largest budget first; each plan takes about a second."""
    from insitu.sparse.models import PAPER_SCHEMES
    from insitu.sparse.quantize import untrained_graph

    graph = untrained_graph(model, num_classes=10)
    scales = {t: 1 / 127 for t in graph.tensors}
    budgets = sorted(PAPER_SCHEMES[model], key=lambda b: int(b.removesuffix("kb")))
    for budget in reversed(budgets):
        compiled = compile_training(graph, preset(graph, f"paper-{budget}"), scales, Options(lr=DEFAULT_LR))
        if fits_heap(predicted_heap_bytes(compiled), heap_bytes):
            return f"paper-{budget}"
    return f"paper-{budgets[0]}"


def check_scheme(model: str, scheme: str | None) -> None:
    """Parse ``scheme`` against ``model``'s graph (its layer names and shapes, built untrained in
    milliseconds: no pretraining, no data); a :class:`UsageError` naming --scheme if wrong (or
    naming the model if it is unknown, or a file that is missing or not a usable ONNX model)."""
    from insitu.sparse.model_source import check_model, model_untrained_graph

    check_model(model)
    if scheme is None:                  # the default: the model's own (planning it may take seconds)
        return
    graph = model_untrained_graph(model)
    try:
        preset(graph, scheme).validate(graph)
    except UsageError as exc:
        raise UsageError(f"--scheme {scheme}: {str(exc).removeprefix('scheme: ')}") from None


def default_lr_scale(model) -> dict[str, float]:
    """The default per-layer factors of ``model``: its classifier (the last layer, whatever an
    ONNX model names it) at :data:`HEAD_LR_FACTOR`."""
    from insitu.sparse.model_source import model_untrained_graph

    return {model_untrained_graph(model).convs[-1].name: HEAD_LR_FACTOR}


def with_default_lr_scale(config):
    """``config`` (a TrainConfig) with :func:`default_lr_scale` where ``--lr-scale`` was not given
    (given, it replaces the default: ``--lr-scale classifier=1`` trains every layer at --lr)."""
    import dataclasses

    if config.lr_scale:
        return config
    items = tuple(f"{layer}={factor:g}" for layer, factor in default_lr_scale(config.model).items())
    return dataclasses.replace(config, lr_scale=items)


def parse_lr_scale(model: str, items, option: str = "--lr-scale") -> dict[str, float]:
    """``LAYER=FACTOR`` items (``option``, repeatable; or a ``{layer: factor}`` mapping) as the
    per-layer lr factors of :attr:`insitu.sparse.compiler.Options.lr_scale`, checked against
    ``model``'s layer names (its graph built untrained, in milliseconds) by
    :func:`insitu.sparse.search.check_lr_scale`; a :class:`UsageError` naming ``option`` if an item
    has no ``=``. A layer given twice takes its last factor."""
    from insitu.sparse.model_source import model_untrained_graph
    from insitu.sparse.search import check_lr_scale

    if isinstance(items, dict):
        pairs = dict(items)
    else:
        pairs = {}
        for item in items or ():
            name, sep, value = str(item).partition("=")
            if not sep or not name.strip() or not value.strip():
                raise UsageError(f"{option} {item!r}: give LAYER=FACTOR (e.g. {option} classifier=5)")
            pairs[name.strip()] = value.strip()
    if not pairs:
        return {}
    layers = [c.name for c in model_untrained_graph(model).convs]
    return check_lr_scale(pairs, layers, model=model, option=option) or {}


def check_sparse(config, board: Board) -> int:
    """Every check of ``insitu train --algo sparse`` that needs no pretraining, no data, no
    firmware build and no board: the heap, the twin, the port, the flash folder, the task and the
    scheme (parsed against the model's graph). Raises :class:`UsageError`; returns the heap in
    bytes the run will have. ``insitu.training.prepare`` calls it with the algorithm's defaults
    filled in, before any work; :func:`run_sparse` again."""
    from insitu.checks import check_int
    from insitu.sparse.tasks import check_task

    model, dataset = config.model, config.dataset

    assert board.mcu is not None                # an MCU board: sparse's only kind (prepare checks it)
    heap = config.heap or board.mcu["training_budget_bytes"]
    if config.heap is not None:
        check_int("--heap", config.heap)
    if config.heap and not board.is_twin:
        raise UsageError("--heap sets a twin's heap; a real board's heap is what its firmware has")
    if config.twin and (not board.is_twin or config.port):
        raise UsageError("--twin chooses the twin insitu starts for a -sim board; it does not apply "
                         "to a real board or to a --port")
    if config.flash_dir and (not board.is_twin or config.port):
        raise UsageError("--flash-dir sets the flash folder of the twin insitu starts for a -sim board; "
                         "it does not apply to a real board or to a --port")
    if not board.is_twin and not config.port:
        raise UsageError(f"{board.name}: give the board's serial port with --port (e.g. /dev/ttyACM0)")
    if board.is_twin and not config.port:
        if (config.twin or "qemu") == "qemu":
            from insitu.mcu import qemu

            qemu.check_heap(heap)
        # Not even the firmware's runtime fits: no scheme can (check_fits says how much after
        # the compilation, which needs the pretrained model).
        floor = int(RUNTIME_HEAP_BYTES * (1 + HEAP_MARGIN))
        if heap <= floor:
            raise UsageError(f"--heap {heap:,} B does not fit any scheme: the firmware's runtime alone "
                             f"needs about {RUNTIME_HEAP_BYTES:,} B plus a {HEAP_MARGIN:.0%} margin, "
                             "before the training arena; give a larger --heap")
        if config.flash_dir:
            check_flash_dir(config.flash_dir)
    check_task(dataset)
    check_scheme(model, config.scheme)
    parse_lr_scale(model, config.lr_scale)
    if config.port:
        check_port(config.port, board)
    return heap


def run_sparse(config, board: Board, advance) -> dict:
    started = time.perf_counter()
    heap = check_sparse(config, board)          # before any slow work
    if board.is_twin and not config.port and (config.twin or "qemu") == "qemu":
        from insitu.mcu import qemu

        qemu.firmware(print_to_stderr)          # the toolchain is there, the firmware built (once, cached)
    lr_scale = parse_lr_scale(config.model, config.lr_scale)
    prep = Prepared(config.model, config.dataset, config.scheme or default_scheme(config.model, heap), config.lr, config.seed,
                    accumulate=config.batch_size, lr_scale=lr_scale)
    compiled = prep.compiled
    check_fits(compiled, heap)
    test_samples = min(config.test_samples or 200, len(prep.y_test))
    with board_port(board, config.port, heap, config.flash_dir, config.twin) as (port, twin):
        device = run_on_device(prep, port, config.samples, test_samples, config.seed, advance, board=board)
        twin_kind = twin.twin if twin is not None else None
    predicted = device.pop("predicted_during_training")
    # The host simulation of the same program on the same samples (bit-exact with the device); at
    # each point of the curve it measures the test accuracy of the probe.
    sim = Simulator(compiled)
    x_test, y_test = prep.x_test[:test_samples], prep.y_test[:test_samples]
    probe = min(PROBE_SAMPLES, test_samples)
    sim_before = sim.accuracy(x_test, y_test)
    order = sample_order(len(prep.y_train), config.seed, 0, config.samples)
    points = {point["samples"]: point for point in device["curve"]}
    sim_predicted = np.zeros(len(order), dtype=np.int64)
    for n, i in enumerate(order):
        sim_predicted[n] = sim.train_step(prep.x_train[i], int(prep.y_train[i]))
        if n + 1 in points:
            points[n + 1]["test_accuracy"] = sim_accuracy(sim, x_test[:probe], y_test[:probe])
    sim_after = sim.accuracy(x_test, y_test)
    seen = predicted >= 0
    return {
        "board": board.name, "algo": "sparse", "model": config.model, "dataset": config.dataset,
        "twin": twin_kind,                        # qemu (Cortex-M7), unix, or None: a port given
        "scheme": compiled.scheme.to_json(), "scheme_text": compiled.scheme.describe(),
        "samples": config.samples, "test_samples": test_samples, "lr": config.lr, "lr_scale": lr_scale,
        "batch_size": config.batch_size,          # > 1: gradients accumulated over that many samples
        **device,
        "accuracy": device["accuracy_after"],
        # The curve's test accuracy: the host simulation's, on the first test samples.
        "curve_probe": {"by": "host simulation", "test_samples": probe},
        "planned_peak_bytes": compiled.arena_bytes,
        "predicted_heap_bytes": predicted_heap_bytes(compiled),
        "heap_bytes": heap,
        "memory_plan": compiled.stats["bytes_by_kind"],
        "host_sim_accuracy_before": sim_before,
        "host_sim_accuracy_after": sim_after,
        "host_sim_agreement": float(np.mean(predicted[seen] == sim_predicted[seen])) if seen.any() else None,
        "model_id": compiled.model_id,
        "seconds": time.perf_counter() - started,
    }
