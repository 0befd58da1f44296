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
        advance.note(stage="test")
        advance.note(stage="train")
        advance(75)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("training on x: 25/100 (25 %)") and lines[0].endswith("loss 0.5312")
    assert "test" in lines[1] and lines[-1].startswith("training on x: 100/100 (100 %)")


def test_a_piped_table_keeps_every_cell_whole(capsys):
    table = Table("name", "kind")
    long = "stm32f746-disco-sim-" * 8
    table.add_row(long, "mcu")
    output.print_table(table)
    assert long in capsys.readouterr().out
