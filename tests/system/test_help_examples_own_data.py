"""The `--help` examples of the commands that take the user's data and models (`data info`, `data
export`, `mcu import`, `mcu export`, and `train`'s on a folder of images) run, in the order a
user meets them, in one empty folder.

They are read from the installed command's help, so a renamed option fails here. Small settings:
mbv2-tiny for mbv2-28 (whose pretraining takes minutes), a few samples on the twin.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import insitu_cli

pytestmark = pytest.mark.system

COMMANDS = (("data", "export"), ("data", "info"), ("mcu", "export"), ("mcu", "import"))


def examples(*command: str) -> list[str]:
    run = insitu_cli(*command, "--help", check=True)
    block = re.search(r"Examples?:\n(.*?)\n\n", run.stdout + "\n\n", flags=re.S)
    assert block is not None, f"`insitu {' '.join(command)} --help` shows no example"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def small(line: str) -> str:
    line = line.replace("mbv2-28", "mbv2-tiny").split("#")[0].strip()
    if "--algo sparse" in line:
        return re.sub(r"--samples \d+", "--samples 6 --test-samples 20", line)
    return re.sub(r"--samples \d+", "--samples 200", line)


def test_the_help_examples_run(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    lines = [line for command in COMMANDS for line in examples(*command)]
    lines += [line for line in examples("train") if "folder:" in line]
    assert len(lines) >= 9
    for line in lines:
        run = subprocess.run(["bash", "-c", small(line)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, (small(line), run.stderr[-3000:])
