"""Board files: the shipped ones, twins, and malformed files."""

import shutil

import pytest

from insitu.accel.params import AcceleratorParams
from insitu.boards import accelerator_params, fpga_boards, get_board, load_boards, pl_clock_hz
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
           ("fpga-soc", 70560, 141120, 360, 432, 200_000_000)
    assert u96["part"].startswith("xczu3eg-sbva484")
    zed = get_board("zedboard").describe()
    assert (zed["lut"], zed["ff"], zed["dsp"], zed["bram18"]) == (53200, 106400, 220, 280)
    assert zed["pl_clock_hz"] == 125_000_000
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


def test_each_fpga_board_has_its_clock_and_accelerator_parameters():
    assert set(fpga_boards()) == {"ultra96v2", "zedboard"}
    # The Ultra96-V2's design doubles PE3's batch lanes; the ZedBoard keeps the defaults.
    assert accelerator_params("ultra96v2") == AcceleratorParams(pe3_batch_lanes=2)
    assert accelerator_params("zedboard") == AcceleratorParams()
    assert get_board("ultra96v2").describe()["accelerator"] == {"pe3_batch_lanes": 2}
    assert get_board("zedboard").describe()["accelerator"] == {}
    for real in ("ultra96v2", "zedboard"):
        # A twin is its board's design at its board's clock.
        assert accelerator_params(f"{real}-sim") == accelerator_params(real)
        assert pl_clock_hz(f"{real}-sim") == pl_clock_hz(real) == get_board(real).fpga["pl_clock_hz"]
    assert (pl_clock_hz("ultra96v2"), pl_clock_hz("zedboard")) == (200_000_000, 125_000_000)
    with pytest.raises(UsageError, match="stm32f746-disco has no FPGA"):
        accelerator_params("stm32f746-disco")


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
    # [accelerator]: overrides of AcceleratorParams fields, nothing else
    (lambda s: s + "\n[accelerator]\npe3_batch_lane = 2\n", "zedboard",
     r"unknown key 'accelerator.pe3_batch_lane': not a parameter of the accelerator .*allowed: .*pe3_batch_lanes"),
    (lambda s: s.replace("pe3_batch_lanes = 2", "pe3_batch_lanes = 3"), "ultra96v2",
     r"\[accelerator\]: AcceleratorParams.pe3_batch_lanes must be 1 or 2, got 3"),
    (lambda s: s.replace("pe3_batch_lanes = 2", 'pe3_batch_lanes = "2"'), "ultra96v2",
     "key 'accelerator.pe3_batch_lanes' must be int, got str"),
    (lambda s: s.replace("pe3_batch_lanes = 2", "pe3_batch_lanes = true"), "ultra96v2",
     "key 'accelerator.pe3_batch_lanes' must be int, got bool"),
    (lambda s: s.replace("pe3_batch_lanes = 2", "c_lanes = 32"), "ultra96v2",
     "key 'accelerator.c_lanes' is fixed by the RTL"),
    (lambda s: s + "\n[accelerator]\npe3_b_max = 128\n", "stm32f746-disco",
     r"\[accelerator\] is the FPGA accelerator's parameters; a mcu board has none"),
    (lambda s: s + "\n[accelerator]\npe3_b_max = 128\n", "zedboard-sim",
     "a twin takes 'kind' and resources"),
])
def test_malformed_board_file_names_the_file_and_key(board_dir, edit, file, message):
    path = board_dir / f"{file}.toml"
    path.write_text(edit(path.read_text()))
    with pytest.raises(BoardFileError, match=message) as err:
        load_boards(board_dir)
    assert str(path) in str(err.value)


def test_accelerator_overrides_reach_the_parameters(board_dir):
    """A valid override (a negative shift bound included) is the board's parameter set."""
    path = board_dir / "zedboard.toml"
    path.write_text(path.read_text() + "\n[accelerator]\npe3_b_max = 128\nshift_min = -8\n")
    boards = load_boards(board_dir)
    assert accelerator_params(boards["zedboard"]) == AcceleratorParams(pe3_b_max=128, shift_min=-8)
    assert accelerator_params(boards["zedboard-sim"]) == accelerator_params(boards["zedboard"])
