"""Every command the documentation shows is run by a test, so none can rot (issue 31).

The inventory (`documented_commands`): every `insitu ...` line of README.md's and docs/*.md's code
blocks, of every command's and subcommand's `--help` (the code lines of its text: Examples blocks,
the command lists), and of the comments of the files in examples/; and every file in examples/.
Lines are joined over trailing backslashes, split on `&&`, and stripped of a trailing `# comment`,
a trailing `&`, a `$ ` prompt and a command list's description (after two spaces).

TABLE maps each command, verbatim, to how it is tested:

* Run: the command at small settings (few samples, one epoch, a smaller grid, the built-in
  mbv2-tiny for mbv2-28, digits for FashionMNIST where only the time differs), run here through the
  installed console script in a folder of its own (a workspace, shared by the commands of one
  walkthrough, which run in order: `needs`), checking the exit status and what it wrote or printed;
* Covered: an existing test runs it (at its own small settings); the test is named, and checked to
  exist and to hold the command's words (or, for the tests that read a page, to read this line);
* FailsCleanly: it needs what no test machine has (a real board, a Vivado bitstream, a power meter
  on a USB port): run as written, it must stop at once with the exit status and message recorded,
  no traceback.

`test_every_documented_command_has_a_test` fails for a documented command without an entry, naming
where it is shown; `test_every_table_entry_is_still_documented` for an entry no page shows any more.
`test_documented_options_exist` checks every command's options (and the values of its choices)
against the real command, and `test_small_variants_keep_the_documented_options` that a small
variant still passes every option its documented command shows.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, TypeAlias, TypeVar

import click
import pytest

from insitu.resources import cache_dir

pytestmark = pytest.mark.system
#: Each worker of a parallel run makes its own workspaces (tests/scheduling.py): a command and
#: what it needs run on one worker.
PER_WORKER_FIXTURES = ("workspaces",)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
#: insitu's cache as the suite found it: the slow one-offs (twins' firmware and builds, pretrained
#: models) are shared from it; the rest of what the commands cache stays in this module's own.
SHARED_CACHE = cache_dir()
SHARE = ("mcu", "mcu-twin", "mcu-native", "lrt", "rtl-twin", "rtl-verilog", "sim", "overlays", "board-wheels")


# ================================================================================== the inventory

def _commands_of_line(line: str) -> list[str]:
    """The `insitu` commands of one (joined) line: split on &&, without a trailing comment, a
    trailing &, a prompt, or a command list's description."""
    line = re.sub(r"\s+#(\s.*)?$", "", line.strip())
    found: list[str] = []
    for part in line.split("&&"):
        part = part.strip()
        if part.startswith("$ "):
            part = part[2:]
        part = re.split(r"\s{2,}", part)[0].strip()
        part = re.sub(r"\s+&$", "", part)
        if part.startswith("insitu "):
            found.append(part)
    return found


