"""docs/own-data.md's walkthrough, every command of it, in order, with small settings.

The commands are read from the page's ``bash`` blocks, so the page cannot rot: a renamed option
or a changed layout fails here. Small settings replace the figures' sizes (400 of the 1,797
images, a few samples), and the built-in mbv2-tiny replaces mbv2-28, whose pretraining takes
minutes (the commands are otherwise the page's). The board command has no board here: it must
stop before any work, exit 2, naming the port.

The first twin run is on the Cortex-M7 twin, as the page says. The two after it differ from it
only in what the host compiles (the rates, the searched scheme), so they run on the unix-port twin
(`--twin unix`: the same firmware and host path, without flashing through the emulated UART,
most of a Cortex-M7 run's time).
The Cortex-M7 twin also trains from an ONNX file in tests/system/test_mcu_onnx.py and on a folder
of images in tests/system/test_cli_own_data.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cache_env

pytestmark = pytest.mark.system

DOC = Path(__file__).resolve().parents[2] / "docs" / "own-data.md"
SMALL = [(r"--evaluations \d+", "--evaluations 20"), (r"--train-size \d+", "--train-size 30"),
         (r"--test-samples \d+", "--test-samples 30"), (r"--offline-samples \d+", "--offline-samples 100"),
         (r"--segment \d+", "--segment 100"), (r"--epochs \d+", "--epochs 1"), (r"--keep \d+", "--keep 1"),
         (r"mbv2-28", "mbv2-tiny")]
TWIN = "--board stm32f746-disco-sim"


def walkthrough_commands() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## Walkthrough"):]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.startswith("insitu ")]


def small(command: str, twin: str = "qemu") -> str:
    """``command`` at small settings; a sparse update on the -sim board runs on ``twin``."""
    if command.startswith("insitu data export"):
        return command + " --samples 400"                   # and 100 test images
    sparse = "--algo sparse" in command
    # the twin's sparse update runs a sample in ~0.2 s and tests each curve point on the host;
    # LRT updates its dense layers once per 100 samples (--dense-batch), the others train in steps
    # of at most 64
    samples = 6 if sparse else 100 if command.startswith("insitu lrt adapt") else 64
    command = re.sub(r"--samples \d+", f"--samples {samples}", command)
    for pattern, replacement in SMALL:
        command = re.sub(pattern, replacement, command)
    if (sparse or "--algo tt" in command) and "--test-samples" not in command:
        command += " --test-samples 10" if sparse else " --test-samples 30"
    if TWIN in command and twin != "qemu":
        command += f" --twin {twin}"
    return command


def test_the_walkthrough_has_the_steps_the_page_describes():
    commands = walkthrough_commands()
    assert any(c.startswith("insitu mcu import") for c in commands)
    assert sum("--board stm32f746-disco-sim" in c for c in commands) == 3
    assert any("--board stm32f746-disco " in c for c in commands)


def test_every_walkthrough_command_runs(tmp_path):
    # The slow one-offs (pretraining, the twin's firmware, LRT's pre-training) are shared with the
    # other tests through insitu's cache; the data this test decodes stays in its own folder.
    env = {**os.environ, **cache_env(tmp_path / "cache", share=("mcu", "mcu-twin", "mcu-native", "lrt")),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    twins: list[str] = []
    for command in walkthrough_commands():
        twin = "unix" if twins else "qemu"
        line = small(command, twin)
        run = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
        if "--board stm32f746-disco " in command:           # no board attached here
            assert run.returncode == 2, (command, run.stderr)
            assert "/dev/ttyACM0" in run.stderr and "Traceback" not in run.stderr
            continue
        assert run.returncode == 0, (line, run.stderr[-3000:])
        if TWIN in command:
            result = json.loads(run.stdout)
            assert (result["twin"], result["samples"]) == (twin, 6), line
            assert result["host_sim_agreement"] == 1.0, line   # the device computes the host's bits
            if "scheme.json" in command:
                assert result["scheme"] == json.loads((tmp_path / "scheme.json").read_text()), line
            twins.append(twin)
    assert twins == ["qemu", "unix", "unix"]


def test_the_readme_shows_walkthrough_commands_only():
    """README's own-data example is a part of the walkthrough, so the run above covers it."""
    readme = (DOC.parents[1] / "README.md").read_text()
    block = re.search(r"\*\*Your own data and your own model\*\*.*?```bash\n(.*?)```", readme, flags=re.S)
    assert block is not None
    shown = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.startswith("insitu ")]
    assert shown and all(command in walkthrough_commands() for command in shown), shown
