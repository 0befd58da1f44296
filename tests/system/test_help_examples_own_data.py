"""The `--help` examples of the commands that take the user's data and models (`data info`, `data
export`, `mcu import`, `mcu export`, and `train`'s on a folder of images) run, in the order a
user meets them, in one empty folder.

They are read from the installed command's help, so a renamed option fails here. Small settings:
mbv2-tiny for mbv2-28 (whose pretraining takes minutes), a few hundred images, a few samples. The
examples another test runs as written are left to it (RUN_ELSEWHERE; TABLE in
test_documented_commands.py maps them to it too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cache_env, insitu_cli

pytestmark = pytest.mark.system

COMMANDS = (("data", "export"), ("data", "info"), ("mcu", "export"), ("mcu", "import"))

#: Examples that another test runs as written, on the same path end to end, with more checks:
#: `mcu import --help`'s (the Cortex-M7 twin trains from the exported mbv2-tiny; ~10 s a run).
RUN_ELSEWHERE = {
    "insitu mcu export --model mbv2-tiny tiny.onnx":
        "tests/system/test_mcu_onnx.py::test_mcu_import_shows_the_graph_and_its_memory_on_the_board",
    "insitu mcu import tiny.onnx --dataset digits":
        "tests/system/test_mcu_onnx.py::test_mcu_import_shows_the_graph_and_its_memory_on_the_board",
    "insitu train --board stm32f746-disco-sim --algo sparse --model tiny.onnx --samples 100":
        "tests/system/test_mcu_onnx.py::test_train_sparse_on_the_cortex_m7_twin_from_an_onnx_file",
}


def examples(*command: str) -> list[str]:
    run = insitu_cli(*command, "--help", check=True)
    block = re.search(r"Examples?:\n(.*?)\n\n", run.stdout + "\n\n", flags=re.S)
    assert block is not None, f"`insitu {' '.join(command)} --help` shows no example"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def all_examples() -> list[str]:
    """Every example line of COMMANDS' help, and `train --help`'s on a folder, in order."""
    lines = [line for command in COMMANDS for line in examples(*command)]
    return lines + [line for line in examples("train") if "folder:" in line]


def run_here(lines: list[str]) -> list[str]:
    """``lines`` without those RUN_ELSEWHERE (the test asserts that each of those is still shown)."""
    return [line for line in lines if line.split("#")[0].strip() not in RUN_ELSEWHERE]


def small(line: str) -> str:
    line = line.replace("mbv2-28", "mbv2-tiny").split("#")[0].strip()
    if line.startswith("insitu data export"):
        return line + " --samples 400"
    if "--algo sparse" in line:
        return re.sub(r"--samples \d+", "--samples 6 --test-samples 20", line)
    line = re.sub(r"--samples \d+", "--samples 64", line)
    if "--algo tt" in line and "--test-samples" not in line:
        line += " --test-samples 30"
    return line


def test_the_help_examples_run(tmp_path):
    # The images it decodes are cached in its own folder; the slow one-offs (pretrained models,
    # the twins' overlays) are shared with the other tests.
    env = {**os.environ, **cache_env(tmp_path / "cache", share=("mcu", "mcu-twin", "mcu-native", "lrt", "sim", "overlays")),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    (tmp_path / "work").mkdir()
    lines = all_examples()
    assert len(lines) >= 9
    shown = {line.split("#")[0].strip() for line in lines}
    assert not set(RUN_ELSEWHERE) - shown, f"RUN_ELSEWHERE names examples no help shows: {set(RUN_ELSEWHERE) - shown}"
    for line in run_here(lines):
        run = subprocess.run(["bash", "-c", small(line)], cwd=tmp_path / "work", env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, (small(line), run.stderr[-3000:])