def _joined(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each logical line: lines ending in a backslash continue."""
    buffer, start = "", 0
    for number, raw in lines:
        if not buffer:                  # a new logical line: a continued one leaves at least a space
            start = number
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1].strip() + " "
            continue
        yield start, (buffer + raw.strip()) if buffer else raw.strip()
        buffer = ""
    if buffer:
        yield start, buffer.strip()


#: A documented command and where it is shown (file:line, or `insitu ... --help`).
Shown: TypeAlias = tuple[str, str]


def _from_markdown(path: Path) -> Iterator[Shown]:
    inside = False
    block: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            if inside:
                for start, text in _joined(block):
                    for command in _commands_of_line(text):
                        yield command, f"{path.relative_to(ROOT)}:{start}"
                block = []
            inside = not inside
        elif inside:
            block.append((number, line))


def _walk(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """(the subcommands' names, the command) of ``command`` and of every command under it."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _walk(sub, path + (name,))


def _from_help() -> Iterator[Shown]:
    """The code lines (indented four or more) of each command's help text before its options."""
    from insitu.cli import main

    for path, command in _walk(main):
        name = " ".join(("insitu", *path))
        with click.Context(command, info_name=name, terminal_width=200, max_content_width=200) as ctx:
            text = command.get_help(ctx)
        body = text.split("\nOptions:")[0].splitlines()
        code = [(n, line) for n, line in enumerate(body, 1) if re.match(r" {4,}\S", line)]
        for _, line in _joined(code):
            for found in _commands_of_line(line):
                yield found, f"`{name} --help`"


def _from_examples() -> Iterator[Shown]:
    for path in sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file()):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            comment = re.match(r"\s*#\s*(insitu .*)", line)
            if comment:
                for command in _commands_of_line(comment[1]):
                    yield command, f"{path.relative_to(ROOT)}:{number}"


@functools.lru_cache(maxsize=None)
def documented_commands() -> dict[str, list[str]]:
    """Every documented command -> where it is shown (file:line, or `insitu ... --help`)."""
    shown: dict[str, list[str]] = {}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    sources = [item for page in pages for item in _from_markdown(page)]
    for command, where in [*sources, *_from_help(), *_from_examples()]:
        shown.setdefault(command, []).append(where)
    return shown


def example_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*") if p.is_file())


# ====================================================================================== the table

#: What a command run here gives: its exit status and its output as text.
Result: TypeAlias = subprocess.CompletedProcess[str]
#: A check of what a Run printed (the Result) or wrote (in its workspace folder): it asserts.
Check: TypeAlias = Callable[[Result, Path], None]
#: A Run that runs its documented command itself (a server to start and stop, a design to swap).
RunsItself: TypeAlias = Callable[["Workspace", str], Result]


@dataclass(frozen=True)
class Run:
    """Run here at small settings: ``small`` (a bash line, or a function of the workspace) in a
    workspace folder, after ``needs`` (documented commands or SETUP names) ran there."""
    small: str | RunsItself
    check: tuple[Check, ...] = ()
    needs: tuple[str, ...] = ()
    workspace: str | None = None        # shared with the other commands of a walkthrough
    code: int = 0                        # the exit status the page shows (an error it documents)
    drops: tuple[str, ...] = ()         # documented options the small run leaves out (and why, in a comment)
    marks: tuple[pytest.MarkDecorator, ...] = ()
    timeout: int = 600


@dataclass(frozen=True)
class Covered:
    """An existing test runs it: ``test`` (path::function), whose module holds every word of ``shows``
    (the command's words as the test spells them), or whose ``reads()`` returns the command."""
    test: str
    shows: tuple[str, ...] = ()
    reads: Callable[[], list[str]] | None = None


@dataclass(frozen=True)
class FailsCleanly:
    """Needs what no test machine has (``reason``): run as written (or as ``small``), it stops with
    exit status ``code`` and ``says`` on stderr, no traceback."""
    reason: str
    code: int
    says: str
    small: str | None = None


TableEntry: TypeAlias = Run | Covered | FailsCleanly
#: One kind of TableEntry, as a test parametrized with that kind's commands gets it (entry_of).
Entry = TypeVar("Entry", Run, Covered, FailsCleanly)


# ---------------------------------------------------------------------------- small settings

SAMPLES = "--samples 64 --test-samples 50"                     # insitu train (sgd, tt)
LRT_TRAIN = "--samples 200 --test-samples 50 --model mlp --dataset digits"     # train --algo lrt
LRT = "--dataset digits --model mlp --offline-samples 300 --segment 60 --dense-batch 20"
E2 = "--epochs 1 --train-size 128 --test-samples 64 --width 4 --blocks-per-stage 1 --batch-size 32"
TT = "--epochs 1 --train-size 64 --dataset digits"              # tt train
MCU = "--model mbv2-tiny --evaluations 20 --train-size 30 --test-samples 30"
SEARCH = MCU + " --keep 1"
SPARSE = "--model mbv2-tiny --samples 6 --test-samples 20"     # train --algo sparse on the twin

#: Inputs a command reads that no documented command before it makes: bash lines or functions of
#: the workspace folder, run once per workspace.
SetupStep: TypeAlias = Callable[[Path], None]
SETUP: dict[str, str | SetupStep] = {}


def setup(name: str) -> Callable[[SetupStep], SetupStep]:
    """Registers the decorated function as SETUP[name]."""
    def register(function: SetupStep) -> SetupStep:
        SETUP[name] = function
        return function
    return register


SETUP["my-images"] = "insitu data export digits my-images --size 32 --samples 400"
SETUP["my_images"] = "insitu data export digits my_images --size 32 --samples 400"
SETUP["FILE.onnx"] = "insitu mcu export --model mbv2-tiny FILE.onnx"
SETUP["run dirs A B"] = (f"insitu train {SAMPLES} --run-dir A && "
                         f"insitu train {SAMPLES} --run-dir B lr=0.1")
SETUP["all.json"] = f"insitu lrt adapt --env control --scheme all {LRT} --samples 200 --lr 0.05 --out all.json"
SETUP["point.toml"] = "printf 'lr = 0.1\\nbatch-size = 16\\nsamples = 64\\ntest-samples = 50\\nseed = 0\\n' > point.toml"


@setup("table.csv")
def _table_csv(folder: Path) -> None:
    from own_data import write_csv

    write_csv(folder / "table.csv", n=400)


@setup("digits-40x40-rgb.npz")
def _rgb_npz(folder: Path) -> None:
    """digits at 40x40 RGB: more values than the PEs take, the page's example of a refusal."""
    import numpy as np

    from insitu.data import load_dataset

    ds = load_dataset("digits")

    def rgb(x: np.ndarray) -> np.ndarray:
        big = np.kron(x[:, :, :, None] if x.ndim == 3 else x, np.ones((1, 5, 5, 1), dtype=x.dtype))
        return np.repeat(big, 3, axis=3)[:, :40, :40]

    np.savez(folder / "digits-40x40-rgb.npz", x_train=rgb(ds.x_train[:100]), y_train=ds.y_train[:100],
             x_test=rgb(ds.x_test[:40]), y_test=ds.y_test[:40])


#: A value of a sweep TOML that SHRINK sets: numbers, strings and lists of them.
TomlValue: TypeAlias = int | float | str | list[int] | list[float] | list[str]
#: {section: {key: value}} of a sweep TOML.
SweepChanges: TypeAlias = dict[str, dict[str, TomlValue]]

#: The examples' sweeps at small settings: [fixed] and [grid] values replaced ([sweep] seeds too),
#: written over the copy in the workspace, so the command runs as the page shows it.
SHRINK: dict[str, SweepChanges] = {
    "examples/sweeps/lrt_fig6.toml": {
        "fixed": {"samples": 120, "dataset": "digits", "arch": "mlp"},
        "grid": {"lr": [0.016], "dense_batch": [10, 32]}},
    "examples/sweeps/train_lr.toml": {
        "sweep": {"seeds": [0]},
        "fixed": {"samples": 64, "test-samples": 50},
        "grid": {"lr": [0.01, 0.1], "batch-size": [16]}},
    "examples/sweeps/e2train_table3.toml": {
        "fixed": {"epochs": 1, "train_samples": 128, "test_samples": 64, "width": 4,
                  "blocks_per_stage": 1, "batch_size": 32},
        "grid": {"slu_target": [0.4], "beta": [0.05, 0.1]}},
}


def _toml_value(value: TomlValue) -> str:
    return json.dumps(value)              # numbers, strings and lists of them are the same in TOML


def shrink(text: str, changes: SweepChanges) -> str:
    """``text`` (a sweep TOML) with the keys of ``changes`` ({section: {key: value}}) replaced, or
    added at the end of their section; comments and the other keys are kept."""
    for section, values in changes.items():
        start = re.search(rf"^\[{section}\]\s*$", text, flags=re.M)
        assert start, f"no [{section}] to shrink"
        end = re.search(r"^\[", text[start.end():], flags=re.M)
        stop = start.end() + (end.start() if end else len(text) - start.end())
        body = text[start.end():stop]
        for key, value in values.items():
            line = f"{key} = {_toml_value(value)}"
            body, found = re.subn(rf"^{re.escape(key)}\s*=.*$", line, body, flags=re.M)
            if not found:
                body = body.rstrip("\n") + f"\n{line}\n\n"
        text = text[:start.end()] + body + text[stop:]
    return text


for _example, _changes in SHRINK.items():
    def _write(folder: Path, example: str = _example, changes: SweepChanges = _changes) -> None:
        target = folder / example
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(shrink((ROOT / example).read_text(), changes))
    SETUP[_example] = _write


# ------------------------------------------------------------------------------------ checks

#: A command's JSON as json.loads gives it: each check reads the fields its command prints (each
#: command its own), and a missing one fails the check.
Json: TypeAlias = Any


def _json(run: Result) -> Json:
    return json.loads(run.stdout)


def out_json(test: Callable[[Json], bool], what: str) -> Check:
    """The command's JSON on stdout satisfies ``test`` (``what`` says what it asserts)."""
    def check(run: Result, folder: Path) -> None:
        assert test(_json(run)), f"its JSON: {what} ({run.stdout[:1500]})"
    return check


def file_json(path: str, test: Callable[[Json], bool], what: str) -> Check:
    """The JSON file ``path`` was written and satisfies ``test``."""
    def check(run: Result, folder: Path) -> None:
        assert (folder / path).is_file(), f"{path} was not written"
        data = json.loads((folder / path).read_text())
        assert test(data), f"{path}: {what}"
    return check


def files(*paths: str) -> Check:
    """Each of ``paths`` (globs allowed) was written, not empty; .png files are PNGs."""
    def check(run: Result, folder: Path) -> None:
        for path in paths:
            found = sorted(folder.glob(path))
            assert found, f"{path} was not written (the folder holds {sorted(p.name for p in folder.iterdir())})"
            for hit in found:
                if hit.is_file():
                    assert hit.stat().st_size > 0, f"{hit} is empty"
                    if hit.suffix == ".png":
                        assert hit.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{hit} is no PNG"
    return check


def says(*words: str) -> Check:
    """Its output (stdout, then stderr) holds each of ``words``."""
    def check(run: Result, folder: Path) -> None:
        text = run.stdout + run.stderr
        for word in words:
            assert word in text, f"{word!r} not in its output: {text[-2000:]}"
    return check


def sweep_done(out: str, points: int) -> Check:
    return file_json(f"{out}/sweep.json", lambda d: d["points"] == points and d["failed"] == []
                     and len(d["table"]) >= 1, f"{points} points, none failed")


# --------------------------------------------------------------------- long-running commands

def _read_line(stream: IO[bytes], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        ready = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))[0]
        assert ready, f"no line in {timeout_s} s (got {line!r})"
        chunk = os.read(stream.fileno(), 1)
        assert chunk, f"the stream closed (got {line!r})"
        line += chunk
    return line.decode()


class Served:
    """A command that serves until Ctrl-C (`insitu power emulate`, `insitu mcu emulate`): started,
    its port read from the line it prints, stopped with SIGINT."""

    def __init__(self, command: str, folder: Path, env: dict[str, str], port_on: str, pattern: str):
        self.command = command
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=folder, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stream = self.proc.stdout if port_on == "stdout" else self.proc.stderr
        assert stream is not None                           # both are pipes
        self.first = _read_line(stream, timeout_s=300)      # a first twin builds its firmware
        match = re.search(pattern, self.first)
        assert match, f"{command}: no port in {self.first!r}"
        self.port = match[1]

    def stop(self) -> Result:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return subprocess.CompletedProcess(self.command, self.proc.returncode, out.decode(),
                                           self.first + err.decode())


POWERSHIELD = r"simulated PowerShield on (\S+)"


def serve_and_stop(port_on: str, pattern: str, serve: str | None = None, then: str | None = None) -> RunsItself:
    """Start ``serve`` (default: the documented command), read its port, run ``then`` (PORT replaced)
    against it, stop it with Ctrl-C (it must exit 0). The result: ``then``'s exit status, and the
    output of both."""
    def run(workspace: Workspace, command: str) -> Result:
        served = Served(serve or command, workspace.path, workspace.env, port_on, pattern)
        after: Result = subprocess.CompletedProcess([], 0, "", "")     # nothing run against it yet
        try:
            if then:
                after = workspace.bash(then.replace("PORT", served.port))
        finally:
            stopped = served.stop()
        assert stopped.returncode == 0, (f"{serve or command} did not stop cleanly on Ctrl-C",
                                         stopped.returncode, stopped.stderr[-2000:])
        return subprocess.CompletedProcess(command, after.returncode, after.stdout + stopped.stdout,
                                           stopped.stderr + after.stderr)
    return run


