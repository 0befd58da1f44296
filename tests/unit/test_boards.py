"""Board files: the shipped ones, twins, and malformed files."""

import shutil

import pytest

from insitu.boards import get_board, load_boards
from insitu.errors import BoardFileError, UsageError
from insitu.resources import package_dir

pytestmark = pytest.mark.unit


def test_shipped_boards_and_their_twins():
    boards = load_boards()
    assert {"ultra96v2", "zedboard", "stm32f746-disco"} <= set(boards)
    for real in ("ultra96v2", "zedboard", "stm32f746-disco"):
        twin = boards[f"{real}-sim"]
        assert twin.twin_of == real and twin.is_twin and not boards[real].is_twin
        # A twin has exactly its board's resources (read from the board's file, not copied).
        assert {k: v for k, v in twin.describe().items() if k not in ("name", "twin_of", "description")} == \
               {k: v for k, v in boards[real].describe().items() if k not in ("name", "twin_of", "description")}


def test_resources_of_the_issue():
    u96 = get_board("ultra96v2").describe()
    assert (u96["kind"], u96["lut"], u96["ff"], u96["dsp"], u96["bram18"], u96["pl_clock_hz"]) == \
           ("fpga-soc", 70560, 141120, 360, 432, 100_000_000)
    assert u96["part"].startswith("xczu3eg-sbva484")
    zed = get_board("zedboard").describe()
    assert (zed["lut"], zed["ff"], zed["dsp"], zed["bram18"]) == (53200, 106400, 220, 280)
    assert zed["part"].startswith("xc7z020-clg484")
    mcu = get_board("stm32f746-disco").describe()
    assert (mcu["kind"], mcu["cpu_hz"], mcu["sram_bytes"], mcu["flash_bytes"], mcu["training_budget_bytes"]) == \
           ("mcu", 216_000_000, 320 * 1024, 1024 * 1024, 256 * 1024)


def test_unknown_board_lists_the_known_ones():
    with pytest.raises(UsageError, match="known boards: .*ultra96v2") as err:
        get_board("ultra69")
    assert err.value.exit_code == 2


@pytest.fixture
def board_dir(tmp_path):
    for f in package_dir("boards").glob("*.toml"):
        shutil.copy(f, tmp_path)
    return tmp_path


@pytest.mark.parametrize("edit,file,message", [
    (lambda s: s.replace("dsp = 360", 'dsp = "many"'), "ultra96v2", "key 'fpga.dsp' must be int"),
    (lambda s: s.replace("dsp = 360\n", ""), "ultra96v2", "missing key 'fpga.dsp'"),
    (lambda s: s.replace("dsp = 360", "dsp = 360\ndsps = 1"), "ultra96v2", "unknown key 'fpga.dsps'"),
    (lambda s: s.replace("lut = 70560", "lut = -1"), "ultra96v2", "'fpga.lut' must be positive"),
    (lambda s: s.replace('kind = "fpga-soc"', 'kind = "gpu"'), "ultra96v2", "key 'kind' must be one of"),
    (lambda s: s.replace("[fpga]", "[fpga"), "ultra96v2", "not valid TOML"),
    (lambda s: s.replace("[processor]", "[cpu]"), "zedboard", "unknown section '\\[cpu\\]'"),
    (lambda s: s.replace('twin_of = "ultra96v2"', 'twin_of = "ultra97"'), "ultra96v2-sim", "key 'twin_of'"),
    (lambda s: s + "\n[fpga]\nlut = 1\n", "zedboard-sim", "key 'fpga.part'"),
    (lambda s: 'kind = "fpga-soc"\n' + s, "zedboard-sim", "a twin takes 'kind' and resources"),
    (lambda s: s.replace('name = "zedboard"', 'name = "zed"'), "zedboard", "key 'name' is 'zed'"),
])
def test_malformed_board_file_names_the_file_and_key(board_dir, edit, file, message):
    path = board_dir / f"{file}.toml"
    path.write_text(edit(path.read_text()))
    with pytest.raises(BoardFileError, match=message) as err:
        load_boards(board_dir)
    assert str(path) in str(err.value)
