"""Output that survives pipes: plain progress lines and tables that never cut a cell."""

import pytest
from rich.table import Table

from insitu.cli import output

pytestmark = pytest.mark.unit


def test_without_a_terminal_progress_is_plain_lines_with_the_live_figures(monkeypatch, capsys):
    monkeypatch.setattr(output, "PLAIN_MIN_S", 0.0)
    with output.progress("training on x", total=100) as advance:     # stderr is captured: no tty
        advance(5)                                # under PLAIN_STEP of the work: no line yet
        advance.note(loss=0.53125)
        advance(20)
        advance.note(stage="test")                # not a line of its own: shown on the next one
        advance(10)
        advance.note(stage="train")
        advance(65)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("training on x: 25/100 (25 %)") and lines[0].endswith("loss 0.5312")
    assert lines[1].startswith("training on x: 35/100 (35 %)") and ", test" in lines[1]
    assert lines[-1].startswith("training on x: 100/100 (100 %)") and len(lines) == 3


def test_plain_lines_come_every_tenth_of_the_run_and_time_it_from_the_first_sample(monkeypatch, capsys):
    clock = [1000.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    with output.progress("training on x", total=200) as advance:
        clock[0] += 900.0                         # a pre-training before the first sample
        for _ in range(40):                       # 5 % per step, with a test probe each time
            clock[0] += 3.0
            advance(5)
            advance.note(stage="test")
            advance.note(stage="train")
    lines = capsys.readouterr().err.splitlines()
    percents = [int(line.split("(")[1].split(" %")[0]) for line in lines]
    assert percents == list(range(10, 101, 10))   # every 10 %, none twice
    assert lines[-1].startswith("training on x: 200/200 (100 %), 117 s")    # 39 steps of 3 s


def test_a_piped_table_keeps_every_cell_whole(capsys):
    table = Table("name", "kind")
    long = "stm32f746-disco-sim-" * 8
    table.add_row(long, "mcu")
    output.print_table(table)
    assert long in capsys.readouterr().out