def rtl_timing_on_a_small_design(workspace: Workspace, command: str) -> Result:
    """`insitu rtl timing ...` as documented, in this process, on a small top level: Yosys takes
    minutes per part on the accelerator, seconds on a registered multiply-accumulate."""
    from unittest import mock

    from amaranth.back import verilog
    from amaranth.hdl import Elaboratable, Module, Signal
    from click.testing import CliRunner

    from insitu.accel.params import TOP_MODULE
    from insitu.cli import main

    class MultiplyAccumulate(Elaboratable):
        def __init__(self) -> None:
            self.a, self.b, self.o = Signal(8), Signal(8), Signal(16)

        def elaborate(self, platform: object) -> Module:
            m = Module()
            ra, rb = Signal(8), Signal(8)
            m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.o.eq(ra * rb + self.o)]
            return m

    design = MultiplyAccumulate()
    source = verilog.convert(design, name=TOP_MODULE, ports=[design.a, design.b, design.o])
    here = os.getcwd()
    os.chdir(workspace.path)
    try:
        with mock.patch("insitu.rtl.sim.top_verilog", lambda *args, **kwargs: source):
            result = CliRunner().invoke(main, shlex.split(command)[1:])
    finally:
        os.chdir(here)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(command, result.exit_code, result.output, "")


# ------------------------------------------------------------------ tests that read the pages

@functools.lru_cache(maxsize=None)
def _walkthrough() -> list[str]:
    from test_docs_own_data import walkthrough_commands

    return walkthrough_commands()


def _walkthrough_scheme_from_file() -> list[str]:
    """The walkthrough's twin runs with a searched scheme (`--scheme "$(cat scheme.json)"`), as
    the documented command without the walkthrough's own model, data and rates."""
    return [re.sub(r" --(model|dataset|lr|lr-scale|samples) \S+| --json", "", c) for c in _walkthrough()
            if "--board stm32f746-disco-sim" in c and '--scheme "$(cat scheme.json)"' in c]


@functools.lru_cache(maxsize=None)
def _own_data_help_examples() -> list[str]:
    from test_help_examples_own_data import all_examples, run_here

    return [c for line in run_here(all_examples()) for c in _commands_of_line(line)]


WALKTHROUGH = Covered("tests/system/test_docs_own_data.py::test_every_walkthrough_command_runs",
                      reads=_walkthrough)
HELP_OWN_DATA = Covered("tests/system/test_help_examples_own_data.py::test_the_help_examples_run",
                        reads=_own_data_help_examples)
RTL_EQUALS_FAST = Covered("tests/system/test_cli_train_fpga.py::test_the_rtl_twin_and_the_fast_twin_give_identical_weights",
                          shows=('"--mode", "rtl"', '"--algo", "tt"', '"--json"'))
#: tests/system/test_mcu_onnx.py: mbv2-tiny exported to tiny.onnx (its `exported` fixture), imported on
#: digits, and trained from on the Cortex-M7 twin (test_help_examples_own_data.RUN_ELSEWHERE).
ONNX_IMPORT = Covered("tests/system/test_mcu_onnx.py::test_mcu_import_shows_the_graph_and_its_memory_on_the_board",
                      shows=('MODEL, TASK, SCHEME, SIM_BOARD = "mbv2-tiny", "digits"', '"tiny.onnx"',
                             '"mcu", "export", "--model", MODEL, path', '"mcu", "import", exported, "--dataset", TASK'))
ONNX_ON_TWIN = Covered("tests/system/test_mcu_onnx.py::test_train_sparse_on_the_cortex_m7_twin_from_an_onnx_file",
                       shows=('"train", "--board", SIM_BOARD, "--algo", "sparse", "--model", exported', '"--samples"',
                               '"--json"'))
SPARSE_ON_TWIN = Covered("tests/system/test_mcu_train.py::test_sparse_training_on_the_twin_end_to_end",
                         shows=('"train", "--algo", "sparse"', '"--board", SIM_BOARD', '"--samples"',
                                '"--twin", kind', '"--json"', 'params=TWINS'))
MINHEAP = Covered("tests/system/test_mcu_train.py::test_minheap_bisects_the_twins_heap",
                  shows=('"mcu", "minheap", "--model", MODEL, "--scheme", SCHEME', 'MODEL, TASK, SCHEME'))
COMPARE_HEAP = Covered("tests/system/test_mcu_compare.py::test_tables_and_plot_are_written",
                       shows=('"mcu", "compare"', '"--budgets"', '"--measure-heap"', '"--out"', '"--plot"'))
EMULATE = Covered("tests/firmware/test_mcu_twin.py::test_emulate_serves_mpremote_and_insitu_flash_resets_on_sigusr1_and_stops_on_sigterm",
                  shows=('"mcu", "emulate"', '"flash", "--board", "stm32f746-disco-sim"', '"--port", port',
                         '"--model-dir"'))
RAY_SWEEP = Covered("tests/system/test_cli_sweep.py::test_ray_and_local_sweeps_give_identical_tables",
                    shows=('"--ray-address", address', '"--json"', 'run = "lrt.adapt"'))
BOARDS = Covered("tests/system/test_cli.py::test_boards_json_lists_boards_and_twins_with_resources",
                 shows=('run_cli("boards", "--json")', 'run_cli("boards")'))
RUN_FOLDERS = Covered("tests/system/test_cli_runs.py::test_run_folders_keep_the_run_and_are_compared",
                      shows=('"--run-dir", a, "lr=0.1"', '"train", "--config", a / "config.toml", "seed=1", "--run-dir", b',
                             '"runs", "compare", a, b, "--json", "--plot"'))
WRITES_RUNS = Covered("tests/system/test_cli_writes.py::test_sgd_vs_lrt_side_by_side",
                      shows=('"lrt", "adapt", "--scheme", scheme', '"--env", "control"', '"--out", d / f"{scheme}.json"',
                             '"--counts", d / f"{scheme}.npz"'))
WRITES_SIDE_BY_SIDE = Covered("tests/system/test_cli_writes.py::test_sgd_vs_lrt_side_by_side",
                              shows=('"report", runs / "sgd.json", "--counts", runs / "sgd.npz", "--compare"',
                                     '"--compare-counts", runs / "lrt.npz", "--plot", plot, "--json"'))
BOARD_FAILS = FailsCleanly(reason="runs on the board itself: a PYNQ image with the Vivado-built bitstream",
                           code=2, says="insitu_ultra96v2.bit is missing")

