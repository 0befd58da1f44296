"""`insitu rtl generate` through the installed CLI, with the real PEs and top level."""

import importlib.util
import json
import re

import pytest

from insitu.rtl import regmap, vivado
from insitu.rtl.generate import RTL_SOURCES
from insitu.rtl.params import STREAM_BITS, TOP_MODULE

pytestmark = pytest.mark.system

_MISSING = [s.module for s in RTL_SOURCES if importlib.util.find_spec(s.module) is None]
needs_rtl = pytest.mark.skipif(bool(_MISSING), reason=f"RTL modules not written yet: {_MISSING}")


def test_rtl_help_lists_generate(run_cli):
    run = run_cli("rtl", "--help")
    assert run.returncode == 0, run.stderr
    assert "generate" in run.stdout.split("Commands:")[1]


def test_generate_into_a_file_is_a_usage_error(run_cli, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    run = run_cli("rtl", "generate", "--out", target)
    assert run.returncode == 2
    assert "is an existing file" in run.stderr and "Traceback" not in run.stderr
    assert target.read_text() == "x"


def test_generate_needs_out(run_cli):
    run = run_cli("rtl", "generate")
    assert run.returncode == 2 and "--out" in run.stderr


@needs_rtl
def test_generate_writes_the_real_design(run_cli, tmp_path):
    out = tmp_path / "rtl"
    run = run_cli("rtl", "generate", "--out", out, "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["version"] == regmap.VERSION and result["files"][-1] == "manifest.json"
    for path in result["paths"]:
        assert (out / path.rsplit("/", 1)[1]).is_file()
    top = (out / f"{TOP_MODULE}.v").read_text()
    assert vivado.check_top_ports(top) == []
    ports = vivado.verilog_ports(top, TOP_MODULE)
    assert ports["s_axis_tdata"] == ("input", STREAM_BITS)
    # Every port of the top is mapped by the packaging Tcl, and only those.
    tcl = (out / "package_ip.tcl").read_text()
    mapped = set()
    for body in re.findall(r"insitu_add_bus \$core \S+ \S+ \S+ \{([^}]*)\}", tcl):
        mapped |= set(body.split()[1::2])
    assert mapped == set(ports)
    # The PE files hold their modules.
    for source in RTL_SOURCES:
        assert re.search(rf"\bmodule {source.verilog_name}\(", (out / source.filename).read_text())
    # Plain output: one path per line.
    run = run_cli("rtl", "generate", "--out", out)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(out / name) for name in result["files"]]