TABLE: dict[str, TableEntry] = {
    # ------------------------------------------------------------------ README.md, the basics
    "insitu doctor": Run("insitu doctor", (says("python", "everything is in place"),)),
    "insitu boards --json": BOARDS,
    "insitu data info fashion-mnist --json": Covered("tests/system/test_cli_data.py::test_info_fashion_mnist_json",
                                                     shows=('run_cli("data", "info", "fashion-mnist", "--json")',)),
    "insitu train --board ultra96v2-sim --samples 6000 --json": Run(
        f"insitu train --board ultra96v2-sim {SAMPLES} --json",
        (out_json(lambda d: (d["board"], d["algo"], d["samples"]) == ("ultra96v2-sim", "sgd", 64), "sgd on the twin"),)),
    "insitu train --algo tt --samples 6000 --json": Run(
        f"insitu train --algo tt {SAMPLES} --json",
        (out_json(lambda d: d["algo"] == "tt" and d["pl_cycles"] > 0 and d["energy_j"] > 0, "tt on the PEs"),)),
    "insitu train --algo lrt --samples 2000 --json": Run(
        f"insitu train --algo lrt {LRT_TRAIN} --json",
        (out_json(lambda d: d["algo"] == "lrt" and "max_writes_per_cell" in d, "lrt with write counts"),)),
    "insitu train --algo tt --mode rtl --samples 64 --test-samples 100": RTL_EQUALS_FAST,
    "insitu train --checkpoint run.npz": Run(
        f"insitu train --checkpoint run.npz {SAMPLES} >/dev/null && insitu train --checkpoint run.npz {SAMPLES} --json",
        (files("run.npz"), out_json(lambda d: d["resumed_from"] == 64, "the second run resumes at 64"))),
    "insitu e2train run --techniques smd,slu,psg --epochs 6 --json": Covered(
        "tests/system/test_cli_e2train.py::test_prints_the_headline_figures",
        shows=('"--techniques", "smd,slu,psg", *TINY', '"--json"', '"--epochs", "1"')),
    "insitu deploy --board ultra96v2 --bitstream insitu_ultra96v2.bit --out-dir bundle --host myboard -- --algo tt":
        FailsCleanly("needs the Vivado-built bitstream and a PYNQ board reachable as myboard", 2,
                     "'insitu_ultra96v2.bit' does not exist"),
    # README.md, your own data: the walkthrough of docs/own-data.md
    "insitu data export digits my-images --size 32": WALKTHROUGH,
    "insitu data info folder:my-images": WALKTHROUGH,
    "insitu mcu export --model mbv2-28 mbv2-28.onnx": WALKTHROUGH,
    "insitu mcu import mbv2-28.onnx --dataset folder:my-images": WALKTHROUGH,
    "insitu train --board stm32f746-disco-sim --algo sparse --model mbv2-28.onnx --dataset folder:my-images --samples 200 --json": WALKTHROUGH,
    # README.md, run folders
    "insitu train --samples 6000 --run-dir runs/lr05 lr=0.05": Run(
        f"insitu train {SAMPLES} --run-dir runs/lr05 lr=0.05",
        (files("runs/lr05/result.json", "runs/lr05/config.toml"),), workspace="readme-runs"),
    "insitu train --config runs/lr05/config.toml lr=0.2 --run-dir runs/lr2": Run(
        "insitu train --config runs/lr05/config.toml lr=0.2 --run-dir runs/lr2",
        (file_json("runs/lr2/result.json", lambda d: d["lr"] == 0.2 and d["samples"] == 64, "lr 0.2, the config's 64 samples"),),
        needs=("insitu train --samples 6000 --run-dir runs/lr05 lr=0.05",), workspace="readme-runs"),
    "insitu tt train --variant fixed --epochs 2 train-size=2000 --run-dir runs/tt": Run(
        "insitu tt train --variant fixed --epochs 1 train-size=64 --dataset digits --run-dir runs/tt",
        (files("runs/tt/result.json"),), workspace="readme-runs"),
    "insitu runs compare runs/lr05 runs/lr2 runs/tt --plot curves.png": Run(
        "insitu runs compare runs/lr05 runs/lr2 runs/tt --plot curves.png", (files("curves.png"), says("lr2", "tt")),
        needs=("insitu train --samples 6000 --run-dir runs/lr05 lr=0.05",
               "insitu train --config runs/lr05/config.toml lr=0.2 --run-dir runs/lr2",
               "insitu tt train --variant fixed --epochs 2 train-size=2000 --run-dir runs/tt"), workspace="readme-runs"),

    # ------------------------------------------------------------------------ docs/e2train.md
    "insitu e2train run --dataset folder:my_images --downsample 1 --train-size 800 --test-samples 200": Run(
        f"insitu e2train run --dataset folder:my_images --downsample 1 {E2} --json",
        (out_json(lambda d: d["config"]["dataset"] == "folder:my_images" and d["config"]["downsample"] == 1,
                  "trained on the folder, whole"),), needs=("my_images",), workspace="images"),
    "insitu e2train run --ablation --epochs 6 --out-dir e2 --plot e2/fig.png": Run(
        f"insitu e2train run --ablation {E2} --out-dir e2 --plot e2/fig.png", (files("e2/e2train.json", "e2/fig.png"),),
        workspace="e2-ablation"),
    "insitu e2train run --techniques psg --meter powershield:PORT --power-out e2/power.csv": Run(
        serve_and_stop("stderr", POWERSHIELD, serve="insitu power emulate",
                       then=f"insitu e2train run --techniques psg --meter powershield:PORT --power-out e2/power.csv {E2}"),
        (files("e2/power.csv"), file_json("e2/power.json", lambda d: d["complete"] and d["samples"] > 0,
                                          "a complete record of the emulated PowerShield")),
        workspace="powershield-e2train"),

    # --------------------------------------------------------------------------- docs/fpga.md
    "insitu train --algo tt --mode rtl --samples 64 --json": RTL_EQUALS_FAST,
    "insitu train --algo lrt --env shift --samples 2000 --json": Run(
        f"insitu train --algo lrt --env shift {LRT_TRAIN} --json",
        (out_json(lambda d: d["algo"] == "lrt" and d["env"] == "shift", "lrt under shift"),)),
    "insitu train --board zedboard-sim --algo tt --samples 640": Run(
        f"insitu train --board zedboard-sim --algo tt {SAMPLES}", (says("zedboard-sim"),)),
    "insitu deploy --board ultra96v2 --bitstream build/rtl/insitu_ultra96v2.bit --out-dir bundle --host u96 -- --algo tt":
        FailsCleanly("needs the Vivado-built bitstream and a PYNQ board reachable as u96", 2,
                     "'build/rtl/insitu_ultra96v2.bit' does not exist"),
    "insitu train --board ultra96v2 --bitstream insitu_ultra96v2.bit --algo tt --json": BOARD_FAILS,

    # ---------------------------------------------------------------------------- docs/lrt.md
    "insitu lrt adapt --env {control,shift,analog,digital} --scheme {inference,bias,sgd,lrt,lrt-maxnorm,all} "
    "--samples N --seed S [--json] [--plot fig.png] [--out run.json] [--counts counts.npz] "
    "[--checkpoint run.ckpt.npz [--checkpoint-every 1000]] [--model cnn|mlp] "
    "[--dataset fashion-mnist|mnist|digits|folder:DIR|npz:FILE|csv:FILE]": Run(
        "insitu lrt adapt --env digital --scheme lrt --samples 120 --seed 1 --json --plot fig.png --out run.json "
        "--counts counts.npz --checkpoint run.ckpt.npz --checkpoint-every 60 --model mlp --dataset digits "
        "--offline-samples 300 --segment 60 --dense-batch 20",
        (files("fig.png", "run.json", "counts.npz", "run.ckpt.npz"),
         out_json(lambda d: (d["env"], d["scheme"], d["samples"], d["seed"]) == ("digital", "lrt", 120, 1), "the run asked"))),
    "insitu lrt transfer [--ranks 1,2,4,8] [--lrs 0.003,0.01,0.03,0.1,0.3] [--seeds 0,1,2] [--json] [--dataset …]": Run(
        "insitu lrt transfer --ranks 1,2 --lrs 0.1 --seeds 0 --json --dataset digits --samples 100 --pretrain-samples 200",
        (out_json(lambda d: {r["algorithm"] for r in d["table"]} >= {"SGD", "LRT"}, "SGD and LRT rows"),)),
    "insitu lrt bench [--sizes 256,512,1024,2048] [--rank 4] [--json]": Run(
        "insitu lrt bench --sizes 32,64 --rank 4 --json",
        (out_json(lambda d: [r["n"] for r in d["rows"]] == [32, 64], "a row per size"),)),

    # ---------------------------------------------------------------------------- docs/mcu.md
    "insitu train --board stm32f746-disco-sim --algo sparse --samples 1000 --json": SPARSE_ON_TWIN,
    # The paper's 128x128 networks take ~12 min of pretraining and minutes of flashing each: the
    # path is the same at mbv2-tiny; their runs are measured (docs/mcu.md, "The paper's networks").
    "insitu train --board stm32f746-disco-sim --algo sparse --model mcunet-5fps --samples 200 --json": SPARSE_ON_TWIN,
    "insitu train --board stm32f746-disco --port /dev/ttyACM0 --algo sparse --scheme bias-6": FailsCleanly(
        "needs an STM32F746G-DISCO on /dev/ttyACM0", 2, "--port /dev/ttyACM0: no such serial port"),
    "insitu train --board stm32f746-disco-sim --algo sparse --batch-size 4": Covered(
        "tests/system/test_mcu_train.py::test_accumulated_gradients_train_the_same_on_the_twin_and_the_host",
        shows=('"train", "--algo", "sparse"', '"--board", SIM_BOARD', '"--batch-size", 3')),
    "insitu mcu emulate": EMULATE,
    "insitu train --board stm32f746-disco-sim --algo sparse --twin unix": SPARSE_ON_TWIN,
    "insitu flash --board stm32f746-disco --port /dev/ttyACM0": FailsCleanly(
        "needs an STM32F746G-DISCO on /dev/ttyACM0", 1, "cannot open the serial port /dev/ttyACM0"),
    "insitu mcu search --budget 64K --out scheme.json --plot curves.png": Run(
        f"insitu mcu search --budget 64K --out scheme.json --plot curves.png {SEARCH}",
        (files("curves.png"), file_json("scheme.json", lambda d: isinstance(d, dict) and len(d) > 0, "a scheme"))),
    "insitu train --board stm32f746-disco-sim --algo sparse --scheme \"$(cat scheme.json)\"": Covered(
        WALKTHROUGH.test, reads=_walkthrough_scheme_from_file),
    "insitu mcu compare --budgets 32K,48K,64K --measure-heap --plot fig9.png": COMPARE_HEAP,
    "insitu mcu compare --budgets 32K,48K,64K --lr 0.01 --lr-scale classifier=5 --train-size 4314": Run(
        f"insitu mcu compare --budgets 32K,48K,64K --lr 0.01 --lr-scale classifier=5 {MCU}",
        (says("sparse (searched)", "last layer"),)),
    "insitu mcu minheap --scheme bias-6": MINHEAP,
    "insitu mcu export --model mbv2-tiny tiny.onnx": ONNX_IMPORT,
    "insitu mcu import tiny.onnx --dataset digits": ONNX_IMPORT,
    "insitu train --board stm32f746-disco-sim --algo sparse --model tiny.onnx --samples 200 --json": ONNX_ON_TWIN,

    # ------------------------------------------------------------------------ docs/measure.md
    "insitu power record --meter SPEC --trace run.csv --plot run.png --json -- COMMAND ...": Covered(
        "tests/system/test_cli_power.py::test_record_measures_a_command_with_its_phases_and_draws_them",
        shows=('"record", "--meter", "synthetic:sine", "--trace", out, "--plot", plot, "--json"',)),
    "insitu power record --meter SPEC --run-dir runs/a --json -- COMMAND ...": Covered(
        "tests/system/test_cli_power.py::test_run_dir_holds_the_trace_record_and_phases_and_is_never_overwritten",
        shows=('"record", "--meter", "synthetic:2@500", "--run-dir", run_dir, "--json"',)),
    "insitu train --board stm32f746-disco-sim --algo sparse --meter SPEC --power-out train.csv": Run(
        f"insitu train --board stm32f746-disco-sim --algo sparse --meter synthetic:sine --power-out train.csv {SPARSE} "
        "--twin unix",                 # the faster twin: the Cortex-M7 one runs in SPARSE_ON_TWIN
        (files("train.csv"), file_json("train.json", lambda d: d["complete"], "a complete record"))),
    "insitu power emulate": Run(serve_and_stop("stderr", POWERSHIELD), (says("simulated PowerShield on /"),)),
    "insitu writes report sgd.json --compare lrt.json --plot writes.png [--json]": WRITES_SIDE_BY_SIDE,
    "insitu sweep examples/sweeps/lrt_fig6.toml [--out-dir DIR] [--ray-address ADDR] [--json]": Run(
        # the same sweep again into the same folder: every point is found done, the table printed
        "insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6 --json",
        (out_json(lambda d: d["points"] == d["skipped"] == 4 and len(d["table"]) == 4, "4 points, all done before"),),
        needs=("insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6",), workspace="sweep-fig6",
        drops=("--ray-address",)),     # a Ray cluster: RAY_SWEEP runs a sweep on one
    "insitu sweep examples/sweeps/train_lr.toml --out-dir lr": Run(
        "insitu sweep examples/sweeps/train_lr.toml --out-dir lr", (sweep_done("lr", 2), files("lr/points/*/result.json")),
        needs=("examples/sweeps/train_lr.toml",), workspace="sweep-train-lr"),
    "insitu runs compare lr/points/* --json": Run(
        "insitu runs compare lr/points/* --json", (out_json(lambda d: d["differing"] == ["lr"] and len(d["runs"]) == 2,
                                                            "the two points, differing in lr"),),
        needs=("insitu sweep examples/sweeps/train_lr.toml --out-dir lr",), workspace="sweep-train-lr"),

    # ----------------------------------------------------------------------- docs/own-data.md
    "insitu train --board stm32f746-disco-sim --algo sparse --model mbv2-28.onnx --dataset folder:my-images --samples 200 --lr 0.05 --lr-scale classifier=1 --json": WALKTHROUGH,
    "insitu mcu search --model mbv2-28.onnx --dataset folder:my-images --budget 64K --evaluations 200 --train-size 100 --test-samples 100 --keep 2 --out scheme.json": WALKTHROUGH,
    "insitu train --board stm32f746-disco-sim --algo sparse --model mbv2-28.onnx --dataset folder:my-images --scheme \"$(cat scheme.json)\" --lr 0.01 --lr-scale classifier=5 --samples 200 --json": WALKTHROUGH,
    "insitu train --board stm32f746-disco --port /dev/ttyACM0 --algo sparse --model mbv2-28.onnx --dataset folder:my-images --scheme \"$(cat scheme.json)\" --lr 0.01 --lr-scale classifier=5 --samples 200 --json": WALKTHROUGH,
    "insitu train --dataset folder:my-images --model cnn --samples 4000 --json": WALKTHROUGH,
    "insitu train --algo tt --dataset folder:my-images --input-size 16x16x1 --batch-size 32 --lr 0.003 --prior-weight 0.1 --samples 4000 --json": WALKTHROUGH,
    "insitu lrt adapt --dataset folder:my-images --env control --offline-samples 2000 --samples 4000 --segment 1000 --json": WALKTHROUGH,
    "insitu e2train run --dataset folder:my-images --downsample 1 --train-size 1100 --test-samples 280 --epochs 6 --json": WALKTHROUGH,

    # ---------------------------------------------------------------------------- docs/rtl.md
    "insitu rtl generate --out-dir build/rtl": Covered(
        "tests/system/test_cli_rtl.py::test_generate_writes_the_real_design",
        shows=('run_cli("rtl", "generate", "--out-dir", out)',)),
    "insitu rtl report --json": Covered(
        "tests/system/test_cli_rtl.py::test_report_measures_the_network_in_simulation",
        shows=('"rtl", "report"', '"--json"')),      # with --no-synth: Yosys on the whole design takes minutes
    "insitu rtl report --board zedboard --no-synth": Covered(
        "tests/system/test_cli_rtl.py::test_report_measures_the_network_in_simulation",
        shows=('"rtl", "report"', '"--no-synth"', '"--board", "zedboard"')),
    "insitu rtl timing --part all --paths 15": Run(
        rtl_timing_on_a_small_design, (says("xc7z020: LUT", "xczu3eg: LUT", "ns"),), marks=(pytest.mark.rtl,)),
    "insitu rtl timing --part xczu3eg --json --out build/timing.json --netlist-dir build/netlists": Run(
        rtl_timing_on_a_small_design,
        (files("build/netlists/xczu3eg.netlist.json"),
         file_json("build/timing.json", lambda d: list(d) == ["xczu3eg"] and d["xczu3eg"]["timing"], "xczu3eg's estimate")),
        marks=(pytest.mark.rtl,)),

    # ----------------------------------------------------------------------------- docs/tt.md
    "insitu tt train --variant fixed-prior --epochs 10 --json": Run(
        f"insitu tt train --variant fixed-prior {TT} --json",
        (out_json(lambda d: d["variant"] == "fixed-prior" and 0 <= d["test_accuracy"] <= 1, "fixed-prior's accuracy"),)),
    "insitu tt train --variant all --epochs 10 --plot tt.png --out tt.json --checkpoint tt.npz": Run(
        f"insitu tt train --variant all {TT} --plot tt.png --out tt.json --checkpoint tt.npz",
        (files("tt.png", "tt-*.npz"), file_json("tt.json", lambda d: len(d["results"]) == 5, "the five variants"))),
    "insitu tt schedule --batch-size 64": Run("insitu tt schedule --batch-size 64", (says("PE1", "PE2", "PE3"),)),
    "insitu tt bench": Run("insitu tt bench --steps 1 --batch-size 8", (says("samples/s", "fixed"),)),
    "insitu tt train --dataset folder:my-images --variant fixed --epochs 10": Run(
        "insitu tt train --dataset folder:my-images --variant fixed --epochs 1 --train-size 64",
        (says("fixed"),), needs=("my-images",), workspace="images"),
    "insitu tt train --dataset npz:digits-40x40-rgb.npz": Run(
        "insitu tt train --dataset npz:digits-40x40-rgb.npz",
        (says("does not fit the PEs for 40x40 RGB images (5120 values", "--input-size 40x40x1", "--input-size 25x25"),),
        needs=("digits-40x40-rgb.npz",), code=2),
    "insitu tt train --variant V --epochs 10 --out docs/results/tt/V.json": Run(
        "for V in dense float fixed float-prior fixed-prior; do "
        f"insitu tt train --variant $V {TT} --out docs/results/tt/$V.json || exit 1; done",
        (files("docs/results/tt/dense.json", "docs/results/tt/fixed-prior.json"),), workspace="tt-table1"),
    "insitu tt report docs/results/tt/{dense,float,fixed,float-prior,fixed-prior}.json --plot docs/results/tt/table1.png": Run(
        "insitu tt report docs/results/tt/{dense,float,fixed,float-prior,fixed-prior}.json --plot docs/results/tt/table1.png",
        (files("docs/results/tt/table1.png"), says("fixed-prior", "reduction")),
        needs=("insitu tt train --variant V --epochs 10 --out docs/results/tt/V.json",), workspace="tt-table1"),

    # ------------------------------------------------------------------------- insitu --help
    "insitu boards": BOARDS,
    "insitu data info fashion-mnist": Covered("tests/system/test_cli_data.py::test_info_fashion_mnist_table",
                                              shows=('run_cli("data", "info", "fashion-mnist")',)),
    "insitu train": Run(f"insitu train {SAMPLES}", (says("accuracy"),)),
    "insitu lrt adapt --env shift": Run(f"insitu lrt adapt --env shift {LRT} --samples 120", (says("online accuracy"),)),
    "insitu tt train": Run(f"insitu tt train {TT}", (says("fixed-prior"),)),
    "insitu runs compare A B": Run("insitu runs compare A B", (says("insitu train", "A", "B"),), needs=("run dirs A B",),
                                   workspace="runs-A-B"),

    # ----------------------------------------------------------------------- subcommands' --help
    "insitu data export digits digits.npz": HELP_OWN_DATA,
    "insitu data info digits": HELP_OWN_DATA,
    "insitu data info folder:my-images --json": HELP_OWN_DATA,
    "insitu deploy --board ultra96v2 --out-dir bundle -- --algo tt --samples 6000 --json": Run(
        "insitu deploy --board ultra96v2 --out-dir bundle -- --algo tt --samples 6000 --json",
        (files("bundle/run.sh", "bundle/manifest.json"), says("no overlay for ultra96v2"))),
    "insitu deploy --board zedboard-sim --out-dir twin-bundle -- --model tiny --samples 64": Run(
        "insitu deploy --board zedboard-sim --out-dir twin-bundle -- --model tiny --samples 64",
        (files("twin-bundle/run.sh", "twin-bundle/insitu_zedboard.bit", "twin-bundle/insitu_zedboard.hwh"),)),
    "insitu deploy --board ultra96v2 --out-dir bundle --bitstream my.bit --hwh my.hwh": Covered(
        "tests/system/test_cli_deploy.py::test_bundle_holds_overlay_wheel_script_and_manifest",
        shows=('"deploy", "--board", "ultra96v2", "--out-dir", out, "--bitstream", bit, "--hwh", hwh',)),
    "insitu deploy --board ultra96v2 --out-dir bundle --host pynq --user root --dry-run": Run(
        "insitu deploy --board ultra96v2 --out-dir bundle --host pynq --user root --dry-run",
        (files("bundle/run.sh"), says("root@pynq", "bash insitu-bundle/run.sh"))),
    "insitu e2train run --ablation --epochs 6 --out-dir e2 --plot e2/accuracy_energy.png": Run(
        f"insitu e2train run --ablation {E2} --out-dir e2 --plot e2/accuracy_energy.png",
        (files("e2/e2train.json", "e2/accuracy_energy.png"),), workspace="e2-ablation"),
    "insitu e2train run --techniques psg --meter synthetic:sine --power-out e2/power.csv": Covered(
        "tests/system/test_cli_e2train.py::test_measured_energy_per_row",
        shows=('"--techniques", "psg", *TINY, "--meter", "synthetic:2.5", "--power-out", power',)),
    "insitu e2train run --dataset folder:my_images --train-size 800 --test-samples 200": Run(
        f"insitu e2train run --dataset folder:my_images {E2}", (says("psg"),), needs=("my_images",), workspace="images"),
    "insitu flash --port /dev/ttyACM0": FailsCleanly(
        "needs an STM32F746G-DISCO on /dev/ttyACM0", 1, "cannot open the serial port /dev/ttyACM0"),
    "insitu flash --board stm32f746-disco-sim --port /tmp/insitu-twin-XXXX/tty --model-dir out/model": EMULATE,
    "insitu lrt adapt --env shift --scheme lrt-maxnorm --samples 10000 --json": Covered(
        "tests/system/test_cli_lrt.py::test_adapt_reports_accuracy_and_writes_and_saves_figure_json_counts",
        shows=('"lrt", "adapt", "--env", "shift", "--scheme", "lrt-maxnorm", "--samples", "240"', '"--json"')),
    "insitu lrt adapt --env analog --scheme all --samples 10000 --plot analog.png": Run(
        f"insitu lrt adapt --env analog --scheme all --samples 120 {LRT} --plot analog.png",
        (files("analog.png"), says("lrt-maxnorm", "sgd"))),
    "insitu lrt adapt --env shift --dataset folder:my_images --samples 2000": Run(
        f"insitu lrt adapt --env shift --dataset folder:my_images --samples 120 --model mlp --offline-samples 300 "
        "--segment 60 --dense-batch 20", (says("online accuracy"),), needs=("my_images",), workspace="images"),
    "insitu lrt adapt --env control --model mlp --dataset csv:table.csv --samples 2000": Run(
        "insitu lrt adapt --env control --model mlp --dataset csv:table.csv --samples 120 --offline-samples 200 "
        "--segment 60 --dense-batch 20", (says("online accuracy"),), needs=("table.csv",)),
    "insitu lrt transfer --json": Run(
        "insitu lrt transfer --json --ranks 1 --lrs 0.1 --seeds 0 --dataset digits --samples 100 --pretrain-samples 200",
        (out_json(lambda d: d["seeds"] == [0] and d["table"], "a table for seed 0"),)),
    "insitu lrt bench --json": Covered("tests/system/test_cli_lrt.py::test_bench_reports_speedup_and_memory",
                                       shows=('run_cli("lrt", "bench", "--sizes", "32,64", "--json")',)),
    "insitu mcu build-twin": Run("insitu mcu build-twin", (says("firmware.elf"),)),
    "insitu mcu build-kernels": Run("insitu mcu build-kernels", (says("tte_native.mpy"),)),
    "insitu mcu build-kernels --json": Run("insitu mcu build-kernels --json", (out_json(
        lambda d: d["arch"] == "armv7emsp" and d["module"].endswith("tte_native.mpy") and d["bytes"] > 0,
        "the module's path, arch and size"),)),
    "insitu mcu search": Run(f"insitu mcu search --budget 64K {SEARCH} --json",
                             (out_json(lambda d: isinstance(d, dict) and len(d) > 0, "a report"),)),
    "insitu mcu minheap": MINHEAP,
    "insitu mcu compare": Run(f"insitu mcu compare --budgets 16K,32K {MCU}", (says("sparse (searched)"),)),
    "insitu mcu import FILE.onnx": Run("insitu mcu import FILE.onnx", (says("MACs"),), needs=("FILE.onnx",)),
    "insitu mcu export OUT.onnx": Run("insitu mcu export --model mbv2-tiny OUT.onnx", (files("OUT.onnx"),)),
    "insitu mcu compare --budgets 48K,64K,96K --measure-heap --plot fig9.png --out fig9.json": COMPARE_HEAP,
    "insitu mcu emulate --heap 320K --flash-dir ./flash": Run(
        # and the line the help shows after it, mpremote on the printed port
        serve_and_stop("stdout", r"(\S+)", then='mpremote connect PORT exec "import sys; print(sys.implementation._machine)"'),
        (says("heap 327680 bytes", "with Cortex-M7"), files("flash"))),
    "insitu train --board stm32f746-disco-sim --algo sparse --model tiny.onnx --samples 100": ONNX_ON_TWIN,
    "insitu mcu minheap --model mbv2-tiny --scheme bias-4": MINHEAP,
    "insitu mcu search --budget 128K --out scheme.json --plot curve.png": Run(
        f"insitu mcu search --budget 128K --out scheme.json --plot curve.png {SEARCH}",
        (files("scheme.json", "curve.png"),)),
    "insitu mcu search --budget 64K --lr 0.01 --lr-scale classifier=5 --train-size 4314": Run(
        f"insitu mcu search --budget 64K --lr 0.01 --lr-scale classifier=5 {SEARCH}", (says("64.0 KiB"),)),
    "insitu power record --meter SPEC --trace run.csv -- COMMAND...": Covered(
        "tests/system/test_cli_power.py::test_record_reports_in_words_without_json",
        shows=('"record", "--meter", "synthetic:2", "--trace", tmp_path / "run.csv", "--", sys.executable, child',)),
    "insitu power record --meter SPEC --run-dir runs/a -- COMMAND...": Covered(
        "tests/system/test_cli_power.py::test_a_power_run_folder_is_compared_with_the_training_runs",
        shows=('"power", "record", "--meter", "synthetic:2", "--run-dir", tmp_path / "p", "--", "sleep", "1"',)),
    "insitu power record --meter powershield:PORT --trace run.csv -- insitu train --samples 500": Run(
        serve_and_stop("stderr", POWERSHIELD, serve="insitu power emulate",
                       then=f"insitu power record --meter powershield:PORT --trace run.csv -- insitu train {SAMPLES}"),
        (file_json("run.json", lambda d: d["complete"] and d["samples"] > 0, "a complete record"),)),
    "insitu power record --meter synthetic:sine --trace run.csv -- sleep 3": Run(
        "insitu power record --meter synthetic:sine --trace run.csv -- sleep 1",
        (file_json("run.json", lambda d: d["complete"] and d["duration_s"] >= 1, "a complete record"),)),
    "insitu power record --meter synthetic:sine --run-dir runs/sgd --json -- insitu train --samples 600": Run(
        f"insitu power record --meter synthetic:sine --run-dir runs/sgd --json -- insitu train {SAMPLES}",
        (out_json(lambda d: d["complete"] and "train" in json.dumps(d), "a record with the train phase"),
         files("runs/sgd/power.csv"))),
    "insitu power record --meter powershield:/dev/ttyACM0 --trace run.csv --plot run.png --json -- insitu train --board stm32f746-disco --port /dev/ttyACM1 --algo sparse":
        FailsCleanly("needs an X-NUCLEO-LPM01A PowerShield on /dev/ttyACM0 and a board on /dev/ttyACM1", 1,
                     "powershield:/dev/ttyACM0: cannot open the port"),
    "insitu rtl generate --out-dir build/rtl --json": Covered(
        "tests/system/test_cli_rtl.py::test_generate_writes_the_real_design",
        shows=('"rtl", "generate", "--out-dir", out, "--json"',)),
    "insitu rtl bench --json": Run("insitu rtl bench --json --min-seconds 0",
                                   (out_json(lambda d: {r["simulator"] for r in d["rows"]} == {"amaranth", "verilator"},
                                             "both simulators"),), marks=(pytest.mark.rtl,)),
    "insitu rtl bench --simulators verilator": Run("insitu rtl bench --simulators verilator --min-seconds 0",
                                                   (says("verilator"),), marks=(pytest.mark.rtl,)),
    "insitu runs compare DIR...": Run("insitu runs compare A B --json", (out_json(
        lambda d: [r["run"] for r in d["runs"]] == ["A", "B"] and d["differing"] == ["lr"], "A and B, differing in lr"),),
        needs=("run dirs A B",), workspace="runs-A-B"),
    "insitu train --run-dir runs/lr01 lr=0.01": RUN_FOLDERS,
    "insitu train --run-dir runs/lr1 lr=0.1": RUN_FOLDERS,
    "insitu runs compare runs/lr01 runs/lr1 --plot curves.png": RUN_FOLDERS,
    "insitu runs compare runs/* --json": RUN_FOLDERS,
    "insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6": Run(
        "insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6", (sweep_done("fig6", 4), files("fig6/heatmap-*.png")),
        needs=("examples/sweeps/lrt_fig6.toml",), workspace="sweep-fig6"),
    "insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6 --ray-address HEAD:6379 --json": RAY_SWEEP,
    "insitu train --samples 6000 --json": Run(f"insitu train {SAMPLES} --json",
                                              (out_json(lambda d: d["samples"] == 64 and 0 <= d["accuracy"] <= 1, "64 samples"),)),
    "insitu train --board ultra96v2-sim --dataset digits --model cnn": Run(
        f"insitu train --board ultra96v2-sim --dataset digits --model cnn {SAMPLES}", (says("accuracy"),)),
    "insitu train --dataset folder:my-images --model cnn --samples 2000": HELP_OWN_DATA,
    "insitu train --checkpoint run.ckpt.npz": Run(f"insitu train --checkpoint run.ckpt.npz {SAMPLES}", (files("run.ckpt.npz"),)),
    "insitu train --run-dir runs/a lr=0.1 --plot a.png": Run(
        f"insitu train --run-dir runs/a lr=0.1 --plot a.png {SAMPLES}", (files("a.png", "runs/a/result.json"),)),
    "insitu train --config runs/a/config.toml seed=1 --run-dir runs/b": RUN_FOLDERS,
    "insitu train --algo tt --dataset folder:my-images --input-size 20x20 --samples 6000": HELP_OWN_DATA,
    "insitu train --algo tt --model tiny --mode rtl-amaranth --samples 4 --batch-size 4 --test-samples 8": Run(
        # one sample at rank 1 on 4x4 images: 4,791 cycles in Amaranth's simulator (~1,500 cycles/s),
        # against 15,836 at the tiny model's rank 4 on 28x28 images
        "insitu train --algo tt --model tiny --mode rtl-amaranth --samples 1 --batch-size 1 --test-samples 1 "
        "--rank 1 --input-size 4x4",
        (says("accuracy"),), marks=(pytest.mark.rtl,)),
    "insitu train --board ultra96v2 --bitstream insitu_ultra96v2.bit --algo tt": BOARD_FAILS,
    "insitu train --board stm32f746-disco-sim --algo sparse --samples 500 --json": SPARSE_ON_TWIN,
    "insitu tt train --variant all --epochs 10 --plot tt.png --out tt.json": Run(
        f"insitu tt train --variant all {TT} --plot tt.png --out tt.json",
        (files("tt.png"), file_json("tt.json", lambda d: len(d["results"]) == 5, "the five variants"))),
    "insitu tt train --dataset folder:my-images --input-size 20x20 --epochs 5": Run(
        "insitu tt train --dataset folder:my-images --input-size 20x20 --epochs 1 --train-size 64 --json",
        (out_json(lambda d: 0 <= d["test_accuracy"] <= 1, "an accuracy"),), needs=("my-images",), workspace="images"),
    "insitu tt report fixed.json fixed-prior.json --plot tt.png": Covered(
        "tests/system/test_cli_tt.py::test_train_float_prints_json_and_writes_out_and_plot",
        shows=('run_cli("tt", "report", out, out, "--plot", both)',)),
    "insitu lrt adapt --env control --scheme sgd --out sgd.json --counts sgd.npz": WRITES_RUNS,
    "insitu lrt adapt --env control --scheme lrt --out lrt.json --counts lrt.npz": WRITES_RUNS,
    "insitu writes report lrt.json --counts lrt.npz": WRITES_SIDE_BY_SIDE,
    "insitu writes report sgd.json --counts sgd.npz --compare lrt.json --compare-counts lrt.npz --plot writes.png":
        WRITES_SIDE_BY_SIDE,
    "insitu writes report all.json --scheme sgd --compare all.json --compare-scheme lrt --json": Run(
        "insitu writes report all.json --scheme sgd --compare all.json --compare-scheme lrt --json",
        (out_json(lambda d: [r["label"] for r in d["runs"]] == ["sgd", "lrt"], "sgd and lrt side by side"),),
        needs=("all.json",)),
    "insitu writes report board.json": Covered(
        "tests/system/test_cli_writes.py::test_board_run_from_train_algo_lrt_against_sgd",
        shows=('"train", "--algo", "lrt"', '"--out", d / "board.json"', '"--compare", runs / "board.json"')),

    # --------------------------------------------------------------------- examples/ (comments)
    "insitu sweep examples/sweeps/e2train_table3.toml --out-dir table3": Run(
        # Two workers, as documented: points that run at once share the baseline row's checkpoint
        # path, which the write check before training probes without creating it.
        "insitu sweep examples/sweeps/e2train_table3.toml --out-dir table3",
        (sweep_done("table3", 2), files("e2train-table3-rows/*")), needs=("examples/sweeps/e2train_table3.toml",)),
    "insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6 --ray-address HOST:6379": RAY_SWEEP,
    "insitu train --config <the point's options> --run-dir OUT/points/<key> --json": Run(
        "insitu train --config point.toml --run-dir OUT/points/lr=0.1_batch-size=16_seed=0 --json",
        (files("OUT/points/lr=0.1_batch-size=16_seed=0/result.json"),
         out_json(lambda d: (d["lr"], d["batch_size"], d["samples"]) == (0.1, 16, 64), "the point's options")),
        needs=("point.toml",)),
    "insitu sweep examples/sweeps/train_lr.toml --out-dir train-lr": Run(
        # docs/measure.md's sweep of the same file (--out-dir lr) ran every point: copied here, the
        # command finds them all done and tabulates them (the points run once, there)
        "cp -r lr train-lr && insitu sweep examples/sweeps/train_lr.toml --out-dir train-lr",
        (file_json("train-lr/sweep.json", lambda d: (d["out"], d["points"], d["skipped"], d["failed"], len(d["table"]))
                   == ("train-lr", 2, 2, [], 2), "2 points, found done"), files("train-lr/heatmap-*.png")),
        needs=("insitu sweep examples/sweeps/train_lr.toml --out-dir lr",), workspace="sweep-train-lr"),
    "insitu runs compare train-lr/points/* --json": Run(
        "insitu runs compare train-lr/points/* --json", (out_json(lambda d: len(d["runs"]) == 2, "the two points"),),
        needs=("insitu sweep examples/sweeps/train_lr.toml --out-dir train-lr",), workspace="sweep-train-lr"),
}


# ===================================================================================== running

def entry_of(command: str, kind: type[Entry]) -> Entry:
    """TABLE's entry for ``command``, of the kind whose commands the calling test is parametrized with."""
    entry = TABLE[command]
    assert isinstance(entry, kind), f"{command!r} is a {type(entry).__name__}, not a {kind.__name__}"
    return entry


class Workspace:
    """A folder the commands of one walkthrough run in, each once (later tests reuse the result)."""

    def __init__(self, path: Path, env: dict[str, str]):
        self.path, self.env = path, env
        self.done: dict[str, Result] = {}

    def bash(self, line: str, timeout: int = 600) -> Result:
        return subprocess.run(["bash", "-c", line], cwd=self.path, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def run(self, command: str) -> Result:
        if command in self.done:
            return self.done[command]
        if command in SETUP:
            step = SETUP[command]
            if callable(step):
                step(self.path)
                result: Result = subprocess.CompletedProcess(command, 0, "", "")
            else:
                result = self.bash(step)
                assert result.returncode == 0, f"setup {command!r} failed: {result.stderr[-3000:]}"
        else:
            entry = TABLE[command]
            assert isinstance(entry, Run), f"{command!r} is needed here but not run here"
            for need in entry.needs:
                before = self.run(need)
                needed = TABLE.get(need)          # a Run (self.run asserted it), or a SETUP name
                expected = needed.code if isinstance(needed, Run) else 0
                assert before.returncode == expected, \
                    f"{need!r}, run before {command!r}, failed: {before.stderr[-3000:]}"
            if callable(entry.small):
                result = entry.small(self, command)
            else:
                result = self.bash(entry.small, timeout=entry.timeout)
        self.done[command] = result
        return result


#: The workspace a command runs in (the workspaces fixture).
WorkspaceOf: TypeAlias = Callable[[str], Workspace]


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> WorkspaceOf:
    root = tmp_path_factory.mktemp("documented")
    cache = root / "cache"
    cache.mkdir()
    for name in SHARE:
        (SHARED_CACHE / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(SHARED_CACHE / name)
    env = {**os.environ, "INSITU_CACHE": str(cache), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    made: dict[str, Workspace] = {}

    def get(command: str) -> Workspace:
        entry = TABLE[command]
        shared = entry.workspace if isinstance(entry, Run) else None
        name = shared or re.sub(r"[^A-Za-z0-9]+", "-", command)[:60]
        if name not in made:
            folder = root / "ws" / f"{len(made):03d}-{name}"
            folder.mkdir(parents=True)
            made[name] = Workspace(folder, env)
        return made[name]
    return get


def _params(kind: type[TableEntry], marks: bool = False):
    """The commands of TABLE's ``kind`` entries, each with a Run's marks if ``marks`` (and the
    commands of one shared workspace in one xdist group: one worker runs them, in order)."""
    def marks_of(entry: TableEntry):
        if not (marks and isinstance(entry, Run)):
            return ()
        return (*entry.marks, *([pytest.mark.xdist_group(f"documented:{entry.workspace}")] if entry.workspace else []))
    return [pytest.param(command, marks=marks_of(entry), id=command)
            for command, entry in TABLE.items() if isinstance(entry, kind)]


@pytest.mark.parametrize("command", _params(Run, marks=True))
def test_documented_command_runs(workspaces: WorkspaceOf, command: str):
    entry = entry_of(command, Run)
    workspace = workspaces(command)
    run = workspace.run(command)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == entry.code, (entry.small if isinstance(entry.small, str) else command,
                                          run.returncode, run.stderr[-3000:])
    assert entry.check, f"{command!r}: a Run checks something of what it printed or wrote"
    for check in entry.check:
        check(run, workspace.path)


@pytest.mark.parametrize("command", _params(FailsCleanly))
def test_documented_command_without_its_hardware_fails_cleanly(workspaces: WorkspaceOf, command: str):
    entry = entry_of(command, FailsCleanly)
    run = workspaces(command).bash(entry.small or command, timeout=120)
    assert run.returncode == entry.code, (run.returncode, run.stderr[-3000:])
    assert entry.says in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


# ================================================================================== the inventory

def test_every_documented_command_has_a_test():
    missing = {command: where for command, where in documented_commands().items() if command not in TABLE}
    assert not missing, ("documented commands that no test runs (add each to TABLE in "
                         "tests/system/test_documented_commands.py):\n"
                         + "\n".join(f"  {c}\n      shown in {', '.join(w)}" for c, w in missing.items()))


def test_every_table_entry_is_still_documented():
    shown = documented_commands()
    stale = [command for command in TABLE if command not in shown]
    assert not stale, "TABLE entries that no page, --help or example shows any more (remove them):\n" + \
        "\n".join(f"  {c}" for c in stale)


def test_every_example_file_is_run():
    """Each file of examples/ is run by a Run entry (a sweep TOML: through its small copy)."""
    ran = " ".join(command for command, entry in TABLE.items() if isinstance(entry, Run))
    not_run = [path for path in example_files() if path not in ran]
    assert not not_run, f"files in examples/ that no test runs: {not_run}"
    for path in example_files():
        if path.endswith(".toml"):
            assert path in SHRINK, f"{path}: add its small settings to SHRINK"
    assert all(path in example_files() for path in SHRINK), "SHRINK names a file examples/ does not hold"


def test_failures_and_coverage_say_why():
    for command, entry in TABLE.items():
        if isinstance(entry, FailsCleanly):
            assert entry.reason and entry.code != 0 and entry.says, command
        if isinstance(entry, Run):
            for need in entry.needs:
                assert need in SETUP or isinstance(TABLE.get(need), Run), f"{command!r} needs unknown {need!r}"


def _test_source(test: str) -> tuple[str, str]:
    """(the module's source, the test function's source) of ``path::function``; fails if absent."""
    path, name = test.split("::")
    source = (ROOT / path).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            function = ast.get_source_segment(source, node)
            assert function is not None             # parsed from this very source: the node has its position
            return source, function
    raise AssertionError(f"{test}: no such test")


@pytest.mark.parametrize("command", _params(Covered))
def test_the_existing_test_runs_it(command: str):
    entry = entry_of(command, Covered)
    module, _ = _test_source(entry.test)
    if entry.reads is not None:
        assert command in entry.reads(), f"{entry.test} does not run {command!r}"
    for words in entry.shows:
        assert words in module, f"{entry.test}: its module no longer holds {words!r}"


# ================================================================================== the options

def _resolve(command: str) -> tuple[click.Command, list[str]]:
    """(the click command, the documented arguments after its name) of ``command``."""
    from insitu.cli import main

    try:
        words = shlex.split(command)
    except ValueError:                          # a synopsis: <the point's options>
        words = command.split()
    cmd: click.Command = main
    rest = words[1:]
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        cmd, rest = cmd.commands[rest[0]], rest[1:]
    return cmd, rest


def _documented_options(command: str) -> list[str]:
    before = re.split(r"\s--\s", command + " ")[0]
    return sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", before)))


@pytest.mark.parametrize("command", [pytest.param(c, id=c) for c in documented_commands()])
def test_documented_options_exist(command: str):
    """Each option a page shows is one of the command's, with a value it takes when it is a choice."""
    cmd, rest = _resolve(command)
    assert not isinstance(cmd, click.Group), f"{command!r}: no such command"
    options = {opt: p for p in cmd.params if isinstance(p, click.Option) for opt in (*p.opts, *p.secondary_opts)}
    if "--" in rest:
        rest = rest[:rest.index("--")]
    for i, word in enumerate(rest):
        word = word.strip("[]")
        if not word.startswith("--"):
            continue
        name = word.split("=")[0]
        assert name in options, f"{command!r}: {cmd.name} has no option {name}"
        param = options[name]
        if isinstance(param.type, click.Choice) and not param.is_flag and i + 1 < len(rest):
            value = rest[i + 1].strip("[]{}")
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
                continue                                        # a placeholder: --variant V
            for choice in re.split(r"[,|]", value):
                assert choice in param.type.choices, f"{command!r}: {name} takes no {choice!r}"


@pytest.mark.parametrize("command", _params(Run))
def test_small_variants_keep_the_documented_options(command: str):
    entry = entry_of(command, Run)
    if callable(entry.small):
        return                                   # the function runs the documented line itself
    missing = [opt for opt in _documented_options(command) if opt not in entry.small and opt not in entry.drops]
    assert not missing, f"the small run of {command!r} leaves out {missing}"
